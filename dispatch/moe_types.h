// The dispatcher's vocabulary for MoE batched GEMMs: operand formats, activations and
// operations, with the exact names the manifest uses (docs/kernels.md).
//
// Parsing is strict: an unknown name is InvalidArgument listing the accepted ones.
// Everything here is a pure function of its arguments and thread-safe.
#ifndef CUBIST_DISPATCH_MOE_TYPES_H_
#define CUBIST_DISPATCH_MOE_TYPES_H_

#include <cstdint>
#include <ostream>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/moe_gemm_abi.h"

namespace cubist {

// Operations the dispatcher knows. A manifest kernel with any other `op` is kept in
// the registry (listed, explainable) but never selected, so the list stays open: a new
// op is a name here plus, when it should run, a launcher.
//   moe_gemm    cubist's own MoE batched GEMM family (kernels/), selected and launched
//   trtllm_bmm  FlashInfer's trtllm-gen batched GEMMs (manifest/flashinfer_import.h):
//               selected (cubist select), not launched: they need Blackwell and
//               trtllm-gen's KernelParams, which no launcher here fills yet
//   moe_route, moe_sort, moe_gather, moe_finalize, moe_quantize
//               the routed MoE layer's own kernels around its two GEMMs
//               (kernels/moe_layer_abi.h), launched by MoeLayer (dispatch/moe_layer.h)
enum class Op : uint8_t { kMoeGemm, kTrtllmBmm, kMoeRoute, kMoeSort, kMoeGather, kMoeFinalize,
                          kMoeQuantize };

// Formats and activations are the kernels' own vocabulary (kernels/moe_gemm_abi.h:
// moe::MoeFormat, moe::MoeActivation), which also names the formats and activations
// that only imported trtllm-gen sets use (fp16, mxint4; gelu, silu). The aliases keep
// the dispatcher's spelling (DataFormat::kBf16, Activation::kSwiglu).
using DataFormat = moe::MoeFormat;
using Activation = moe::MoeActivation;
using moe::ActivationName;  // "swiglu"
using moe::IsGated;

[[nodiscard]] absl::StatusOr<Op> ParseOp(std::string_view name);
[[nodiscard]] absl::StatusOr<DataFormat> ParseDataFormat(std::string_view name);
[[nodiscard]] absl::StatusOr<Activation> ParseActivation(std::string_view name);

// The manifest names ("moe_gemm", "fp8-block"; ActivationName above).
std::string_view OpName(Op op);
std::string_view DataFormatName(DataFormat format);

// "bf16, fp8, fp8-block, mxfp4, mxfp8, nvfp4" and "identity, relu2, swiglu, geglu, situ".
std::string_view AllDataFormatNames();
std::string_view AllActivationNames();

// Whether kernels of `op` may take this format / apply this activation: moe_gemm only
// those its parameter ABI encodes; other ops everything in the vocabulary.
bool OpSupports(Op op, DataFormat format);
bool OpSupports(Op op, Activation activation);

// Bits one element occupies in memory, scales included (mxfp4: 4 + 8/32 = 4.25).
double BitsPerElement(DataFormat format);

std::ostream& operator<<(std::ostream& os, Op op);

namespace moe {
// Names, not numbers, in test failures and logs (found by argument-dependent lookup).
std::ostream& operator<<(std::ostream& os, MoeFormat format);
std::ostream& operator<<(std::ostream& os, MoeActivation activation);
}  // namespace moe

}  // namespace cubist

#endif  // CUBIST_DISPATCH_MOE_TYPES_H_
