// Shared-memory layout and launch shape of one moe_gemm kernel configuration (weight
// format, activation format, tile_m x tile_n x tile_k, pipeline stages). The kernel
// (kernels/moe_gemm.cu) carves its dynamic shared memory with these numbers and the
// publisher (scripts/build-artifacts, through kernels/moe_gemm_meta.cc) writes
// threads and shared_mem_bytes into the manifest from the same functions, so the two
// cannot disagree. Plain constexpr C++, no CUDA headers.
//
// Main loops (docs/kernels.md):
//  - fp8 path (fp8 x fp8, fp8-block x fp8-block): both operands e4m3, copied by
//    cp.async into 128-byte-swizzled shared-memory panels, wgmma ...k32.e4m3.e4m3.
//  - bf16 path (everything else): wgmma ...k16.bf16.bf16. A bf16 operand is copied
//    straight into swizzled panels ("direct"); an mxfp4/mxfp8/nvfp4 operand is staged
//    raw (packed elements plus its block-scale bytes) and each k-tile is decoded in
//    registers into a bf16 panel buffer ("decoded", double-buffered).
// A panel is [rows x 128 bytes] with 16-byte chunk j of row r at chunk j ^ (r % 8) (the
// wgmma/TMA 128-byte swizzle); a k-tile row of 256 bytes is two panels.
#ifndef CUBIST_KERNELS_MOE_GEMM_LAYOUT_H_
#define CUBIST_KERNELS_MOE_GEMM_LAYOUT_H_

#include "kernels/moe_gemm_abi.h"

namespace cubist::moe {

inline constexpr int kMaxDynamicSmem = 232448;  // sm_90: 227 KB per block
inline constexpr int kSmemAlign = 1024;         // 128-byte swizzle atom
inline constexpr int kSmemHeaderBytes = 128;    // expert id, row range

CUBIST_HD constexpr bool IsDirect(MoeFormat f) {
  return f == kBf16 || f == kFp8 || f == kFp8Block;
}
CUBIST_HD constexpr bool UsesFp8Mma(MoeFormat w, MoeFormat a) {
  return (w == kFp8 && a == kFp8) || (w == kFp8Block && a == kFp8Block);
}
CUBIST_HD constexpr int RoundUp(int x, int m) { return (x + m - 1) / m * m; }

// The weight x activation pairs the family implements (moe-math.md).
CUBIST_HD constexpr bool IsSupportedPair(MoeFormat w, MoeFormat a) {
  return (w == kBf16 && a == kBf16) || (w == kFp8 && a == kFp8) ||
         (w == kFp8Block && a == kFp8Block) || (w == kMxfp4 && a == kBf16) ||
         (w == kMxfp4 && a == kMxfp8) || (w == kNvfp4 && a == kNvfp4);
}

struct OperandLayout {
  bool direct = true;
  int rows = 0;
  int raw_row_bytes = 0;  // one row of one k-tile in the memory format
  int scale_bytes = 0;    // block-scale bytes per row per k-tile (decoded operands)
  int scale_words = 0;    // 32-bit words staged per row: scale_bytes + 3 bytes of slack
                          // for a row start that is not 4-byte aligned
  int stage_bytes = 0;    // per pipeline stage, rounded up to kSmemAlign
  int dec_bytes = 0;      // one decoded bf16 buffer (rows x tile_k x 2), 0 if direct
};

CUBIST_HD constexpr OperandLayout MakeOperandLayout(MoeFormat f, int rows, int tile_k) {
  OperandLayout o;
  o.direct = IsDirect(f);
  o.rows = rows;
  o.raw_row_bytes = tile_k * FormatBits(f) / 8;
  if (o.direct) {
    o.stage_bytes = RoundUp(rows * o.raw_row_bytes, kSmemAlign);
  } else {
    o.scale_bytes = tile_k / FormatScaleBlock(f);
    o.scale_words = (o.scale_bytes + 3 + 3) / 4;
    o.stage_bytes = RoundUp(rows * o.raw_row_bytes + rows * o.scale_words * 4, kSmemAlign);
    o.dec_bytes = rows * tile_k * 2;
  }
  return o;
}

struct MoeGemmLayout {
  OperandLayout a, b;
  int tile_m = 0, tile_n = 0, tile_k = 0, stages = 0;
  bool fp8_mma = false;
  int threads = 0;      // 128 per 64 rows of tile_m, at least 256 for decoding kernels
  int stage_bytes = 0;  // a + b
  int dec_offset = 0;   // decoded buffers start here (after the stages)
  int header_offset = 0;
  int smem_bytes = 0;   // dynamic shared memory to request, alignment slack included
  // Why the configuration is invalid, or nullptr.
  const char* error = nullptr;
};

CUBIST_HD constexpr MoeGemmLayout MakeLayout(MoeFormat w, MoeFormat a, int tile_m,
                                             int tile_n, int tile_k, int stages) {
  MoeGemmLayout l;
  l.tile_m = tile_m;
  l.tile_n = tile_n;
  l.tile_k = tile_k;
  l.stages = stages;
  l.fp8_mma = UsesFp8Mma(w, a);
  l.a = MakeOperandLayout(a, tile_m, tile_k);
  l.b = MakeOperandLayout(w, tile_n, tile_k);
  // One warpgroup per 64 rows; decoding kernels get at least two, so that decoding (the
  // bottleneck of fp4 kernels) has eight warps even when tile_m is 64.
  const int mma_wgs = tile_m / 64;
  l.threads = 128 * (!(l.a.direct && l.b.direct) && mma_wgs < 2 ? 2 : mma_wgs);
  l.stage_bytes = l.a.stage_bytes + l.b.stage_bytes;
  l.dec_offset = stages * l.stage_bytes;
  l.header_offset = l.dec_offset + 2 * (l.a.dec_bytes + l.b.dec_bytes);
  l.smem_bytes = kSmemAlign + l.header_offset + kSmemHeaderBytes;
  if (!IsSupportedPair(w, a)) {
    l.error = "unsupported weight x activation format pair";
  } else if (tile_m != 64 && tile_m != 128) {
    l.error = "tile_m must be 64 or 128";
  } else if (tile_n != 64 && tile_n != 128 && tile_n != 256) {
    l.error = "tile_n must be 64, 128 or 256";
  } else if (l.fp8_mma && tile_n > 128) {
    l.error = "fp8 kernels keep two accumulators: tile_n at most 128";
  } else if ((l.fp8_mma || !(l.a.direct && l.b.direct)) && tile_k != 128) {
    l.error = "fp8 and decoded (fp4, mxfp8) kernels need tile_k 128";
  } else if (tile_k != 64 && tile_k != 128) {
    l.error = "tile_k must be 64 or 128";
  } else if (stages < 3) {
    l.error = "stages must be at least 3";
  } else if (l.smem_bytes > kMaxDynamicSmem) {
    l.error = "shared memory exceeds 227 KB; use fewer stages";
  }
  return l;
}

}  // namespace cubist::moe

#endif  // CUBIST_KERNELS_MOE_GEMM_LAYOUT_H_
