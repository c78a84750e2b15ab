#include "dispatch/moe_types.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/strings.h"
#include "kernels/moe_layer_abi.h"

namespace cubist {
namespace {

// The order in which names are listed ("expected one of ..."): the moe_gemm ABI's
// formats and activations first, then the names-only ones.
constexpr DataFormat kFormats[] = {
    DataFormat::kBf16,  DataFormat::kFp8,   DataFormat::kFp8Block, DataFormat::kMxfp4,
    DataFormat::kMxfp8, DataFormat::kNvfp4, DataFormat::kFp16,     DataFormat::kMxint4,
};
constexpr Activation kActivations[] = {
    Activation::kIdentity, Activation::kRelu2, Activation::kSwiglu, Activation::kGeglu,
    Activation::kSitu,     Activation::kGelu,  Activation::kSilu,
};

}  // namespace

absl::StatusOr<Op> ParseOp(std::string_view name) {
  if (name == "moe_gemm") return Op::kMoeGemm;
  if (name == "trtllm_bmm") return Op::kTrtllmBmm;
  if (name == moe::kMoeRouteOp) return Op::kMoeRoute;
  if (name == moe::kMoeSortOp) return Op::kMoeSort;
  if (name == moe::kMoeGatherOp) return Op::kMoeGather;
  if (name == moe::kMoeFinalizeOp) return Op::kMoeFinalize;
  if (name == moe::kMoeQuantizeOp) return Op::kMoeQuantize;
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown op '", Sv(name),
      "'; expected moe_gemm, trtllm_bmm, moe_route, moe_sort, moe_gather, moe_finalize or moe_quantize"));
}

absl::StatusOr<DataFormat> ParseDataFormat(std::string_view name) {
  for (DataFormat f : kFormats) {
    if (DataFormatName(f) == name) return f;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown format '", Sv(name), "'; expected one of ", Sv(AllDataFormatNames())));
}

absl::StatusOr<Activation> ParseActivation(std::string_view name) {
  for (Activation a : kActivations) {
    if (ActivationName(a) == name) return a;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown activation '", Sv(name),
                                                 "'; expected one of ",
                                                 Sv(AllActivationNames())));
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kMoeGemm: return "moe_gemm";
    case Op::kTrtllmBmm: return "trtllm_bmm";
    case Op::kMoeRoute: return moe::kMoeRouteOp;
    case Op::kMoeSort: return moe::kMoeSortOp;
    case Op::kMoeGather: return moe::kMoeGatherOp;
    case Op::kMoeFinalize: return moe::kMoeFinalizeOp;
    case Op::kMoeQuantize: return moe::kMoeQuantizeOp;
  }
  return "?";
}

std::string_view DataFormatName(DataFormat format) { return moe::FormatName(format); }

std::string_view AllDataFormatNames() {
  return "bf16, fp8, fp8-block, mxfp4, mxfp8, nvfp4, fp16, mxint4";
}
std::string_view AllActivationNames() {
  return "identity, relu2, swiglu, geglu, situ, gelu, silu";
}

bool OpSupports(Op op, DataFormat format) {
  return op != Op::kMoeGemm || moe::MoeGemmEncodes(format);
}

bool OpSupports(Op op, Activation activation) {
  return op != Op::kMoeGemm || moe::MoeGemmEncodes(activation);
}

// fp8-block: one fp32 scale per 128 elements of A (1x128); B's 128x128 blocks cost
// less, but the A figure is the one that matters for a bound on bytes moved.
double BitsPerElement(DataFormat format) {
  const int block = moe::FormatScaleBlock(format);
  return moe::FormatBits(format) +
         (block == 0 ? 0.0 : 8.0 * moe::FormatScaleBytes(format) / block);
}

std::ostream& operator<<(std::ostream& os, Op op) { return os << OpName(op); }

namespace moe {
std::ostream& operator<<(std::ostream& os, MoeFormat format) {
  return os << FormatName(format);
}
std::ostream& operator<<(std::ostream& os, MoeActivation activation) {
  return os << ActivationName(activation);
}
}  // namespace moe

}  // namespace cubist
