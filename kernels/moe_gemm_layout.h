// Shared-memory layout and launch shape of each moe_gemm kernel kind (weight format,
// activation format, tile_m x tile_n x tile_k, pipeline stages): the kernels
// (kernels/moe_gemm_tma.cu, moe_gemm_fp4.cu, moe_gemm_fp4_fp8.cu) carve their dynamic
// shared memory with these numbers and the publisher (scripts/build-artifacts, through
// kernels/moe_gemm_meta.cc) writes threads and shared_mem_bytes into the manifest from
// the same functions, so the two cannot disagree. Plain constexpr C++, no CUDA headers.
//
// A panel is [rows x 128 bytes] with 16-byte chunk j of row r at chunk j ^ (r % 8) (the
// wgmma/TMA 128-byte swizzle).
#ifndef CUBIST_KERNELS_MOE_GEMM_LAYOUT_H_
#define CUBIST_KERNELS_MOE_GEMM_LAYOUT_H_

#include "kernels/moe_gemm_abi.h"

namespace cubist::moe {

inline constexpr int kMaxDynamicSmem = 232448;  // sm_90: 227 KB per block
inline constexpr int kSmemAlign = 1024;         // 128-byte swizzle atom

CUBIST_HD constexpr bool IsDirect(MoeFormat f) {
  return f == kBf16 || f == kFp8 || f == kFp8Block;
}
CUBIST_HD constexpr bool UsesFp8Mma(MoeFormat w, MoeFormat a) {
  return (w == kFp8 && a == kFp8) || (w == kFp8Block && a == kFp8Block);
}
CUBIST_HD constexpr int RoundUp(int x, int m) { return (x + m - 1) / m * m; }
// Whether setmaxnreg targets fit a kernel's register pool: what the launch bounds give each
// thread (65536 / (threads x CTAs per SM), a multiple of 8) times its warpgroups. The
// `consumers` warpgroups raise to consumer_regs, the others lower to producer_regs;
// setmaxnreg.inc waits for registers the others freed, so past the pool it waits forever
// (a build that asked 2 x 216 + 80 of 3 x 168 hung on the H200).
CUBIST_HD constexpr bool SetMaxNRegFits(int threads, int consumers, int consumer_regs,
                                        int producer_regs, int ctas_per_sm = 1) {
  const int groups = threads / 128;
  return consumers * consumer_regs + (groups - consumers) * producer_regs <=
         groups * (65536 / (threads * ctas_per_sm) / 8 * 8);
}

// ---------------------------------------------------------------------------------
// bf16 and fp8 kernels (TMA, warp-specialized, persistent): kernels/moe_gemm_tma.cu.
// Both operands direct (bf16 x bf16, fp8 x fp8, fp8-block x fp8-block); each pipeline
// stage holds one 128-byte-wide k-tile of A (tile_m rows) and of B (tile_n rows) exactly
// as TMA writes them with the 128-byte swizzle. Warpgroup 0 produces (one thread issues
// the copies), warpgroups 1..tile_m/64 consume (64 rows each). Shared memory:
//   [stages x (A tile, B tile)] [full/empty mbarriers] [offsets, tile prefix: E+1 each]
//   [fp8-block, 192 columns: per consumer two slots of block scales]
//   [epilogue: per consumer 64 rows x 64 output columns of bf16, rows padded to 144 B]
// The epilogue buffer exists in one-CTA-per-SM kernels: their consumers stage each 64-column
// chunk of the output there and write it back as whole 128-byte lines, where storing from
// the accumulator layout writes 16-byte pieces of 8 rows per instruction (measured on the
// H200: those stores cost 15% of Mixtral's FC1). Two-CTA kernels overlap one CTA's
// epilogue with the other's main loop instead and store directly.
// fp8-block kernels of 192 columns keep their block scales in shared memory, between the
// scheduler's arrays and the epilogue buffer: per consumer two slots (k-tiles kt and
// kt + 1) of 64 A-row scales and up to one B scale per 8-column group (most tiles store
// only the scales of each B half's first and last 128-row block, lo0 hi0 lo1 hi1;
// kernels/moe_gemm_block_split.h). Their accumulator and partial (96 registers each)
// leave no room for per-thread scale values and addresses.
inline constexpr int kMoeGemmTmaScaleSlots = 2;
CUBIST_HD constexpr int MoeGemmTmaScaleSlotBytes(int tile_n) { return (64 + tile_n / 8) * 4; }
inline constexpr int kMoeGemmTmaEpilogueCols = 64;
inline constexpr int kMoeGemmTmaEpilogueRowBytes = kMoeGemmTmaEpilogueCols * 2 + 16;
inline constexpr int kMoeGemmTmaEpilogueBytes = 64 * kMoeGemmTmaEpilogueRowBytes;

struct MoeGemmTmaLayout {
  int tile_m = 0, tile_n = 0, stages = 0;
  int consumers = 0;    // warpgroups that own accumulators
  int threads = 0;      // 128 * (consumers + 1)
  int ctas_per_sm = 1;  // CTAs the persistent grid places on each SM
  int consumer_regs = 0;  // setmaxnreg targets of two-consumer kernels
  int producer_regs = 40;
  int a_stage_bytes = 0, b_stage_bytes = 0, stage_bytes = 0;
  int barrier_offset = 0;  // 2 * stages mbarriers of 8 bytes
  int sched_offset = 0;    // 2 * (kMoeGemmTmaMaxExperts + 1) int32
  // consumers x kMoeGemmTmaScaleSlots x MoeGemmTmaScaleSlotBytes(tile_n) (smem_scales only)
  int scale_offset = 0;
  bool smem_scales = false;
  int epilogue_offset = 0;  // consumers x kMoeGemmTmaEpilogueBytes (staged epilogue only)
  bool staged_epilogue = false;
  int smem_bytes = 0;      // dynamic shared memory to request, alignment slack included
  bool fp8_mma = false;
  const char* error = nullptr;
};

inline constexpr int kMoeGemmTmaSchedBytes = 2 * (kMoeGemmTmaMaxExperts + 1) * 4;

CUBIST_HD constexpr MoeGemmTmaLayout MakeTmaLayout(MoeFormat w, MoeFormat a, int tile_m,
                                                   int tile_n, int stages) {
  MoeGemmTmaLayout l;
  l.tile_m = tile_m;
  l.tile_n = tile_n;
  l.stages = stages;
  l.fp8_mma = UsesFp8Mma(w, a);
  l.consumers = tile_m / 64;
  l.threads = 128 * (l.consumers + 1);
  l.a_stage_bytes = tile_m * kMoeGemmTmaBoxBytes;
  l.b_stage_bytes = tile_n * kMoeGemmTmaBoxBytes;
  l.stage_bytes = l.a_stage_bytes + l.b_stage_bytes;
  l.barrier_offset = stages * l.stage_bytes;
  l.sched_offset = l.barrier_offset + RoundUp(2 * stages * 8, 128);
  l.smem_bytes = kSmemAlign + l.sched_offset + kMoeGemmTmaSchedBytes;
  // One consumer: two CTAs per SM when they fit, so that one CTA's epilogue overlaps the
  // other's main loop; the register file then holds 2 x (producer + consumer).
  // (228 KiB per SM, 1 KiB of it reserved per CTA)
  // fp8 consumers hold an accumulator and two partials (192 registers): one per SM.
  l.ctas_per_sm = tile_m == 64 && !l.fp8_mma && 2 * (l.smem_bytes + 1024) <= 233472 ? 2 : 1;
  l.smem_scales = w == kFp8Block && tile_n == 192;
  l.scale_offset = RoundUp(l.sched_offset + kMoeGemmTmaSchedBytes, 128);
  l.epilogue_offset =
      l.smem_scales ? RoundUp(l.scale_offset + l.consumers * kMoeGemmTmaScaleSlots *
                                                   MoeGemmTmaScaleSlotBytes(tile_n),
                              128)
                    : l.scale_offset;
  l.staged_epilogue = l.ctas_per_sm == 1;
  if (l.staged_epilogue) {
    l.smem_bytes = kSmemAlign + l.epilogue_offset + l.consumers * kMoeGemmTmaEpilogueBytes;
  }
  l.consumer_regs = 232;  // used by two-consumer kernels (the producer keeps 40)
  if (!(w == a && IsDirect(w))) {
    l.error = "TMA kernels take bf16 x bf16, fp8 x fp8 or fp8-block x fp8-block";
  } else if (tile_m != 64 && tile_m != 128) {
    l.error = "tile_m must be 64 or 128";
  } else if (tile_n != 64 && tile_n != 128 && tile_n != 192 && tile_n != 256) {
    l.error = "tile_n must be 64, 128, 192 or 256";
  } else if (tile_n == 192 && !((w == kFp8 || w == kFp8Block) && tile_m == 128)) {
    l.error = "tile_n 192 is for fp8 and fp8-block kernels of 128 rows (an accumulator and "
              "one partial of 96 registers per consumer)";
  } else if (l.fp8_mma && tile_n > 192) {
    l.error = "fp8 kernels keep an accumulator and partials: tile_n at most 192";
  } else if (l.consumers == 2 &&
             !SetMaxNRegFits(l.threads, l.consumers, l.consumer_regs, l.producer_regs)) {
    l.error = "setmaxnreg targets exceed the CTA's register pool";
  } else if (stages < 2) {
    l.error = "stages must be at least 2";
  } else if (l.smem_bytes > kMaxDynamicSmem) {
    l.error = "shared memory exceeds 227 KB; use fewer stages";
  }
  return l;
}

// ---------------------------------------------------------------------------------
// Version-2 fp4-weight kernels: kernels/moe_gemm_fp4.cu (mxfp4 x bf16, mxfp4 x mxfp8,
// nvfp4 x nvfp4). The weights stay packed in shared memory and each consumer decodes its
// 64 rows straight into wgmma's A registers; the tokens are the MMA's N (tile_m of the
// problem, 8 to 128), the weight rows its M (tile_n of the problem, 64 per consumer). A
// k-tile is 256 elements: 128 bytes of packed weights per row (one TMA box row) and four
// 64-element bf16 panels of activations. Activations in mxfp8 or nvfp4 arrive raw (two or
// one 128-byte boxes per row) and the producer warpgroup's three idle warps convert them
// into the bf16 panels, signalling a third barrier per stage.
//   [stages x (weights W x 128 B, bf16 activations 4 x TT x 128 B, raw activations)]
//   [mbarriers: full, empty, converted (raw activations only)] [scale flags: a word per
//   stage (raw activations only)] [offsets, tile prefix] [weight scales: stages x W x
//   8 B (mxfp4) or 16 B (nvfp4), raw activations only] [epilogue min(TT, 64) x W fp32]
// (Where converters run (raw activations), they also stage each k-tile's weight scale
// bytes, aligned, for the consumers, who read them from shared memory with one load per
// row instead of three to five unaligned global loads each: on decode shapes those loads
// were the consumers' largest stall (long scoreboard) and the four lanes of a row loaded
// the same words. The converters flag the mxfp4 stages whose scales exceed 2^0, which
// the consumers decode with two multiplies instead of one. Kernels without converters
// read the scales from global memory, one k-tile ahead.)
inline constexpr int kMoeGemmFp4KTile = 256;

// bf16 activations of tiles with at most this many tokens also go through the converter,
// which then only permutes them into the order of the cheaper weight decode. Measured on
// the H200 (docs/benchmarks.md): 8 tokens gain 15-17%, 16 tokens lose 15%, 32 tie.
inline constexpr int kFp4PermutedBf16MaxTokens = 8;

// Raw 128-byte boxes per row and k-tile of activations the converter decodes or permutes
// (0: bf16 copied by TMA straight into the panels).
CUBIST_HD constexpr int Fp4RawBoxes(MoeFormat a, int tile_m) {
  return a == kMxfp8 ? 2
         : a == kNvfp4 ? 1
         : a == kBf16 && tile_m <= kFp4PermutedBf16MaxTokens ? 4
                                                              : 0;
}

struct MoeGemmFp4Layout {
  int tile_m = 0, tile_n = 0, stages = 0;
  int consumers = 0, threads = 0, ctas_per_sm = 1;
  int converters = 0;  // threads that decode raw activations (0: none)
  // setmaxnreg targets (0: none): two CTAs per SM of two consumer warpgroups launch with
  // 80 registers a thread, and the consumers' decode loop spilled at 80 (its tile loop's
  // reloads missed L1, 7% of the consumers' stall samples on gpt-oss decode); the
  // producer warpgroup (the producer thread and three converter warps) needs fewer. A CTA
  // alone on its SM with a warpgroup of converters (512 threads) launches with 128, where
  // 128 tokens' accumulators spilled the consumers too: 160 for them, 96 for the producer
  // and converter warpgroups (at 88 the converters' items spilled).
  int consumer_regs = 0, producer_regs = 0;
  int w_stage_bytes = 0, a_stage_bytes = 0, raw_stage_bytes = 0, stage_bytes = 0;
  int barrier_offset = 0, flag_offset = 0, sched_offset = 0, epilogue_offset = 0;
  // The converters' weight scale bytes per stage (0: the consumers read global memory).
  int wscale_offset = 0, wscale_row_bytes = 0, wscale_stage_bytes = 0;
  int epilogue_tokens = 0;  // tokens the epilogue stages at a time (at most 64, or 32)
  int smem_bytes = 0;
  const char* error = nullptr;
};

CUBIST_HD constexpr MoeGemmFp4Layout MakeFp4Layout(MoeFormat w, MoeFormat a, int tile_m,
                                                   int tile_n, int stages) {
  MoeGemmFp4Layout l;
  l.tile_m = tile_m;
  l.tile_n = tile_n;
  l.stages = stages;
  l.consumers = tile_n / 64;
  l.threads = 128 * (l.consumers + 1);
  l.w_stage_bytes = tile_n * kMoeGemmTmaBoxBytes;
  l.a_stage_bytes = 4 * tile_m * kMoeGemmTmaBoxBytes;
  l.raw_stage_bytes = Fp4RawBoxes(a, tile_m) * tile_m * kMoeGemmTmaBoxBytes;
  l.stage_bytes = l.w_stage_bytes + l.a_stage_bytes + l.raw_stage_bytes;
  l.barrier_offset = stages * l.stage_bytes;
  // bf16 activations need no converted barrier and no flags.
  const bool raw = l.raw_stage_bytes > 0;
  l.flag_offset = l.barrier_offset + (raw ? 3 : 2) * stages * 8;
  l.sched_offset = l.barrier_offset + RoundUp((raw ? 3 * 8 + 4 : 2 * 8) * stages, 128);
  l.wscale_offset = RoundUp(l.sched_offset + kMoeGemmTmaSchedBytes, 128);
  l.wscale_row_bytes = raw ? kMoeGemmFp4KTile / (w == kNvfp4 ? 16 : 32) : 0;
  l.wscale_stage_bytes = tile_n * l.wscale_row_bytes;
  l.epilogue_offset = raw ? l.wscale_offset + stages * l.wscale_stage_bytes
                          : l.sched_offset + kMoeGemmTmaSchedBytes;
  // At most 64 tokens at a time; 32 where raw activations take stage space (a third
  // pipeline stage for 64 tokens of mxfp8).
  const int ep_max = l.raw_stage_bytes > 0 ? 32 : 64;
  l.epilogue_tokens = tile_m < ep_max ? tile_m : ep_max;
  l.smem_bytes = kSmemAlign + l.epilogue_offset + l.epilogue_tokens * tile_n * 4;
  l.ctas_per_sm = 2 * (l.smem_bytes + 1024) <= 233472 ? 2 : 1;
  // Raw activations are converted by the producer warpgroup's three idle warps; a CTA
  // alone on its SM with 32 or more tokens (whose activation tile is as large as a
  // quarter of the weights') adds a warpgroup of converters.
  if (l.raw_stage_bytes > 0) {
    const bool extra = l.ctas_per_sm == 1 && tile_m >= 32;
    l.converters = extra ? 96 + 128 : 96;
    l.threads += extra ? 128 : 0;
  }
  if (l.ctas_per_sm == 2 && l.consumers == 2) {
    l.consumer_regs = 88;
    l.producer_regs = 64;
  } else if (l.threads == 512 && l.consumers == 2) {
    l.consumer_regs = 160;
    l.producer_regs = 96;
  }
  if (!((w == kMxfp4 && (a == kBf16 || a == kMxfp8)) ||
        (w == kNvfp4 && (a == kBf16 || a == kNvfp4)))) {
    l.error = "fp4 TMA kernels take mxfp4 x bf16, mxfp4 x mxfp8, nvfp4 x bf16 or nvfp4 x nvfp4";
  } else if (tile_m != 8 && tile_m != 16 && tile_m != 32 && tile_m != 64 && tile_m != 128) {
    l.error = "tile_m (tokens) must be 8, 16, 32, 64 or 128";
  } else if (a == kMxfp8 && tile_m > 64) {
    // Two stages of 128 tokens' bf16 panels and raw boxes do not fit.
    l.error = "mxfp4 x mxfp8 takes at most 64 tokens here; 128-token tiles are "
              "MakeFp4Fp8Layout's (kernels/moe_gemm_fp4_fp8.cu, tile_k 128)";
  } else if (tile_n != 64 && tile_n != 128) {
    l.error = "tile_n must be 64 or 128";
  } else if (stages < 2) {
    l.error = "stages must be at least 2";
  } else if (l.smem_bytes > kMaxDynamicSmem) {
    l.error = "shared memory exceeds 227 KB; use fewer stages";
  } else if (l.consumer_regs > 0 && !SetMaxNRegFits(l.threads, l.consumers, l.consumer_regs,
                                                    l.producer_regs, l.ctas_per_sm)) {
    l.error = "setmaxnreg targets exceed the CTA's register pool";
  }
  return l;
}

// ---------------------------------------------------------------------------------
// Version-2 mxfp4 x mxfp8 kernels on FP8 wgmma: kernels/moe_gemm_fp4_fp8.cu. Tokens are
// the MMA's M (tile_m, 64 per consumer warpgroup), weight rows its N (tile_n), as in
// kernels/moe_gemm_tma.cu. A pipeline stage is a k-tile of 128 elements: one 128-byte TMA
// box of mxfp8 activations per token row (the panel wgmma reads) and the weights of that
// k-tile decoded into one e4m3 panel, with each row's block scales folded in, by
// converters (the producer warpgroup's three other warps and a warpgroup after the
// consumers). The packed weights arrive 256
// elements (one 128-byte box) per row at a time in a ring of three slots of their own, each
// slot feeding two stages and loaded a k-tile before the first of them:
//   [stages x (activations TM x 128 B, decoded weights TN x 128 B, weight scales 4 x TN
//              fp32 (general loop only), column factors TN fp32, token scales TM x 4
//              fp32, mode)]
//   [packed weight slots x TN x 128 B]
//   [mbarriers: full, empty, converted per stage; full, empty per packed slot]
//   [offsets, tile prefix] [row refs TN x 4 B]
//   [epilogue: per consumer 64 rows x 64 columns of bf16, rows padded to 144 B]
// The tokens' block scales are staged as fp32 by the producer warp, 16 bytes per token
// row and k-tile.
inline constexpr int kFp4Fp8PackedSlots = 3;

struct MoeGemmFp4Fp8Layout {
  int tile_m = 0, tile_n = 0, stages = 0;
  int consumers = 0, threads = 0, ctas_per_sm = 1;
  // Warps 1-3 of the producer warpgroup and a warpgroup of their own.
  int converters = 96 + 128;
  // setmaxnreg targets: the consumers keep an accumulator and a partial; the producer's
  // and the converters' warpgroups share the rest of the register file. 168 / 88 since the
  // consumers stopped reading the tokens' scale bytes: the converters' unrolled item loop
  // fits (measured 4-14% faster than 176 / 80 with a rolled loop).
  int consumer_regs = 168, producer_regs = 88;
  // Offsets within a stage.
  int a_offset = 0, dec_offset = 0;
  int wscale_offset = 0, col_offset = 0, tscale_offset = 0, mode_offset = 0;
  int stage_bytes = 0;
  int packed_offset = 0, packed_bytes = 0;  // the packed ring, and one slot
  int barrier_offset = 0, sched_offset = 0, ref_offset = 0, epilogue_offset = 0;
  int smem_bytes = 0;
  const char* error = nullptr;
};

CUBIST_HD constexpr MoeGemmFp4Fp8Layout MakeFp4Fp8Layout(int tile_m, int tile_n, int stages) {
  MoeGemmFp4Fp8Layout l;
  l.tile_m = tile_m;
  l.tile_n = tile_n;
  l.stages = stages;
  l.consumers = tile_m / 64;
  l.threads = 128 * (l.consumers + 2);
  l.a_offset = 0;
  l.dec_offset = tile_m * kMoeGemmTmaBoxBytes;
  l.wscale_offset = l.dec_offset + tile_n * kMoeGemmTmaBoxBytes;
  l.col_offset = l.wscale_offset + 4 * tile_n * 4;
  l.tscale_offset = l.col_offset + tile_n * 4;
  l.mode_offset = l.tscale_offset + tile_m * 16;
  l.stage_bytes = RoundUp(l.mode_offset + 16, kSmemAlign);
  l.packed_bytes = tile_n * kMoeGemmTmaBoxBytes;
  l.packed_offset = stages * l.stage_bytes;
  l.barrier_offset = l.packed_offset + kFp4Fp8PackedSlots * l.packed_bytes;
  l.sched_offset = l.barrier_offset + RoundUp((3 * stages + 2 * kFp4Fp8PackedSlots) * 8, 128);
  l.ref_offset = l.sched_offset + kMoeGemmTmaSchedBytes;
  l.epilogue_offset = RoundUp(l.ref_offset + tile_n * 4, 128);
  l.smem_bytes = kSmemAlign + l.epilogue_offset + l.consumers * kMoeGemmTmaEpilogueBytes;
  if (tile_m != 128) {
    l.error = "mxfp4 x mxfp8 fp8-MMA kernels take tile_m 128 (two consumer warpgroups)";
  } else if (tile_n != 128) {
    l.error = "mxfp4 x mxfp8 fp8-MMA kernels take tile_n 128";
  } else if (!SetMaxNRegFits(l.threads, l.consumers, l.consumer_regs, l.producer_regs)) {
    l.error = "setmaxnreg targets exceed the CTA's register pool";
  } else if (stages < 2) {
    l.error = "stages must be at least 2";
  } else if (l.smem_bytes > kMaxDynamicSmem) {
    l.error = "shared memory exceeds 227 KB; use fewer stages";
  }
  return l;
}

}  // namespace cubist::moe

#endif  // CUBIST_KERNELS_MOE_GEMM_LAYOUT_H_
