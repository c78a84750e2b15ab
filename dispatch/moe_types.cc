#include "dispatch/moe_types.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/strings.h"

namespace cubist {
namespace {

struct FormatInfo {
  DataFormat format;
  std::string_view name;
  int scale_block_k;
  double bits;
  bool moe_gemm;  // the moe_gemm kernels (kernels/moe_gemm_abi.h) have an encoding for it
};

// fp8-block: one fp32 scale per 128 elements of A (1x128); B's 128x128 blocks cost
// less, but the A figure is the one that matters for a bound on bytes moved.
constexpr FormatInfo kFormats[] = {
    {DataFormat::kBf16, "bf16", 1, 16.0, true},
    {DataFormat::kFp8, "fp8", 1, 8.0, true},
    {DataFormat::kFp8Block, "fp8-block", 128, 8.0 + 32.0 / 128, true},
    {DataFormat::kMxfp4, "mxfp4", 32, 4.0 + 8.0 / 32, true},
    {DataFormat::kMxfp8, "mxfp8", 32, 8.0 + 8.0 / 32, true},
    {DataFormat::kNvfp4, "nvfp4", 16, 4.0 + 8.0 / 16, true},
    {DataFormat::kFp16, "fp16", 1, 16.0, false},
    {DataFormat::kMxint4, "mxint4", 32, 4.0 + 8.0 / 32, false},
};

struct ActivationInfo {
  Activation activation;
  std::string_view name;
  bool gated;
  bool moe_gemm;
};

constexpr ActivationInfo kActivations[] = {
    {Activation::kIdentity, "identity", false, true}, {Activation::kRelu2, "relu2", false, true},
    {Activation::kSwiglu, "swiglu", true, true},      {Activation::kGeglu, "geglu", true, true},
    {Activation::kSitu, "situ", true, true},          {Activation::kGelu, "gelu", false, false},
    {Activation::kSilu, "silu", false, false},
};

}  // namespace

absl::StatusOr<Op> ParseOp(std::string_view name) {
  if (name == "moe_gemm") return Op::kMoeGemm;
  if (name == "trtllm_bmm") return Op::kTrtllmBmm;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown op '", Sv(name), "'; expected moe_gemm or trtllm_bmm"));
}

absl::StatusOr<DataFormat> ParseDataFormat(std::string_view name) {
  for (const FormatInfo& f : kFormats) {
    if (f.name == name) return f.format;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown format '", Sv(name), "'; expected one of ", Sv(AllDataFormatNames())));
}

absl::StatusOr<Activation> ParseActivation(std::string_view name) {
  for (const ActivationInfo& a : kActivations) {
    if (a.name == name) return a.activation;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown activation '", Sv(name),
                                                 "'; expected one of ",
                                                 Sv(AllActivationNames())));
}

std::string_view OpName(Op op) {
  switch (op) {
    case Op::kMoeGemm: return "moe_gemm";
    case Op::kTrtllmBmm: return "trtllm_bmm";
  }
  return "?";
}

std::string_view DataFormatName(DataFormat format) {
  for (const FormatInfo& f : kFormats) {
    if (f.format == format) return f.name;
  }
  return "?";
}

std::string_view ActivationName(Activation activation) {
  for (const ActivationInfo& a : kActivations) {
    if (a.activation == activation) return a.name;
  }
  return "?";
}

std::string_view AllDataFormatNames() {
  return "bf16, fp8, fp8-block, mxfp4, mxfp8, nvfp4, fp16, mxint4";
}
std::string_view AllActivationNames() {
  return "identity, relu2, swiglu, geglu, situ, gelu, silu";
}

bool OpSupports(Op op, DataFormat format) {
  if (op != Op::kMoeGemm) return true;
  for (const FormatInfo& f : kFormats) {
    if (f.format == format) return f.moe_gemm;
  }
  return false;
}

bool OpSupports(Op op, Activation activation) {
  if (op != Op::kMoeGemm) return true;
  for (const ActivationInfo& a : kActivations) {
    if (a.activation == activation) return a.moe_gemm;
  }
  return false;
}

bool IsGated(Activation activation) {
  for (const ActivationInfo& a : kActivations) {
    if (a.activation == activation) return a.gated;
  }
  return false;
}

int ScaleBlockK(DataFormat format) {
  for (const FormatInfo& f : kFormats) {
    if (f.format == format) return f.scale_block_k;
  }
  return 1;
}

double BitsPerElement(DataFormat format) {
  for (const FormatInfo& f : kFormats) {
    if (f.format == format) return f.bits;
  }
  return 16.0;
}

bool UsesFp8MathPath(DataFormat weight_format, DataFormat activation_format) {
  auto fp8 = [](DataFormat f) {
    return f == DataFormat::kFp8 || f == DataFormat::kFp8Block;
  };
  return fp8(weight_format) && fp8(activation_format);
}

std::ostream& operator<<(std::ostream& os, Op op) { return os << OpName(op); }
std::ostream& operator<<(std::ostream& os, DataFormat format) {
  return os << DataFormatName(format);
}
std::ostream& operator<<(std::ostream& os, Activation activation) {
  return os << ActivationName(activation);
}

}  // namespace cubist
