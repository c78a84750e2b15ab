// The mxfp4 x mxfp8 moe_gemm kernels of ABI version 2 for sm_90a on FP8 tensor cores
// (wgmma ...k32.e4m3.e4m3). One kernel per cubin, built by scripts/build-artifacts with
//   -DMOE_ACT=kSwiglu -DMOE_TM=128 -DMOE_TN=128 -DMOE_STAGES=4
//   -DMOE_NAME=moe_gemm_tma_mxfp4_mxfp8_swiglu_m128n128k128
// and -gencode=arch=compute_90a,code=sm_90a. Contract: kernels/moe_gemm_abi.h (version 2,
// the same tensor maps as every version-2 kernel); shared memory: MakeFp4Fp8Layout in
// kernels/moe_gemm_layout.h; docs/kernels.md explains the design and the measurements.
//
// The fp4 kernels (kernels/moe_gemm_fp4.cu) multiply in bf16, so half the FP8 rate is
// their ceiling. Here the activations stay e4m3 and the weights become e4m3:
//   - the producer warp: one thread copies each 128-element k-tile of activations with TMA
//     as the 128-byte-swizzled panel wgmma reads, and the packed weights of two k-tiles
//     (128 bytes per row) a k-tile ahead into a ring of three staging slots of their own;
//     all 32 lanes write each stage's token block scales as fp32 (16 bytes per token row),
//     loaded a k-tile ahead;
//   - converters (the producer warpgroup's other three warps and a warpgroup of their
//     own) decode each k-tile's packed weights into an e4m3 panel of its stage as soon as
//     the consumers have released it (not waiting for its activations). e2m1 x 2^v
//     is exact in e4m3 for v in [-5, 6] (every nonzero value stays normal, the largest is
//     384), so each row's ue8m0 block scale is folded into its elements relative to the
//     row's largest scale: v = scale - ref + 6. A wgmma of one 32-element block then needs
//     only the tokens' block scale, applied in fp32 when the block's partial sum is
//     promoted into the accumulators (one FFMA per element and block), and 2^(ref - 133)
//     per column at the end. The converters find ref (and the smallest scale) of each of
//     the tile's weight rows in one pass over its scale bytes before the tile's first
//     k-tile (prefetched into L2 during the previous tile);
//   - tiles with a row whose scales span more than 11 binades (or that holds a NaN scale)
//     take the general loop instead: weights decoded as e2m1 x 2^6, and both block scales
//     applied at promotion (two FP32 operations per element and block). Exact either way:
//     every product of an e4m3 activation and a decoded weight is exact, and the tensor
//     cores sum 32 of them per partial;
//   - the converters and the producer warp signal a third barrier per stage, which the
//     consumers wait on besides the full one;
//   - two consumer warpgroups each own 64 token rows and all 128 weight columns: per
//     32-element block one wgmma m64n128k32 into a fresh partial, then the promotion. One
//     warpgroup's promotion runs while the other's wgmma does;
//   - the epilogue is generation 2's staged one (kernels/moe_gemm_tma_common.cuh).
// Measured on the H200 (docs/kernels.md): converters in the producer warpgroup alone, two
// stages of 256 elements, or scale bytes packed right after their load each left the
// consumers waiting on the converted barrier; as built, the consumers' chain of wgmma, wait
// and promotion per block bounds them (a second partial to overlap it needs registers that
// neither side has to spare at 128 weight rows; at 80 and 96 it fits and runs slower).
// Scheduling is generation 2's persistent one over (token tile, weight-row tile).
#include <cuda_bf16.h>
#include <stdint.h>

#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_device.cuh"
#include "kernels/moe_gemm_layout.h"
#include "kernels/moe_gemm_tma_common.cuh"
#include "kernels/wgmma_ops.cuh"

#if !defined(MOE_ACT) || !defined(MOE_TM) || !defined(MOE_TN) || !defined(MOE_STAGES) || \
    !defined(MOE_NAME)
#error "define MOE_ACT MOE_TM MOE_TN MOE_STAGES MOE_NAME"
#endif

namespace cubist::moe {
namespace {

__device__ __forceinline__ float2 LdSharedF2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

// The converters' own barrier (named barrier 3).
template <int kConverters>
__device__ __forceinline__ void ConverterSync() {
  asm volatile("bar.sync 3, %0;\n" ::"n"(kConverters) : "memory");
}
// The same barrier, returning whether `bad` held in any converter thread.
template <int kConverters>
__device__ __forceinline__ bool ConverterAny(bool bad) {
  uint32_t any;
  asm volatile(
      "{\n.reg .pred p, q;\nsetp.ne.u32 p, %1, 0;\n"
      "barrier.cta.red.or.pred q, 3, %2, p;\nselp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(bad ? 1u : 0u), "n"(kConverters)
      : "memory");
  return any != 0;
}

template <MoeActivation ACT, int TM, int TN, int ST>
struct MoeGemmFp4Fp8 {
  static constexpr MoeGemmFp4Fp8Layout L = MakeFp4Fp8Layout(TM, TN, ST);
  static_assert(L.error == nullptr, "invalid moe_gemm_fp4_fp8 configuration (moe_gemm_layout.h)");
  static constexpr int kThreads = L.threads;
  static constexpr int kConsumers = L.consumers;
  static constexpr int kConverters = L.converters;
  // A converter's items (Convert): one 32-element block of every kStep-th weight row.
  static constexpr int kStep = kConverters / 4;  // rows between a converter's items
  static constexpr int kItems = (TN + kStep - 1) / kStep;
  static_assert(kItems <= 8, "one scale byte per item in one 64-bit word");
  static constexpr bool kGated = IsGated(ACT);
  using Mma = Wgmma<WgmmaKind::kE4m3, TN>;
  static constexpr int kRegs = Mma::kRegs;
  static constexpr int kKTile = 128;                      // elements of K per stage
  static constexpr int kWRows = MoeGemmTmaBRows(TN, ACT);  // weight rows per TMA box
  // A weight row's block scales may span this many binades for the folded (uniform) loop.
  static constexpr int kMaxSpan = 11;

  // What every role of a CTA shares: shared memory, the pipeline's barriers (at + 8 *
  // stage; the packed slots' at + 8 * slot), the scheduler's offsets and the tile space
  // (PipelinePrologue).
  struct Cta {
    const MoeGemmParamsV2& pv;
    uint8_t* smem;
    uint32_t smem_base, full_bar, empty_bar, conv_bar, pfull_bar, pempty_bar;
    const int* off;
    const int* pre;
    int experts;
    int64_t m_tiles, n_tiles, tiles;
    int num_kt;
  };

  // Setup, the prologue, then each thread's role: warp 0 produces, the other warps of
  // warpgroup 0 and the warpgroup after the consumers convert, warpgroups 1 .. kConsumers
  // consume.
  __device__ static void Run(const MoeGemmParamsV2& pv) {
    const MoeGemmParams& p = pv.g;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) & ~uintptr_t{kSmemAlign - 1});
    const uint32_t smem_base = SmemAddr(smem);
    const uint32_t full_bar = smem_base + L.barrier_offset;
    const uint32_t empty_bar = full_bar + 8 * ST;
    const uint32_t conv_bar = empty_bar + 8 * ST;
    const uint32_t pfull_bar = conv_bar + 8 * ST;  // packed slots
    const uint32_t pempty_bar = pfull_bar + 8 * kFp4Fp8PackedSlots;
    int* off = reinterpret_cast<int*>(smem + L.sched_offset);
    int* pre = off + kMoeGemmTmaMaxExperts + 1;
    const int E = p.num_experts;
    if (E < 1 || E > kMoeGemmTmaMaxExperts) return;

    if (threadIdx.x == 0) {  // before the prologue's fence and barrier, by the same thread
      // The converters and the producer warp's token scales.
      for (int s = 0; s < ST; ++s) MbarInit(conv_bar + 8 * s, kConverters + 1);
      for (int s = 0; s < kFp4Fp8PackedSlots; ++s) {
        MbarInit(pfull_bar + 8 * s, 1);
        MbarInit(pempty_bar + 8 * s, kConverters);
      }
    }
    const int64_t m_tiles = PipelinePrologue<ST>(pv, full_bar, empty_bar, kConsumers, TM, off, pre);
    const int64_t n_tiles = MoeGemmNTiles(p.n, ACT, TN);
    const Cta c{pv,        smem,       smem_base, full_bar, empty_bar, conv_bar,
                pfull_bar, pempty_bar, off,       pre,      E,         m_tiles,
                n_tiles,   m_tiles * n_tiles,     (p.k + kKTile - 1) / kKTile};
    const int wg = threadIdx.x / 128;
    if (wg == 0 || wg > kConsumers) {
      SetMaxRegsDec<L.producer_regs>();
      if (threadIdx.x >= 32) {
        // Converters: warps 1-3 of warpgroup 0, then the warpgroup after the consumers.
        const int ct = wg == 0 ? threadIdx.x - 32 : threadIdx.x - 128 * (kConsumers + 1) + 96;
        Convert(c, ct);
        return;
      }
      Produce(c);
      return;
    }
    Consume(c, wg - 1);
  }

  // The producer warp. Lane 0 issues the TMA copies: per stage it waits for `empty` (the
  // consumers released it) and copies the k-tile's activations, completing on `full`; per
  // pair of k-tiles it waits for `pempty` (the converters are done with the packed slot)
  // and copies the packed weights, completing on `pfull`. Every lane stages the tokens'
  // block scales (StoreTokenScales), then lane 0 arrives on `conv` for them.
  __device__ __forceinline__ static void Produce(const Cta& c) {
    const MoeGemmParams& p = c.pv.g;
    const int lane = threadIdx.x;
    const bool leader = lane == 0;
    const int kb = p.k / 32;
    uint32_t bytes[kTokRows][4];
    StageRing<ST> ring;
    StageRing<kFp4Fp8PackedSlots> slot;
    for (int64_t tile = blockIdx.x; tile < c.tiles; tile += gridDim.x) {
      const MoeTile t = TileAt(tile, c.m_tiles, c.n_tiles, c.experts, TM, c.off, c.pre);
      if (leader) PrefetchBiasL2<ACT, TN>(p, t.e, t.n_tile);
      const int w_row = t.e * p.n + t.n_tile * kWRows;
      // The packed weights of k-tiles 2 q and 2 q + 1: 128 bytes (256 elements) per row;
      // the gate half N/2 rows further down the expert's B.
      auto load_pair = [&](int q) {
        if (leader) {
          MbarWait(c.pempty_bar + 8 * slot.s, slot.phase ^ 1);
          const uint32_t pfull = c.pfull_bar + 8 * slot.s;
          const uint32_t dst = c.smem_base + L.packed_offset + slot.s * L.packed_bytes;
          MbarArriveExpectTx(pfull, TN * kMoeGemmTmaBoxBytes);
          TmaLoad2d(dst, &c.pv.b_map, q * kMoeGemmTmaBoxBytes, w_row, pfull);
          if constexpr (kGated) {
            TmaLoad2d(dst + kWRows * kMoeGemmTmaBoxBytes, &c.pv.b_map, q * kMoeGemmTmaBoxBytes,
                      w_row + p.n / 2, pfull);
          }
        }
        slot.Advance();
      };
      for (int kt = 0; kt < c.num_kt; ++kt) {
        // A pair is loaded during the odd k-tile before it (the first with the tile's
        // first k-tile), so that it has landed when its stage comes free.
        if (kt == 0) load_pair(0);
        if (kt % 2 == 1 && kt + 1 < c.num_kt) load_pair((kt + 1) / 2);
        MbarWait(c.empty_bar + 8 * ring.s, ring.phase ^ 1);
        const uint32_t stage = c.smem_base + ring.s * L.stage_bytes;
        if (leader) {
          const uint32_t full = c.full_bar + 8 * ring.s;
          MbarArriveExpectTx(full, TM * kMoeGemmTmaBoxBytes);
          TmaLoad2d(stage + L.a_offset, &c.pv.a_map, kt * kKTile, t.row_begin, full);
        }
        // This k-tile's bytes were loaded during the previous one (the first of a tile's
        // now); the next k-tile's are loaded before these are stored, so that their
        // latency passes while the producer waits for the next free stage.
        if (kt == 0) LoadTokenScales(p, t.row_begin, 0, kb, lane, bytes);
        uint32_t now[kTokRows][4];
#pragma unroll
        for (int i = 0; i < kTokRows; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) now[i][j] = bytes[i][j];
        }
        if (kt + 1 < c.num_kt) LoadTokenScales(p, t.row_begin, kt + 1, kb, lane, bytes);
        StoreTokenScales(now, lane, stage + L.tscale_offset);
        __syncwarp();
        if (leader) MbarArrive(c.conv_bar + 8 * ring.s);
        ring.Advance();
      }
    }
  }

  // Consumer warpgroup ci (token rows ci*64 .. ci*64+63 of each tile): per tile, the main
  // loop (MainLoop: waits on `full` and `conv` per stage, arrives on `empty`) into fp32
  // accumulators, then the epilogue (generation 2's StoreStaged, which synchronises only
  // this warpgroup on its own named barrier, or StoreTile).
  __device__ __forceinline__ static void Consume(const Cta& c, int ci) {
    const MoeGemmParams& p = c.pv.g;
    SetMaxRegsInc<L.consumer_regs>();
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
    const bool signals = threadIdx.x % 128 == 0;
    // This thread's two token rows (tile-relative) and its first column pair.
    const int row_a = ci * 64 + warp * 16 + lane / 4;
    const int col0 = 2 * (lane % 4);
    const int kb = p.k / 32;
    StageRing<ST> pipe;
    float acc[kRegs];
    for (int64_t tile = blockIdx.x; tile < c.tiles; tile += gridDim.x) {
      const MoeTile t = TileAt(tile, c.m_tiles, c.n_tiles, c.experts, TM, c.off, c.pre);
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
      // The mode is the same in every stage of a tile; read it from the first.
      MbarWait(c.full_bar + 8 * pipe.s, pipe.phase);
      MbarWait(c.conv_bar + 8 * pipe.s, pipe.phase);
      const bool uniform =
          *reinterpret_cast<const int*>(c.smem + pipe.s * L.stage_bytes + L.mode_offset) != 0;
      if (uniform) {
        MainLoop<true>(c.smem_base, c.full_bar, c.conv_bar, c.empty_bar, signals, pipe,
                       c.num_kt, kb, ci, row_a, col0, acc);
      } else {
        MainLoop<false>(c.smem_base, c.full_bar, c.conv_bar, c.empty_bar, signals, pipe,
                        c.num_kt, kb, ci, row_a, col0, acc);
      }
      // Tiles with fewer rows than the consumer's 64 store directly (as generation 2).
      if (t.row_end - (t.row_begin + ci * 64) >= 64) {
        StoreStaged<kMxfp4, ACT, TN>(p, t, ci, acc,
                                     c.smem + L.epilogue_offset + ci * kMoeGemmTmaEpilogueBytes);
      } else {
        StoreTile<kMxfp4, ACT, TN>(p, t.e, t.row_begin + ci * 64, t.row_end, t.n_tile, acc);
      }
    }
  }

  // The producer warp's part of a stage: the tokens' block scales of k-tile kt as fp32,
  // 16 bytes per token row of the tile. Each lane takes rows lane, lane + 32, ...: first
  // the ue8m0 bytes (rows past the last token and blocks past K, whose elements are TMA's
  // zeros, get byte 0), then their fp32 values into the stage. (Read by the consumers
  // themselves, the bytes' loads, addresses and conversions were about 90 of their 460
  // instructions per k-tile; measured with ncu. Loaded and stored in one step, their
  // latency held up every stage's TMA and left the consumers waiting; measured.)
  static constexpr int kTokRows = TM / 32;
  __device__ __forceinline__ static void LoadTokenScales(const MoeGemmParams& p, int row_begin,
                                                         int kt, int kb, int lane,
                                                         uint32_t (&b)[kTokRows][4]) {
    const uint8_t* a_scale = static_cast<const uint8_t*>(p.a_scale);
#pragma unroll
    for (int i = 0; i < kTokRows; ++i) {
      const int row = row_begin + lane + 32 * i;
      const uint8_t* src = a_scale + static_cast<int64_t>(row) * kb + kt * 4;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        b[i][j] = row < p.num_tokens && kt * 4 + j < kb ? __ldg(src + j) : 0u;
      }
    }
  }
  __device__ __forceinline__ static void StoreTokenScales(const uint32_t (&b)[kTokRows][4],
                                                          int lane, uint32_t dst) {
#pragma unroll
    for (int i = 0; i < kTokRows; ++i) {
      StShared128(dst + (lane + 32 * i) * 16,
                  make_uint4(__float_as_uint(Ue8m0ToFloat(b[i][0])),
                             __float_as_uint(Ue8m0ToFloat(b[i][1])),
                             __float_as_uint(Ue8m0ToFloat(b[i][2])),
                             __float_as_uint(Ue8m0ToFloat(b[i][3]))));
    }
  }

  // One block's promotion: acc += part * the token row's block scale (and, in the general
  // loop, the weight column's block scale, read from shared memory at ws).
  template <bool kUniform>
  __device__ __forceinline__ static void Promote(float (&acc)[kRegs], const float (&part)[kRegs],
                                                 float sa, float sb, uint32_t ws) {
    if constexpr (kUniform) {
#pragma unroll
      for (int g = 0; g < TN / 8; ++g) {
        acc[g * 4 + 0] += part[g * 4 + 0] * sa;
        acc[g * 4 + 1] += part[g * 4 + 1] * sa;
        acc[g * 4 + 2] += part[g * 4 + 2] * sb;
        acc[g * 4 + 3] += part[g * 4 + 3] * sb;
      }
    } else {
#pragma unroll
      for (int g = 0; g < TN / 8; ++g) {
        const float2 w = LdSharedF2(ws + g * 32);
        acc[g * 4 + 0] += part[g * 4 + 0] * sa * w.x;
        acc[g * 4 + 1] += part[g * 4 + 1] * sa * w.y;
        acc[g * 4 + 2] += part[g * 4 + 2] * sb * w.x;
        acc[g * 4 + 3] += part[g * 4 + 3] * sb * w.y;
      }
    }
  }

  // The uniform loop's last step: 2^(ref - 133) per weight column (the row's largest
  // scale and the 2^6 of the fold), from the tile's last stage.
  __device__ __forceinline__ static void ColumnFactors(float (&acc)[kRegs], uint32_t stage,
                                                       int col0) {
    const uint32_t cs = stage + L.col_offset + col0 * 4;
#pragma unroll
    for (int g = 0; g < TN / 8; ++g) {
      const float2 c = LdSharedF2(cs + g * 32);
      acc[g * 4 + 0] *= c.x;
      acc[g * 4 + 1] *= c.y;
      acc[g * 4 + 2] *= c.x;
      acc[g * 4 + 3] *= c.y;
    }
  }

  // Block j's descriptor from block 0's: 32 bytes further (2 in the address field, which
  // cannot carry out of the low word: shared addresses stay below 2^18).
  __device__ __forceinline__ static uint64_t DescAt(uint64_t d0, int j) {
    const uint32_t lo = static_cast<uint32_t>(d0) + 2 * j;
    return static_cast<uint64_t>(static_cast<uint32_t>(d0 >> 32)) << 32 | lo;
  }

  // The token scales of this thread's two rows for the four blocks of a stage. (Through
  // LdShared128 and bit casts the cubins come out different, and that build was never
  // measured; this one was.)
  __device__ __forceinline__ static void TokenScales(uint32_t stage, int row_a, float4* sa,
                                                     float4* sb) {
    const uint32_t a = stage + L.tscale_offset + row_a * 16;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(sa->x), "=f"(sa->y), "=f"(sa->z), "=f"(sa->w)
                 : "r"(a));
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(sb->x), "=f"(sb->y), "=f"(sb->z), "=f"(sb->w)
                 : "r"(a + 8 * 16));
  }
  __device__ __forceinline__ static float Lane(const float4& v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
  }

  // One tile's k-tiles. The first stage's barriers have been waited on already. kUniform:
  // weights carry their block scales (relative to the row's largest) and the column factors
  // of the last stage finish them; otherwise both block scales are applied per block. The
  // tokens' block scales come from the stage (the producer warp's fp32). Per block: its
  // wgmma, the wait, its promotion. (Two partials, block j's wgmma in flight while block
  // j - 1 is promoted, fit the registers only with tiles of at most 96 weight rows, and
  // those measured 6-29% slower than this loop on 128; docs/kernels.md.)
  template <bool kUniform>
  __device__ __forceinline__ static void MainLoop(uint32_t smem_base, uint32_t full_bar,
                                                  uint32_t conv_bar, uint32_t empty_bar,
                                                  bool signals, StageRing<ST>& pipe,
                                                  int num_kt, int kb, int ci, int row_a,
                                                  int col0, float (&acc)[kRegs]) {
    float part[kRegs];
    for (int kt = 0; kt < num_kt; ++kt) {
      if (kt > 0) {
        MbarWait(full_bar + 8 * pipe.s, pipe.phase);
        MbarWait(conv_bar + 8 * pipe.s, pipe.phase);
      }
      const uint32_t stage = smem_base + pipe.s * L.stage_bytes;
      float4 sa, sb;
      TokenScales(stage, row_a, &sa, &sb);
      const int blocks = min(4, kb - kt * 4);
      const uint64_t da0 = Desc(stage + L.a_offset + ci * 64 * kMoeGemmTmaBoxBytes);
      const uint64_t db0 = Desc(stage + L.dec_offset);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j >= blocks) break;
        WgmmaFence();
        Mma::Mma(part, DescAt(da0, j), DescAt(db0, j), 0);
        WgmmaCommit();
        WgmmaWait<0>();
        FenceRegs(part);
        Promote<kUniform>(acc, part, Lane(sa, j), Lane(sb, j), WScaleAt(stage, j, col0));
      }
      if constexpr (kUniform) {
        if (kt == num_kt - 1) ColumnFactors(acc, stage, col0);
      }
      if (signals) MbarArrive(empty_bar + 8 * pipe.s);
      pipe.Advance();
    }
  }

  // The general loop's weight scales of block j of a stage, this thread's first column.
  __device__ __forceinline__ static uint32_t WScaleAt(uint32_t stage, int j, int col0) {
    return stage + L.wscale_offset + j * TN * 4 + col0 * 4;
  }

  // The weight row (and scale row) of row r of a tile whose first weight row is g0: the up
  // half from g0, a gated kernel's gate half N/2 rows further; rows past the last expert are
  // clamped (their outputs are never stored).
  __device__ __forceinline__ static int64_t WeightRow(int64_t g0, int r, int n,
                                                      int64_t weight_rows) {
    const int64_t g = kGated && r >= kWRows ? g0 + n / 2 + (r - kWRows) : g0 + r;
    return g < weight_rows ? g : weight_rows - 1;
  }

  // The converters (ct = 0 .. kConverters - 1: warps 1-3 of the producer warpgroup and a
  // warpgroup of their own): per tile one pass over the scale bytes of its weight rows,
  // then per stage the weights decoded into an e4m3 panel. An item is one 32-element block
  // of one weight row; converter ct takes block ct % 4 of rows ct / 4 + kStep i, so that it
  // keeps each row's scale pointer and ref in registers for the tile and reads the scale
  // bytes of the next stage while this one is decoded. (Measured: with only the three
  // warps, and the tokens' scales converted here too, the converters were the bottleneck
  // at about 700 instructions per warp and stage; docs/kernels.md.) Synchronisation: per
  // tile, named barrier 3 among the converters (ConverterSync, ConverterAny); per stage,
  // waits on `pfull` (the packed slot landed) and `empty` (not on `full`: the panel does
  // not need the activations), arrives on `conv`; per packed slot, arrives on `pempty`.
  __device__ __forceinline__ static void Convert(const Cta& c, int ct) {
    const MoeGemmParams& p = c.pv.g;
    const int kb = p.k / 32;
    const int j = ct % 4, r0 = ct / 4;
    const uint8_t* b_scale = static_cast<const uint8_t*>(p.b_scale);
    const int64_t weight_rows = static_cast<int64_t>(p.num_experts) * p.n;
    int* ref_s = reinterpret_cast<int*>(c.smem + L.ref_offset);  // per weight row of the tile
    StageRing<ST> ring;
    StageRing<kFp4Fp8PackedSlots> slot;
    for (int64_t tile = blockIdx.x; tile < c.tiles; tile += gridDim.x) {
      const MoeTile t = TileAt(tile, c.m_tiles, c.n_tiles, p.num_experts, TM, c.off, c.pre);
      const int64_t g0 = static_cast<int64_t>(t.e) * p.n + t.n_tile * kWRows;
      auto scale_row = [&](int r) { return b_scale + WeightRow(g0, r, p.n, weight_rows) * kb; };
      const bool uniform = TileMode(scale_row, kb, ct, ref_s);
      // Gated kernels: each item's scale row chosen between the up and the gate half once
      // per tile (chosen per k-tile, as scale_row does, it cost them 10-15% of their time;
      // measured).
      int item_d[kItems];
      if constexpr (kGated) {
#pragma unroll
        for (int i = 0; i < kItems; ++i) item_d[i] = ItemRow(r0 + i * kStep, p.n, g0, weight_rows);
      }
      // The scale bytes of stage kt, block 4 kt + j of each item, one per register: packed
      // (byte i of a 64-bit word) only a stage later, when the loads have landed, since a
      // shift right after the load would wait for it.
      auto load_scales = [&](int kt, uint32_t (&b)[kItems]) {
        const int blk = kt * 4 + j;
#pragma unroll
        for (int i = 0; i < kItems; ++i) {
          if constexpr (kGated) {
            b[i] = r0 + i * kStep < TN && blk < kb ? __ldg(b_scale + (g0 + item_d[i]) * kb + blk)
                                                   : 0u;
          } else {
            b[i] = r0 + i * kStep < TN && blk < kb ? __ldg(scale_row(r0 + i * kStep) + blk) : 0u;
          }
        }
      };
      auto pack = [](const uint32_t (&b)[kItems]) {
        uint64_t w = 0;
#pragma unroll
        for (int i = 0; i < kItems; ++i) w |= static_cast<uint64_t>(b[i]) << (8 * i);
        return w;
      };
      // The k-tile that prefetches the next tile's scale rows (none after the last tile):
      // decided once per tile, since the 64-bit tile comparison per k-tile reloaded a
      // spilled register every k-tile (ncu: a long-scoreboard stall the converters'
      // largest after their packed-slot wait).
      const int prefetch_kt = tile + gridDim.x < c.tiles ? max(c.num_kt - 3, 0) : -1;
      uint32_t next[kItems];
      load_scales(0, next);
      uint64_t scales = pack(next);

      for (int kt = 0; kt < c.num_kt; ++kt) {
        if (kt + 1 < c.num_kt) load_scales(kt + 1, next);
        // The packed slot holds k-tiles kt & ~1 and its odd successor: this k-tile is its
        // half kt % 2, 16-byte chunks 4 (kt % 2) .. + 3 of each 128-byte row.
        MbarWait(c.pfull_bar + 8 * slot.s, slot.phase);
        // The consumers are done with the stage (its empty barrier, as the producer waits
        // on it): the decoded panel does not wait for the stage's activations to land.
        MbarWait(c.empty_bar + 8 * ring.s, ring.phase ^ 1);
        uint8_t* st = c.smem + ring.s * L.stage_bytes;
        const uint32_t stage = c.smem_base + ring.s * L.stage_bytes;
        const uint32_t packed = c.smem_base + L.packed_offset + slot.s * L.packed_bytes;
        DecodeItems(packed, 4 * (kt % 2) + j, stage, st, ct, scales, uniform, ref_s);
        if (kt == c.num_kt - 1) ColumnScales(st, ct, uniform, ref_s);
        if (kt == prefetch_kt) PrefetchScaleRows(c, tile + gridDim.x, ct, kb, weight_rows);
        if (ct == 0) *reinterpret_cast<int*>(st + L.mode_offset) = uniform ? 1 : 0;
        FenceProxyAsync();  // the decoded panel is read by wgmma
        MbarArrive(c.conv_bar + 8 * ring.s);
        ring.Advance();
        if (kt % 2 == 1 || kt == c.num_kt - 1) {
          MbarArrive(c.pempty_bar + 8 * slot.s);  // this converter is done with the slot
          slot.Advance();
        }
        scales = pack(next);
      }
    }
  }

  // A gated kernel's scale row of tile row r, as rows past the tile's first weight row g0:
  // WeightRow's mapping written out in 32 bits (through its 64-bit form the converters ran
  // 1-4% slower; measured).
  __device__ __forceinline__ static int ItemRow(int r, int n, int64_t g0, int64_t weight_rows) {
    r = min(r, TN - 1);
    const int d = r >= kWRows ? n / 2 + (r - kWRows) : r;
    return g0 + d >= weight_rows ? static_cast<int>(weight_rows - 1 - g0) : d;
  }

  // The tile's last stage carries each weight column's factor for the consumers'
  // ColumnFactors: in the uniform mode 2^(ref - 133) (the row's largest scale and the 2^6
  // of the fold), else 1 (the general loop applies the block scales itself).
  __device__ __forceinline__ static void ColumnScales(uint8_t* st, int ct, bool uniform,
                                                      const int* ref_s) {
    for (int r = ct; r < TN; r += kConverters) {
      reinterpret_cast<float*>(st + L.col_offset)[r] = uniform ? Pow2(ref_s[r] - 133) : 1.0f;
    }
  }

  // Converter ct's part of a tile's one pass over its weight rows' scale bytes (scale_row(r):
  // row r's): the largest scale of each of its rows into ref_s, and whether every row of
  // the tile spans at most kMaxSpan binades (the uniform mode). Named barrier 3 before (every
  // converter is done with the previous tile's refs) and as the mode's reduction (ref_s[]
  // published to every converter).
  template <typename ScaleRow>
  __device__ __forceinline__ static bool TileMode(const ScaleRow& scale_row, int kb, int ct,
                                                  int* ref_s) {
    ConverterSync<kConverters>();
    bool bad = false;
    for (int r = ct; r < TN; r += kConverters) {
      int lo = 255, hi = 0;
      RowScaleRange(scale_row(r), kb, &lo, &hi);
      ref_s[r] = hi;
      bad |= hi - lo > kMaxSpan || hi == 255;
    }
    return !ConverterAny<kConverters>(bad);
  }

  // Converter ct's items of one stage: block ct % 4 (16-byte chunk `chunk` of the packed
  // rows at `packed`) of rows ct / 4 + kStep i, decoded into the stage's e4m3 panel
  // (`stage`; st its generic address) with their scale bytes (`scales`, byte i per item)
  // folded in (uniform) or, in the general loop, stored as the panel's weight scales.
  __device__ __forceinline__ static void DecodeItems(uint32_t packed, int chunk, uint32_t stage,
                                                     uint8_t* st, int ct, uint64_t scales,
                                                     bool uniform, const int* ref_s) {
    const int j = ct % 4, r0 = ct / 4;
    // Unrolled: the items' loads and decodes overlap (at 80 registers this spilled, and
    // the loop was kept rolled).
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int r = r0 + i * kStep;
      if (r >= TN) break;
      const int sw = static_cast<int>((scales >> (8 * i)) & 0xFFu);
      // Blocks past K hold zeros (TMA fill): any table decodes them to 0.
      const E4m3Table tab = TableFor(uniform ? sw - ref_s[r] + 6 : 6);
      const uint4 q = LdShared128(packed + r * 128 + ((chunk ^ (r & 7)) << 4));
      const uint2 d0 = DecodeE2m1ToE4m3x8(q.x, tab), d1 = DecodeE2m1ToE4m3x8(q.y, tab);
      const uint2 d2 = DecodeE2m1ToE4m3x8(q.z, tab), d3 = DecodeE2m1ToE4m3x8(q.w, tab);
      StShared128(stage + L.dec_offset + SwizzledChunk(TN, r, 2 * j),
                  make_uint4(d0.x, d0.y, d1.x, d1.y));
      StShared128(stage + L.dec_offset + SwizzledChunk(TN, r, 2 * j + 1),
                  make_uint4(d2.x, d2.y, d3.x, d3.y));
      if (!uniform) {
        // 2^(scale - 127) / 2^6: the decoded elements carry 2^6.
        reinterpret_cast<float*>(st + L.wscale_offset)[j * TN + r] =
            Ue8m0ToFloat(sw) * 0.015625f;
      }
    }
  }

  // The next tile's (`tile`) scale rows of converter ct's rows into L2, so that its pass
  // over them (TileMode) does not wait for memory.
  __device__ __forceinline__ static void PrefetchScaleRows(const Cta& c, int64_t tile, int ct,
                                                           int kb, int64_t weight_rows) {
    const MoeGemmParams& p = c.pv.g;
    const uint8_t* b_scale = static_cast<const uint8_t*>(p.b_scale);
    const MoeTile nt = TileAt(tile, c.m_tiles, c.n_tiles, p.num_experts, TM, c.off, c.pre);
    const int64_t ng0 = static_cast<int64_t>(nt.e) * p.n + nt.n_tile * kWRows;
    for (int r = ct; r < TN; r += kConverters) {
      const uint8_t* row = b_scale + WeightRow(ng0, r, p.n, weight_rows) * kb;
      for (int o = 0; o < kb + 127; o += 128) {
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + min(o, kb - 1)));
      }
    }
  }

  // The smallest and largest of a row's kb scale bytes, read as aligned words (scale rows
  // need no alignment), eight loads in flight, bytes compared four at a time. A word that
  // starts at or past the row's end is not read: a read never goes more than 3 bytes past
  // the row.
  __device__ __forceinline__ static void RowScaleRange(const uint8_t* row, int kb, int* lo,
                                                       int* hi) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(row);
    const uint32_t* wp = reinterpret_cast<const uint32_t*>(addr & ~uintptr_t{3});
    const int lead = static_cast<int>(addr & 3);
    const int words = (lead + kb + 3) / 4;
    const int tail = lead + kb - 4 * (words - 1);  // valid bytes of the last word, 1..4
    uint32_t mn4 = 0xFFFFFFFFu, mx4 = 0;
    for (int i0 = 0; i0 < words; i0 += 8) {
      uint32_t w[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) w[i] = i0 + i < words ? __ldg(wp + i0 + i) : 0u;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int k = i0 + i;
        if (k >= words) break;
        uint32_t valid = 0xFFFFFFFFu;
        if (k == 0) valid <<= 8 * lead;
        if (k == words - 1) valid &= 0xFFFFFFFFu >> (8 * (4 - tail));
        mx4 = __vmaxu4(mx4, w[i] & valid);
        mn4 = __vminu4(mn4, w[i] | ~valid);
      }
    }
    int mn = *lo, mx = *hi;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      mn = min(mn, static_cast<int>((mn4 >> (8 * b)) & 0xFFu));
      mx = max(mx, static_cast<int>((mx4 >> (8 * b)) & 0xFFu));
    }
    *lo = mn;
    *hi = mx;
  }
};

}  // namespace
}  // namespace cubist::moe

using MoeFp4Fp8Kernel =
    cubist::moe::MoeGemmFp4Fp8<cubist::moe::MOE_ACT, MOE_TM, MOE_TN, MOE_STAGES>;

extern "C" __global__ void __launch_bounds__(MoeFp4Fp8Kernel::kThreads, 1)
    MOE_NAME(const __grid_constant__ cubist::moe::MoeGemmParamsV2 p) {
  MoeFp4Fp8Kernel::Run(p);
}
