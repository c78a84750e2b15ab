// The dispatcher's vocabulary for MoE batched GEMMs: operand formats, activations and
// operations, with the exact names the manifest uses (docs: moe-math.md).
//
// Parsing is strict: an unknown name is InvalidArgument listing the accepted ones.
// Everything here is a pure function of its arguments and thread-safe.
#ifndef CUBIST_DISPATCH_MOE_TYPES_H_
#define CUBIST_DISPATCH_MOE_TYPES_H_

#include <cstdint>
#include <ostream>
#include <string_view>

#include "absl/status/statusor.h"

namespace cubist {

// Operations the dispatcher knows. A manifest kernel with any other `op` is kept in
// the registry (listed, explainable) but never selected, so the list stays open: a new
// op is a name here plus, when it should run, a launcher.
//   moe_gemm    cubist's own MoE batched GEMM family (kernels/), selected and launched
//   trtllm_bmm  FlashInfer's trtllm-gen batched GEMMs (manifest/flashinfer_import.h):
//               selected (cubist select), not launched: they need Blackwell and
//               trtllm-gen's KernelParams, which no launcher here fills yet
enum class Op : uint8_t { kMoeGemm, kTrtllmBmm };

// Element formats of the weight (B) and activation (A) operands.
enum class DataFormat : uint8_t {
  kBf16,      // "bf16"
  kFp8,       // "fp8": e4m3 with one fp32 scale per tensor (per expert for B)
  kFp8Block,  // "fp8-block": e4m3, DeepSeek 1x128 (A) / 128x128 (B) fp32 scales
  kMxfp4,     // "mxfp4": e2m1, 32-element ue8m0 blocks along K
  kMxfp8,     // "mxfp8": e4m3, 32-element ue8m0 blocks along K
  kNvfp4,     // "nvfp4": e2m1, 16-element e4m3 blocks along K, fp32 global scale
  // Only in imported trtllm-gen sets (OpSupports: not moe_gemm):
  kFp16,      // "fp16"
  kMxint4,    // "mxint4": int4, 32-element ue8m0 blocks along K
};

// Epilogue activations. Gated ones (swiglu, geglu, situ) read the two halves of N
// and write N/2 columns.
// gelu and silu (element-wise) occur only in imported trtllm-gen sets.
enum class Activation : uint8_t { kIdentity, kRelu2, kSwiglu, kGeglu, kSitu, kGelu, kSilu };

[[nodiscard]] absl::StatusOr<Op> ParseOp(std::string_view name);
[[nodiscard]] absl::StatusOr<DataFormat> ParseDataFormat(std::string_view name);
[[nodiscard]] absl::StatusOr<Activation> ParseActivation(std::string_view name);

// The manifest names ("moe_gemm", "fp8-block", "swiglu").
std::string_view OpName(Op op);
std::string_view DataFormatName(DataFormat format);
std::string_view ActivationName(Activation activation);

// "bf16, fp8, fp8-block, mxfp4, mxfp8, nvfp4" and "identity, relu2, swiglu, geglu, situ".
std::string_view AllDataFormatNames();
std::string_view AllActivationNames();

bool IsGated(Activation activation);

// Whether kernels of `op` may take this format / apply this activation: moe_gemm only
// those its parameter ABI encodes; other ops everything in the vocabulary.
bool OpSupports(Op op, DataFormat format);
bool OpSupports(Op op, Activation activation);

// The granularity along K that a format's scales impose: K must be a multiple of it
// (1 for formats without block scales).
int ScaleBlockK(DataFormat format);

// Bits one element occupies in memory, scales included (mxfp4: 4 + 8/32 = 4.25).
double BitsPerElement(DataFormat format);

// True for formats the sm_90 kernels feed to the fp8 matrix path (e4m3 operands);
// the others run on the bf16 path (FP4 is decoded to bf16 in registers).
bool UsesFp8MathPath(DataFormat weight_format, DataFormat activation_format);

std::ostream& operator<<(std::ostream& os, Op op);
std::ostream& operator<<(std::ostream& os, DataFormat format);
std::ostream& operator<<(std::ostream& os, Activation activation);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_MOE_TYPES_H_
