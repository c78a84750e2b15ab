// Host-side check of a moe_gemm launch against the requirements of the kernel that will
// run it (kernels/moe_gemm_abi.h): call it before every launch that is not already known
// to be valid (the dispatcher's CanImplement). A kernel given a shape it does not support
// would read out of bounds or silently drop the tail of K; this check turns that into a
// clear error instead. Header-only, host-only, no CUDA headers and no absl, so that any
// host code can use it; the caller wraps a non-empty result in InvalidArgument.
#ifndef CUBIST_KERNELS_MOE_GEMM_CHECK_H_
#define CUBIST_KERNELS_MOE_GEMM_CHECK_H_

#include <stdint.h>

#include <string>

#include "kernels/moe_gemm_abi.h"

namespace cubist::moe {

// What a kernel is (from its manifest entry).
struct MoeGemmKernelDesc {
  MoeFormat weight_format = kBf16;
  MoeFormat activation_format = kBf16;
  MoeActivation activation = kIdentity;
  int32_t tile_m = 0;
  int32_t tile_n = 0;
  int32_t abi = kMoeGemmAbi;  // the version of the kernel's parameter struct
  // What it writes: kBf16, or kFp8 for entries saying "output_format": "fp8" (version 4,
  // reads out_scale).
  MoeFormat output_format = kBf16;
  // Entries saying "a_gather": true (version 5): A's rows come through a_row_map.
  bool a_gather = false;
};

// Returns "" when `p` can be launched on the kernel `k`, otherwise
// "moe_gemm: <what is wrong>; <how to fix it>", e.g.
//   "moe_gemm: K = 100 is not a multiple of 32 (mxfp4 x bf16 kernels read whole
//    16-byte chunks and 32-element scale blocks); pad K with zeros to a multiple of 32"
// Checks: ABI version, E >= 1, T >= 0, K >= 1 and its alignment, N (even and out columns
// a multiple of 8, of 16 for fp8 output), required pointers present (operands, offsets,
// out, block scales of block-scaled formats), 16-byte alignment of a, b and out, 4-byte
// alignment of fp32 scale arrays, out_scale given exactly when the kernel writes fp8,
// a_row_map given exactly when the kernel gathers A (with a divisor and A's rows), and a
// grid that fits in one launch. It cannot check device memory:
// offsets must be non-decreasing from 0 with offsets[E] <= T (the kernel clamps rows to
// [0, T], so a wrong offsets array gives wrong results but never an out-of-bounds access).
inline std::string MoeGemmCheck(const MoeGemmParams& p, const MoeGemmKernelDesc& k);

// The steps of MoeGemmCheck, in the order it runs them; not part of the contract.
namespace moe_gemm_check_internal {

inline std::string Str(int64_t v) { return std::to_string(v); }

inline bool Misaligned(const void* ptr, uintptr_t a) {
  return (reinterpret_cast<uintptr_t>(ptr) & (a - 1)) != 0;
}

// "mxfp4 x bf16": the kernel's weight x activation formats.
inline std::string PairName(const MoeGemmKernelDesc& k) {
  return std::string(FormatName(k.weight_format)) + " x " + FormatName(k.activation_format);
}

// The parameter struct's version and the kernel's, against what this build fills.
inline std::string CheckVersions(const MoeGemmParams& p, const MoeGemmKernelDesc& k) {
  // Callers fill the newest version's fields; the launcher sets the kernel's version.
  if (p.abi != kMoeGemmAbi) {
    return "moe_gemm: parameter struct has abi " + Str(p.abi) + ", this build fills " +
           Str(kMoeGemmAbi) + "; initialise it with MoeGemmParamsInit()";
  }
  if (k.abi == kMoeGemmAbiRetiredV1) {
    return std::string("moe_gemm: the kernel's ") + kMoeGemmAbiRetiredFix;
  }
  if (k.abi < kMoeGemmAbiOldest || k.abi > kMoeGemmAbi) {
    return "moe_gemm: the kernel takes parameter struct version " + Str(k.abi) +
           ", this build fills versions " + Str(kMoeGemmAbiOldest) + " to " +
           Str(kMoeGemmAbi) + "; use a newer cubist";
  }
  return "";
}

// E, T, K and N, and the alignment of K and of the output's width.
inline std::string CheckShape(const MoeGemmParams& p, const MoeGemmKernelDesc& k) {
  if (p.num_experts < 1) {
    return "moe_gemm: E = " + Str(p.num_experts) + "; need at least one expert";
  }
  if (p.num_tokens < 0) return "moe_gemm: T = " + Str(p.num_tokens) + " is negative";
  const int32_t ka = MoeGemmKAlign(k.weight_format, k.activation_format);
  if (p.k < 1 || p.k % ka != 0) {
    return "moe_gemm: K = " + Str(p.k) + " is not a positive multiple of " + Str(ka) + " (" +
           PairName(k) + " kernels read whole 16-byte chunks and scale blocks); pad K with "
           "zeros to a multiple of " + Str(ka);
  }
  const bool gated = IsGated(k.activation);
  if (p.n < 1 || (gated && p.n % 2 != 0)) {
    return "moe_gemm: N = " + Str(p.n) +
           (gated ? " must be positive and even for the gated activation " +
                        std::string(ActivationName(k.activation))
                  : std::string(" must be positive"));
  }
  const int32_t out_cols = MoeGemmOutCols(p.n, k.activation);
  const int32_t out_align = MoeGemmOutColsAlign(k.output_format);
  if (out_cols % out_align != 0) {
    return "moe_gemm: output width " + Str(out_cols) + (gated ? " (N/2)" : " (N)") +
           " is not a multiple of " + Str(out_align) +
           (k.output_format == kFp8 ? " (fp8-output kernels store 16-byte pieces of e4m3)"
                                    : "") +
           "; pad N (each half, when gated) to a multiple of " + Str(out_align);
  }
  return "";
}

// The pointers the formats need, their alignment, and a bias only for kernels that take one.
inline std::string CheckPointers(const MoeGemmParams& p, const MoeGemmKernelDesc& k) {
  if (p.a == nullptr || p.b == nullptr || p.offsets == nullptr || p.out == nullptr) {
    return "moe_gemm: a, b, offsets and out are required (one is null)";
  }
  if (Misaligned(p.a, 16) || Misaligned(p.b, 16) || Misaligned(p.out, 16)) {
    return "moe_gemm: a, b and out must be 16-byte aligned (cudaMalloc/cuMemAlloc "
           "allocations are); a sub-tensor view must start on a 16-byte boundary";
  }
  const bool a_blocks = FormatScaleBlock(k.activation_format) != 0;
  const bool b_blocks = FormatScaleBlock(k.weight_format) != 0;
  if ((a_blocks && p.a_scale == nullptr) || (b_blocks && p.b_scale == nullptr)) {
    return "moe_gemm: " + PairName(k) + " needs block scales (" +
           std::string(a_blocks && p.a_scale == nullptr ? "a_scale" : "b_scale") +
           " is null)";
  }
  if ((k.activation_format == kFp8Block && Misaligned(p.a_scale, 4)) ||
      (k.weight_format == kFp8Block && Misaligned(p.b_scale, 4)) ||
      Misaligned(p.a_global_scale, 4) || Misaligned(p.b_global_scale, 4) ||
      Misaligned(p.alpha, 4) || Misaligned(p.beta, 4) || Misaligned(p.limit, 4) ||
      Misaligned(p.bias, 4)) {
    return "moe_gemm: fp32 arrays (scales, alpha, beta, limit, bias) must be 4-byte aligned";
  }
  if ((p.a_global_scale != nullptr || p.b_global_scale != nullptr) &&
      !MoeGemmReadsGlobalScales(k.weight_format)) {
    return "moe_gemm: " +
           std::string(p.a_global_scale != nullptr ? "a_global_scale" : "b_global_scale") +
           " is set, but " + PairName(k) + " kernels read global scales only with fp8 or "
           "nvfp4 weights and would ignore it; leave it null (fold a per-tensor factor into "
           "the block scales or the output)";
  }
  if (Misaligned(p.out_scale, 4)) {
    return "moe_gemm: out_scale must be 4-byte aligned (one fp32); pass the address of an "
           "fp32 [1] array";
  }
  if (p.bias != nullptr && k.abi < kMoeGemmAbiV3) {
    return "moe_gemm: the kernel takes parameter struct version " + Str(k.abi) +
           ", which has no bias; a bias needs a version-3 kernel (scripts/build-artifacts "
           "builds them)";
  }
  return "";
}

// The output format: out_scale given exactly when the kernel writes fp8 (it needs the
// scale; a bf16 kernel would ignore it, so a caller passing one expects fp8 bytes it would
// not get), and an fp8-output kernel of a version that has the field.
inline std::string CheckOutput(const MoeGemmParams& p, const MoeGemmKernelDesc& k) {
  if (k.output_format != kBf16 && k.output_format != kFp8) {
    return std::string("moe_gemm: the kernel writes ") + FormatName(k.output_format) +
           "; moe_gemm kernels write bf16 or fp8";
  }
  if (k.output_format == kFp8 && k.abi < kMoeGemmAbiV4) {
    return "moe_gemm: the kernel writes fp8 but takes parameter struct version " + Str(k.abi) +
           ", which has no out_scale; rebuild it (scripts/build-artifacts builds fp8-output "
           "kernels as version 4)";
  }
  if (k.output_format == kFp8 && p.out_scale == nullptr) {
    return "moe_gemm: out_scale is null, but the kernel writes fp8 (output_format fp8); pass "
           "the output's fp32 [1] dequantization scale in out_scale";
  }
  if (k.output_format == kBf16 && p.out_scale != nullptr) {
    return "moe_gemm: out_scale is set, but the kernel writes bf16 and never reads it; leave "
           "out_scale null, or use a kernel whose output_format is fp8";
  }
  return "";
}

// The gather of A: a map exactly for the kernels that read one (a kernel reading A in
// order would ignore it and compute on the wrong rows; a gathering kernel needs it), of a
// version that has the fields, with a divisor and A's row count in range.
inline std::string CheckGather(const MoeGemmParams& p, const MoeGemmKernelDesc& k) {
  if (!k.a_gather) {
    if (p.a_row_map != nullptr) {
      return "moe_gemm: a_row_map is set, but the kernel reads A's rows in order and would "
             "ignore it; leave a_row_map null (and pass the gathered rows), or use a kernel "
             "whose entry says a_gather";
    }
    return "";
  }
  if (k.abi < kMoeGemmAbiV5) {
    return "moe_gemm: the kernel gathers A but takes parameter struct version " + Str(k.abi) +
           ", which has no a_row_map; rebuild it (scripts/build-artifacts builds gathering "
           "kernels as version 5)";
  }
  if (p.a_row_map == nullptr) {
    return "moe_gemm: a_row_map is null, but the kernel gathers A's rows through it (entry "
           "a_gather); pass the int32 [T] row map, or use a kernel that reads A in order";
  }
  if (Misaligned(p.a_row_map, 4)) {
    return "moe_gemm: a_row_map must be 4-byte aligned (an int32 array)";
  }
  if (p.a_row_divisor < 1 || p.a_rows < 1) {
    return "moe_gemm: a_row_divisor = " + Str(p.a_row_divisor) + " and a_rows = " +
           Str(p.a_rows) + " must both be at least 1 with a_row_map (row r reads A's row "
           "a_row_map[r] / a_row_divisor of a_rows)";
  }
  return "";
}

// The kernel's tile, what a TMA kernel can address, and a grid that fits one launch.
inline std::string CheckLaunchLimits(const MoeGemmParams& p, const MoeGemmKernelDesc& k) {
  if (k.tile_m <= 0 || k.tile_n <= 0) return "moe_gemm: kernel description has no tile";
  if (p.num_experts > kMoeGemmTmaMaxExperts) {
    return "moe_gemm: E = " + Str(p.num_experts) + " exceeds the " +
           Str(kMoeGemmTmaMaxExperts) + " experts one launch schedules; launch groups of "
           "at most that many experts (MoeGemm does: MoeGemmExpertGroup)";
  }
  if (static_cast<int64_t>(p.num_experts) * p.n > 0x7FFFFFFF) {
    return "moe_gemm: E x N = " + Str(static_cast<int64_t>(p.num_experts) * p.n) +
           " weight rows exceed a TMA coordinate (2^31 - 1); split the experts";
  }
  const int64_t blocks = MoeGemmMaxMTiles(p.num_tokens, p.num_experts, k.tile_m) *
                         MoeGemmNTiles(p.n, k.activation, k.tile_n);
  if (blocks > 0x7FFFFFFF) {
    return "moe_gemm: " + Str(blocks) + " CTAs exceed one launch; split the tokens";
  }
  return "";
}

}  // namespace moe_gemm_check_internal

inline std::string MoeGemmCheck(const MoeGemmParams& p, const MoeGemmKernelDesc& k) {
  namespace internal = moe_gemm_check_internal;
  std::string error = internal::CheckVersions(p, k);
  if (error.empty()) error = internal::CheckShape(p, k);
  if (error.empty()) error = internal::CheckPointers(p, k);
  if (error.empty()) error = internal::CheckOutput(p, k);
  if (error.empty()) error = internal::CheckGather(p, k);
  if (error.empty()) error = internal::CheckLaunchLimits(p, k);
  return error;
}

}  // namespace cubist::moe

#endif  // CUBIST_KERNELS_MOE_GEMM_CHECK_H_
