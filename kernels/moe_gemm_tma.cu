// The moe_gemm kernels of ABI version 2 for sm_90a: TMA loads, a warp-specialized
// mbarrier pipeline and a persistent tile scheduler. One kernel per cubin, built by
// scripts/build-artifacts with
//   -DMOE_FMT=kBf16 -DMOE_ACT=kSwiglu -DMOE_TM=128 -DMOE_TN=256 -DMOE_STAGES=4
//   -DMOE_NAME=moe_gemm_tma_bf16_bf16_swiglu_m128n256k64
// (and -DMOE_OUT=kFp8 for the e4m3-output variants, named *_ofp8, version 4)
// and -gencode=arch=compute_90a,code=sm_90a. Contract: kernels/moe_gemm_abi.h (version
// 2: MoeGemmParamsV2, MoeGemmPersistentGridFor); shared memory: MakeTmaLayout in
// kernels/moe_gemm_layout.h; docs/kernels.md explains the design and the measurements.
//
// Roles. Warpgroup 0 is the producer: one thread walks this CTA's tiles and, for each
// k-tile, waits until a stage is free (its `empty` mbarrier), then issues the TMA copies of
// A's and B's k-tile into it, completing on the stage's `full` mbarrier. Warpgroups
// 1..tile_m/64 are consumers, each owning 64 rows of the tile and all tile_n columns in
// registers: wait `full`, issue wgmma on the stage, release it once the wgmma that read it
// retired, and after the last k-tile apply the activation and store bf16 (or e4m3) to
// `out`. While consumers run the epilogue the producer already fills stages with the next
// tile.
//
// Scheduling. Each CTA reads offsets once into shared memory and builds the prefix sum of
// per-expert M tiles; tile i (blockIdx.x, blockIdx.x + gridDim.x, ...) maps to (M tile,
// N tile) in groups of kMoeGemmGroupM M tiles, and an M tile to its expert by binary
// search in the prefix sums.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_block_split.h"
#include "kernels/moe_gemm_device.cuh"
#include "kernels/moe_gemm_layout.h"
#include "kernels/moe_gemm_tma_common.cuh"
#include "kernels/wgmma_ops.cuh"

#if !defined(MOE_FMT) || !defined(MOE_ACT) || !defined(MOE_TM) || !defined(MOE_TN) || \
    !defined(MOE_STAGES) || !defined(MOE_NAME)
#error "define MOE_FMT MOE_ACT MOE_TM MOE_TN MOE_STAGES MOE_NAME"
#endif
#ifndef MOE_CLUSTER
#define MOE_CLUSTER 1  // CTAs per cluster along M (1 or 2)
#endif
#ifndef MOE_OUT
#define MOE_OUT kBf16  // the output format: kBf16, or kFp8 (e4m3, parameter struct version 4)
#endif
#ifndef MOE_GATHER_A
#define MOE_GATHER_A 0  // 1: A's rows through a_row_map (parameter struct version 5)
#endif

namespace cubist::moe {
namespace {

// ---------------------------------------------------------------------------------

template <MoeFormat F, MoeActivation ACT, int TM, int TN, int ST, int CL, MoeFormat OUT = kBf16,
          bool GA = false>
struct MoeGemmTma {
  static_assert(CL == 1 || CL == 2, "clusters of 1 or 2 CTAs along M");
  // The gathering producer (ProduceGathered) serves bf16 A in single CTAs: the layer's
  // quantized pairs gather on the way into their quantize kernel instead.
  static_assert(!GA || (F == kBf16 && CL == 1 && OUT == kBf16 && TM % 32 == 0 && TM <= 128),
                "A gathered: bf16, no cluster, bf16 output, 32 to 128 rows in 32-row steps");
  static_assert(OUT == kBf16 || (OUT == kFp8 && (IsGated(ACT) ? TN / 2 : TN) % 16 == 0),
                "e4m3 output in whole 16-column pieces per tile");
  static constexpr MoeGemmTmaLayout L = MakeTmaLayout(F, F, TM, TN, ST);
  static_assert(L.error == nullptr, "invalid moe_gemm_tma configuration (moe_gemm_layout.h)");
  static constexpr int kThreads = L.threads;
  static constexpr int kConsumers = L.consumers;
  static constexpr bool kFp8 = L.fp8_mma;
  static constexpr bool kGated = IsGated(ACT);
  using Mma = Wgmma<kFp8 ? WgmmaKind::kE4m3 : WgmmaKind::kBf16, TN>;
  static constexpr int kRegs = Mma::kRegs;
  static constexpr int kBoxElems = kMoeGemmTmaBoxBytes / (kFp8 ? 1 : 2);  // K per k-tile
  static constexpr int kBRows = MoeGemmTmaBRows(TN, ACT);
  static constexpr uint32_t kStageTx = static_cast<uint32_t>(L.stage_bytes);
  // A gathered: only B comes by TMA (both halves when gated: tile_n rows either way).
  static constexpr uint32_t kBStageTx = static_cast<uint32_t>(L.b_stage_bytes);
  // A gathered: the producer warps copying it, 32 rows each (all four for 128-row tiles).
  static constexpr int kGatherWarps = TM / 32;
  static_assert(L.stage_bytes == L.a_stage_bytes + L.b_stage_bytes, "a stage is A then B");
  // Two consumers (384 threads, at most 168 registers each at entry) move registers from
  // the producer to the consumers; one consumer fits its accumulators without that.
  static constexpr bool kSetMaxNreg = kConsumers == 2;
  // The gathering producer's warps issue 8 copies a stage each with their addresses: with
  // 40 registers ptxas spilled 16-24 bytes of it; 56 spill nothing and leave the consumers
  // 224 (2 x 224 + 56 = 3 x 168), which every epilogue fits but GeGLU's (erf) in 128x256
  // tiles, 16 bytes (its twin at 232 spills none).
  static constexpr int kProducerRegs = GA ? 56 : L.producer_regs;
  static constexpr int kConsumerRegs = GA ? 224 : L.consumer_regs;
  static_assert(!kSetMaxNreg || SetMaxNRegFits(L.threads, kConsumers, kConsumerRegs,
                                               kProducerRegs), "register split");
  // Clusters of two CTAs (CL = 2) take adjacent M tiles of one expert and the same N tile:
  // each loads its own A and half of B, multicast to both, so B crosses from L2 once per
  // pair. A stage is then free only when the consumers of both CTAs have released it.
  static constexpr int kBShare = kBRows / CL;  // B rows this CTA loads per box

  using Tile = MoeTile;

  // What both roles of a CTA share: the parameters, shared memory and the pipeline's
  // barriers, the scheduler's offsets and prefix sums, and the tile space
  // (PipelinePrologue).
  struct Cta {
    const MoeGemmParamsV2& pv;
    int num_experts;
    uint8_t* smem;
    uint32_t smem_base, full_bar, empty_bar;  // a stage's barriers at + 8 * stage
    const int* off;
    const int* pre;
    int64_t m_tiles, n_tiles, tiles;
    int num_kt;
    uint32_t rank;  // in the cluster (0 without one)
  };

  __device__ static void Run(const MoeGemmParamsV2& pv) {
    const MoeGemmParams& p = pv.g;
    extern __shared__ uint8_t smem_raw[];
    uint8_t* smem = reinterpret_cast<uint8_t*>(
        (reinterpret_cast<uintptr_t>(smem_raw) + kSmemAlign - 1) & ~uintptr_t{kSmemAlign - 1});
    const uint32_t smem_base = SmemAddr(smem);
    const uint32_t full_bar = smem_base + L.barrier_offset;  // + 8 * stage
    const uint32_t empty_bar = full_bar + 8 * ST;
    int* off = reinterpret_cast<int*>(smem + L.sched_offset);
    int* pre = off + kMoeGemmTmaMaxExperts + 1;
    const int E = p.num_experts;
    // The host refuses larger E (MoeGemmCheck); a kernel launched anyway writes nothing.
    if (E < 1 || E > kMoeGemmTmaMaxExperts) return;

    // Clusters schedule pairs of M tiles (TM * CL rows); the CTA of rank r takes the r-th.
    // Settled inputs: single CTAs issue their first tile's B for the first stages before
    // the wait for the previous kernel (PipelinePrologue); Produce then adds A. (A cluster
    // peer's barriers are not known to be initialised before ClusterSync.)
    auto pre_wait = [&](int64_t m_tiles) {
      if constexpr (CL == 1 && !GA) PreIssueB(pv, m_tiles, off, pre, full_bar, smem_base);
    };
    const int64_t m_tiles = PipelinePrologue<ST>(pv, full_bar, empty_bar, kConsumers * CL,
                                                 TM * CL, off, pre,
                                                 GA ? 1 + 32 * kGatherWarps : 1, pre_wait);
    const uint32_t rank = CL > 1 ? ClusterRank() : 0;
    // The peer's barriers are initialised before any multicast or remote arrival.
    if constexpr (CL > 1) ClusterSync();
    const int64_t n_tiles = MoeGemmNTiles(p.n, ACT, TN);
    const int64_t tiles = m_tiles * n_tiles;
    const int num_kt = (p.k + kBoxElems - 1) / kBoxElems;
    const Cta c{pv,  E,       smem,    smem_base, full_bar, empty_bar, off,
                pre, m_tiles, n_tiles, tiles,     num_kt,   rank};
    const int wg = threadIdx.x / 128;
    if (wg == 0) {
      if constexpr (GA) {
        ProduceGathered(c);
      } else {
        Produce(c);
      }
      return;
    }
    Consume(c, wg - 1);
  }

  // Settled inputs (PipelinePrologue's pre_wait, thread 0): B of the first tile's first
  // stages, their bytes expected without an arrival. Not inlined: inlined, its registers
  // made ptxas spill the consumers' tile bounds (fp8 128x128, 20 bytes).
  __device__ __noinline__ static void PreIssueB(const MoeGemmParamsV2& pv, int64_t m_tiles,
                                                const int* off, const int* pre,
                                                uint32_t full_bar, uint32_t smem_base) {
    const MoeGemmParams& p = pv.g;
    PreIssueFirstTile<ST>(p, m_tiles, MoeGemmNTiles(p.n, ACT, TN), TM, off, pre,
                          (p.k + kBoxElems - 1) / kBoxElems, full_bar, kBStageTx,
                          [&](const Tile& t, int kt, uint32_t full) {
                            IssueB(pv, t.e * p.n + t.n_tile * kBRows, kt, full,
                                   smem_base + kt * L.stage_bytes + L.a_stage_bytes);
                          });
  }

  // B's rows of k-tile kt for a single CTA (both halves when gated: the gate half N/2
  // rows further down the expert's B).
  __device__ __forceinline__ static void IssueB(const MoeGemmParamsV2& pv, int b_row, int kt,
                                                uint32_t full, uint32_t b_dst) {
    TmaLoad2d(b_dst, &pv.b_map, kt * kBoxElems, b_row, full);
    if constexpr (kGated) {
      TmaLoad2d(b_dst + kBRows * kMoeGemmTmaBoxBytes, &pv.b_map, kt * kBoxElems,
                b_row + pv.g.n / 2, full);
    }
  }

  // The producer warpgroup: one thread issues every stage's TMA loads (A's rows, B's rows
  // or, in a cluster, this CTA's share of them multicast to both); the others leave.
  __device__ __forceinline__ static void Produce(const Cta& c) {
    const MoeGemmParams& p = c.pv.g;
    if constexpr (kSetMaxNreg) SetMaxRegsDec<kProducerRegs>();
    if (threadIdx.x != 0) {
      // No CTA leaves while its peer may still multicast into it or arrive on it.
      if constexpr (CL > 1) ClusterSync();
      return;
    }
    // Settled inputs: the first tile's first stages have B in flight (Run's pre_wait).
    const bool settled = CL == 1 && SettledInputs(p);
    StageRing<ST> ring;
    for (int64_t tile = blockIdx.x / CL; tile < c.tiles; tile += gridDim.x / CL) {
      Tile t = TileAt(tile, c.m_tiles, c.n_tiles, c.num_experts, TM * CL, c.off, c.pre);
      t.row_begin += c.rank * TM;
      PrefetchBiasL2<ACT, TN>(p, t.e, t.n_tile);
      const int b_row = t.e * p.n + t.n_tile * kBRows;
      for (int kt = 0; kt < c.num_kt; ++kt) {
        // A fresh barrier's preceding phase counts as complete: the first pass is free.
        MbarWait(c.empty_bar + 8 * ring.s, ring.phase ^ 1);
        const uint32_t full = c.full_bar + 8 * ring.s;
        const uint32_t a_dst = c.smem_base + ring.s * L.stage_bytes;
        const uint32_t b_dst = a_dst + L.a_stage_bytes;
        const bool b_issued = settled && tile == blockIdx.x && kt < ST;
        MbarArriveExpectTx(full, b_issued ? kStageTx - kBStageTx : kStageTx);
        TmaLoad2d(a_dst, &c.pv.a_map, kt * kBoxElems, t.row_begin, full);
        if constexpr (CL == 1) {
          if (!b_issued) IssueB(c.pv, b_row, kt, full, b_dst);
        } else {
          const uint32_t share = c.rank * kBShare;
          TmaLoad2dMulticast(b_dst + share * kMoeGemmTmaBoxBytes, &c.pv.b_map, kt * kBoxElems,
                             b_row + share, full, 0x3);
          if constexpr (kGated) {
            TmaLoad2dMulticast(b_dst + (kBRows + share) * kMoeGemmTmaBoxBytes, &c.pv.b_map,
                               kt * kBoxElems, b_row + p.n / 2 + share, full, 0x3);
          }
        }
        ring.Advance();
      }
    }
    if constexpr (CL > 1) ClusterSync();
  }

  // The producer of kernels that gather A (version 5): its warps copy each stage's A rows
  // from where a_row_map puts them, 16 bytes a cp.async, into the layout the TMA box would
  // have (128-byte swizzle: chunk c of row r at r x 128 + (c ^ r % 8) x 16), warp w rows
  // 32 w .. 32 w + 31, and thread 0 issues B's TMA as Produce does. Hopper's TMA has no
  // gather, and a TMA per row would take 128-byte boxes. Eight lanes copy one row's 128
  // bytes, so each instruction reads four whole lines; each lane reads its row's map
  // entry once per tile and passes it by shuffle. One warp for all 128 rows, lines whole
  // or not, took twice the TMA twin's time at prefill (its copies in flight could not
  // cover the latency of the L2); a warp per 32 rows takes 1.01-1.06x its time at decode
  // and 4,096 Qwen3 tokens, 1.15-1.21x on larger prefill (docs/kernels.md). A stage's full
  // barrier takes 1 + 32 x kGatherWarps arrivals: thread 0's with B's byte count, and each
  // lane's asynchronous one (cp.async.mbarrier.arrive.noinc), made when its copies of the
  // stage have landed, so the producer never waits for its own copies and every free stage
  // is in flight. cp.async writes through the generic proxy: the consumers fence them for
  // wgmma (the async proxy) once the barrier says they landed (Bf16Loop). Rows past the
  // expert's end, negative entries and quotients past a_rows read nothing and land as
  // zeros; such rows' results are never stored.
  __device__ __forceinline__ static void ProduceGathered(const Cta& c) {
    const MoeGemmParams& p = c.pv.g;
    if constexpr (kSetMaxNreg) SetMaxRegsDec<kProducerRegs>();
    if (threadIdx.x >= kGatherWarps * 32) return;
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;  // copies rows 32 warp .. 32 warp + 31
    const int ch = lane % 8;            // the 16-byte chunk this lane copies of each row
    const char* a = static_cast<const char*>(p.a);
    const int64_t row_bytes = static_cast<int64_t>(p.k) * 2;
    StageRing<ST> ring;
    for (int64_t tile = blockIdx.x; tile < c.tiles; tile += gridDim.x) {
      const Tile t = TileAt(tile, c.m_tiles, c.n_tiles, c.num_experts, TM, c.off, c.pre);
      const bool b_lane = threadIdx.x == 0;
      if (b_lane) PrefetchBiasL2<ACT, TN>(p, t.e, t.n_tile);
      const int b_row = t.e * p.n + t.n_tile * kBRows;
      // A's row of row 32 warp + lane of the tile, or -1: none.
      const int r0 = t.row_begin + 32 * warp + lane;
      const int m = r0 < t.row_end ? __ldg(p.a_row_map + r0) : -1;
      const int q0 = m >= 0 ? m / p.a_row_divisor : -1;
      const int src = q0 < p.a_rows ? q0 : -1;
      for (int kt = 0; kt < c.num_kt; ++kt) {
        MbarWait(c.empty_bar + 8 * ring.s, ring.phase ^ 1);
        const uint32_t full = c.full_bar + 8 * ring.s;
        const uint32_t a_dst = c.smem_base + ring.s * L.stage_bytes;
        if (b_lane) {
          const uint32_t b_dst = a_dst + L.a_stage_bytes;
          MbarArriveExpectTx(full, kBStageTx);
          TmaLoad2d(b_dst, &c.pv.b_map, kt * kBoxElems, b_row, full);
          if constexpr (kGated) {
            TmaLoad2d(b_dst + kBRows * kMoeGemmTmaBoxBytes, &c.pv.b_map, kt * kBoxElems,
                      b_row + p.n / 2, full);
          }
        }
        const int col = kt * kBoxElems + ch * 8;  // K is a multiple of 8: whole chunks
        const bool in_k = col < p.k;
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // rows 32 warp + 4 i .. + 3, lane / 8 of them
          const int r = 32 * warp + 4 * i + lane / 8;
          const int q = __shfl_sync(0xFFFFFFFFu, src, 4 * i + lane / 8);
          const bool in = in_k && q >= 0;
          CpAsync16(a_dst + r * kMoeGemmTmaBoxBytes + ((ch ^ (r & 7)) << 4),
                    in ? a + (static_cast<int64_t>(q) * row_bytes + 2 * col) : a,
                    in ? 16u : 0u);
        }
        CpAsyncArriveNoinc(full);
        ring.Advance();
      }
    }
  }

  // Consumer warpgroup ci (rows ci*64 .. ci*64+63 of each tile): the format's main loop
  // into fp32 accumulators, then the epilogue. The main loops take the CTA's values as
  // scalars, not the Cta, and their partials from here: either way round changes the
  // kernels' code (checked on the cubins' bytes), which this split leaves as it was.
  __device__ __forceinline__ static void Consume(const Cta& c, int ci) {
    const MoeGemmParams& p = c.pv.g;
    const uint32_t smem_base = c.smem_base, full_bar = c.full_bar, empty_bar = c.empty_bar;
    const int num_kt = c.num_kt;
    const uint32_t rank = c.rank;
    if constexpr (kSetMaxNreg) SetMaxRegsInc<kConsumerRegs>();
    const bool signals = threadIdx.x % 128 == 0;  // arrives on `empty` for the warpgroup
    const uint32_t a_off = ci * 64 * kMoeGemmTmaBoxBytes;
    StageRing<ST> pipe;  // persists across tiles
    float acc[kRegs];
    // A stage is released to this CTA's producer and, in a cluster, to the peer's, whose
    // multicast also writes it.
    auto release = [=](int stage) {
      MbarArrive(empty_bar + 8 * stage);
      if constexpr (CL > 1) MbarArriveCluster(empty_bar + 8 * stage, rank ^ 1);
    };
    for (int64_t tile = blockIdx.x / CL; tile < c.tiles; tile += gridDim.x / CL) {
      Tile t = TileAt(tile, c.m_tiles, c.n_tiles, c.num_experts, TM * CL, c.off, c.pre);
      t.row_begin += rank * TM;  // rows past the expert's end are computed, never stored
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] = 0.0f;
      if constexpr (!kFp8) {
        Bf16Loop(smem_base, a_off, full_bar, signals, release, pipe, num_kt, acc);
      } else if constexpr (F == kFp8Block && L.smem_scales) {
        float part[kRegs];
        // Each B half's groups take its lo block's scale before the half's split, its hi
        // block's after (kernels/moe_gemm_block_split.h). Splits on whole units of groups
        // (every identity tile; gated ones where N/2 is a multiple of 32) take the loop
        // that multiplies by lo and hi once per k-tile, the others the one that multiplies
        // per group. (Template loops per split pair, 10 of them, left 24 bytes of the
        // tile loop's values spilled in the gated kernels.)
        const int split0 = MoeGemmHalfSplit(p.n, ACT, TN, t.n_tile, 0);
        const int split1 = kGated ? MoeGemmHalfSplit(p.n, ACT, TN, t.n_tile, 1) : 0;
        // (Identity tiles start at n_tile * 192, a multiple of their 64-row unit.)
        if (!kGated || MoeGemmSplitsOnUnits(p.n, ACT, TN, t.n_tile)) {
          StagedScaleLoop<true>(p, t, ci, smem_base, a_off, full_bar, signals, release, pipe,
                                num_kt, acc, part, split0, split1);
        } else {
          StagedScaleLoop<false>(p, t, ci, smem_base, a_off, full_bar, signals, release, pipe,
                                 num_kt, acc, part, split0, split1);
        }
      } else if constexpr (F == kFp8Block) {
        // Tiles whose B halves each lie in one 128-row scale block (N a multiple of the
        // tile's B rows: every tile of the benchmarked shapes) take the uniform loop.
        const uint32_t hi_mask = HiBlockMask(p, t);
        if (hi_mask == 0) {
          BlockLoop<true>(p, t, ci, hi_mask, smem_base, a_off, full_bar, signals, release, pipe,
                          num_kt, acc);
        } else {
          BlockLoop<false>(p, t, ci, hi_mask, smem_base, a_off, full_bar, signals, release, pipe,
                           num_kt, acc);
        }
      } else if constexpr (TN > 128) {
        float part[kRegs];
        Fp8WideLoop(smem_base, a_off, full_bar, signals, release, pipe, num_kt, acc, part);
      } else {
        float part0[kRegs], part1[kRegs];
        if constexpr (kConsumers == 1) {
          Fp8PairedLoop(smem_base, a_off, full_bar, signals, release, pipe, num_kt, acc, part0,
                        part1);
        } else {
          Fp8AlternatingLoop(smem_base, a_off, full_bar, signals, release, pipe, num_kt, acc, part0,
                             part1);
        }
      }
      // Tiles with fewer rows than the consumer's 64 (decode steps, an expert's last tile)
      // store directly: staging would move all 64 rows through shared memory.
      if (L.staged_epilogue && t.row_end - (t.row_begin + ci * 64) >= 64) {
        StoreStaged<F, ACT, TN, OUT>(
            p, t, ci, acc, c.smem + L.epilogue_offset + ci * kMoeGemmTmaEpilogueBytes);
      } else {
        StoreTile<F, ACT, TN, OUT>(p, t.e, t.row_begin + ci * 64, t.row_end, t.n_tile, acc);
      }
    }
    if constexpr (CL > 1) ClusterSync();
  }

  // bf16: one accumulator; a stage is released once the wgmma after it has been issued and
  // its own has retired (one group in flight).
  template <typename Release>
  __device__ __forceinline__ static void Bf16Loop(uint32_t smem_base, uint32_t a_off,
                                                  uint32_t full_bar, bool signals, Release release,
                                                  StageRing<ST>& pipe, int num_kt,
                                                  float (&acc)[kRegs]) {
    int prev = -1;
    for (int kt = 0; kt < num_kt; ++kt) {
      MbarWait(full_bar + 8 * pipe.s, pipe.phase);
      // A gathered by cp.async (generic proxy) is read by wgmma (async proxy) next.
      if constexpr (GA) FenceProxyAsync();
      Issue(smem_base + pipe.s * L.stage_bytes, a_off, acc, true);
      WgmmaWait<1>();
      FenceRegs(acc);
      if (prev >= 0 && signals) release(prev);
      prev = pipe.s;
      pipe.Advance();
    }
    WgmmaWait<0>();
    FenceRegs(acc);
    if (prev >= 0 && signals) release(prev);
  }

  // fp8 per tensor, 192 columns: an accumulator and one partial of 96 registers fill the
  // consumer's budget (a second partial would spill), so each k-tile's wgmma are waited
  // for before its promotion; the other consumer's wgmma keep the tensor cores busy
  // meanwhile, as in the fp8-block loop.
  template <typename Release>
  __device__ __forceinline__ static void Fp8WideLoop(uint32_t smem_base, uint32_t a_off,
                                                     uint32_t full_bar, bool signals,
                                                     Release release, StageRing<ST>& pipe,
                                                     int num_kt, float (&acc)[kRegs],
                                                     float (&part)[kRegs]) {
    for (int kt = 0; kt < num_kt; ++kt) {
      MbarWait(full_bar + 8 * pipe.s, pipe.phase);
      Issue(smem_base + pipe.s * L.stage_bytes, a_off, part, false);
      WgmmaWait<0>();
      FenceRegs(part);
      if (signals) release(pipe.s);
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] += part[i];
      pipe.Advance();
    }
  }

  // fp8 per tensor: as fp8-block without block scales (the tensor cores' fp8 accumulation
  // keeps fewer bits than fp32), each k-tile into a fresh partial (docs/kernels.md "fp8
  // per tensor"). One consumer: two k-tiles at a time into two partials, so that the first
  // is promoted while the second's wgmma run, and each iteration ends with no wgmma in
  // flight. A wgmma left in flight across the loop's back edge (Fp8AlternatingLoop) makes
  // ptxas serialize every wgmma of the kernel (C7514: a wait after each), and so does one
  // issued under a runtime condition (C7518), so an odd last k-tile runs alone. Measured
  // 1.1-1.3x faster than the alternating loop on 64-row tiles.
  template <typename Release>
  __device__ __forceinline__ static void Fp8PairedLoop(uint32_t smem_base, uint32_t a_off,
                                                       uint32_t full_bar, bool signals,
                                                       Release release, StageRing<ST>& pipe,
                                                       int num_kt, float (&acc)[kRegs],
                                                       float (&part0)[kRegs],
                                                       float (&part1)[kRegs]) {
    // The next stage's k-tile into a fresh partial (returns its stage), and a partial
    // whose wgmma have been waited for: the stage released, the partial added.
    auto issue_next = [&](float (&part)[kRegs]) {
      const int st = pipe.s;
      MbarWait(full_bar + 8 * pipe.s, pipe.phase);
      Issue(smem_base + pipe.s * L.stage_bytes, a_off, part, false);
      pipe.Advance();
      return st;
    };
    auto promote = [&](float (&part)[kRegs], int st) {
      FenceRegs(part);
      if (signals) release(st);
#pragma unroll
      for (int r = 0; r < kRegs; ++r) acc[r] += part[r];
    };
    for (int i = 0; i < num_kt / 2; ++i) {
      const int s0 = issue_next(part0);
      const int s1 = issue_next(part1);
      WgmmaWait<1>();
      promote(part0, s0);
      WgmmaWait<0>();
      promote(part1, s1);
    }
    if (num_kt % 2 != 0) {
      const int s0 = issue_next(part0);
      WgmmaWait<0>();
      promote(part0, s0);
    }
  }

  // fp8 per tensor, two consumers: two partials that alternate over all k-tiles, the wgmma
  // of k-tile kt+1 issued before k-tile kt is promoted. ptxas serializes this loop's wgmma
  // (a wait after each; C7514), but the other consumer's wgmma fill the tensor cores
  // meanwhile, and Fp8PairedLoop measured 0.88-1.16x of this one on 128-row tiles
  // (deepseek-v3 5-12% slower), so these kernels keep it.
  template <typename Release>
  __device__ __forceinline__ static void Fp8AlternatingLoop(uint32_t smem_base, uint32_t a_off,
                                                            uint32_t full_bar, bool signals,
                                                            Release release, StageRing<ST>& pipe,
                                                            int num_kt, float (&acc)[kRegs],
                                                            float (&part0)[kRegs],
                                                            float (&part1)[kRegs]) {
    int s0 = pipe.s;
    MbarWait(full_bar + 8 * pipe.s, pipe.phase);
    Issue(smem_base + pipe.s * L.stage_bytes, a_off, part0, false);
    pipe.Advance();
    for (int kt = 0; kt < num_kt; kt += 2) {
      const int s1 = pipe.s;
      if (kt + 1 < num_kt) {
        MbarWait(full_bar + 8 * pipe.s, pipe.phase);
        Issue(smem_base + pipe.s * L.stage_bytes, a_off, part1, false);
        pipe.Advance();
        WgmmaWait<1>();
      } else {
        WgmmaWait<0>();
      }
      FenceRegs(part0);
      if (signals) release(s0);
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] += part0[i];
      if (kt + 1 >= num_kt) break;
      s0 = pipe.s;
      if (kt + 2 < num_kt) {
        MbarWait(full_bar + 8 * pipe.s, pipe.phase);
        Issue(smem_base + pipe.s * L.stage_bytes, a_off, part0, false);
        pipe.Advance();
        WgmmaWait<1>();
      } else {
        WgmmaWait<0>();
      }
      FenceRegs(part1);
      if (signals) release(s1);
#pragma unroll
      for (int i = 0; i < kRegs; ++i) acc[i] += part1[i];
    }
  }

  // Issues the wgmma of one stage (at `stage`; this consumer's A rows at a_off) into d,
  // as one commit group.
  template <int R>
  __device__ __forceinline__ static void Issue(uint32_t stage, uint32_t a_off, float (&d)[R],
                                               bool accumulate) {
    // The next k-step is 32 bytes further: 2 in the descriptor's address field (addresses
    // >> 4, 14 bits), which cannot carry out of it below 256 KiB of shared memory. Adding
    // to the descriptor, not rebuilding it per k-step, saves about 20 instructions per
    // k-tile.
    const uint64_t da = Desc(stage + a_off);
    const uint64_t db = Desc(stage + L.a_stage_bytes);
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {  // 32 bytes of K per wgmma
      Mma::Mma(d, da + 2 * ks, db + 2 * ks, accumulate || ks > 0 ? 1 : 0);
    }
    WgmmaCommit();
  }

  // The fp8-block main loop: each 128-deep k-tile is summed by the tensor cores into a
  // fresh partial and promoted into fp32 with DeepSeek's block scales, loaded one k-tile
  // ahead. kUniform: each B half lies in one 128-row scale block (hi_mask == 0), so every
  // scale is one load from a pointer computed once per tile (ScaleRows) and the promotion
  // needs no per-group select; the general loop recomputes the scale addresses and selects
  // a block per 8-column group, which measured 1.07-1.3x slower on the same tiles
  // (docs/kernels.md "fp8-block"). One partial: two alternating partials spill (84-104
  // bytes per thread in 128-row tiles), and splitting the partial into two 64-column
  // commit groups, so that one half is promoted while the other runs, measured
  // 1.07-1.18x slower than even the general loop.
  template <bool kUniform, typename Release>
  __device__ __forceinline__ static void BlockLoop(const MoeGemmParams& p, const Tile& t,
                                                   int ci, uint32_t hi_mask, uint32_t smem_base,
                                                   uint32_t a_off, uint32_t full_bar,
                                                   bool signals, Release release,
                                                   StageRing<ST>& pipe, int num_kt,
                                                   float (&acc)[kRegs]) {
    float part[kRegs];
    const ScaleRows rows = ScaleRowsFor(p, t, ci);
    auto load = [&](int kt) {
      return kUniform ? LoadUniformScales(rows, kt) : LoadScales(p, t, ci, kt);
    };
    Scales sc = load(0);
    for (int kt = 0; kt < num_kt; ++kt) {
      MbarWait(full_bar + 8 * pipe.s, pipe.phase);
      Issue(smem_base + pipe.s * L.stage_bytes, a_off, part, false);
      const Scales next = load(kt + 1 < num_kt ? kt + 1 : kt);
      WgmmaWait<0>();
      FenceRegs(part);
      if (signals) release(pipe.s);
      Promote<kUniform>(hi_mask, sc, acc, part);
      sc = next;
      pipe.Advance();
    }
  }
  // The fp8-block main loop of 192-column tiles (L.smem_scales): their accumulator and
  // partial take 192 of the consumer's 232 registers, and BlockLoop's per-thread scales
  // and scale addresses spilled there. Here the scales go through shared memory instead:
  // consumer threads fetch one scale each per k-tile (threads 0-63 the A scale of their
  // row, 64.. B scales; ScaleSource), a k-tile ahead, and store it into the other of two
  // slots once their own promotion is done; a named barrier per k-tile orders those writes
  // before the next promotion's reads and after this one's. k-tile 0's scales are fetched
  // before the loop and stored once its wgmma are issued, so the fetch does not delay them.
  // Each 8-column group of a B half takes the scale of the half's first (lo) or last (hi)
  // 128-row block: lo for the groups before the half's split (split0, split1;
  // kernels/moe_gemm_block_split.h). kUnits: both splits fall on whole units of groups
  // (kUnitGroups), so the slot holds lo and hi of each half and the promotion multiplies
  // this thread's two A scales by them, 4 (identity) or 8 (gated) products per k-tile, and
  // picks per unit of groups which to use (PromoteUnits). Otherwise the slot holds each
  // group's B scale and the promotion multiplies per group (PromoteGroups). Either way the
  // arithmetic is BlockLoop's: each k-tile's partial times (sa x sb), the product in fp32,
  // added into acc in k order.
  template <bool kUnits, typename Release>
  __device__ __forceinline__ static void StagedScaleLoop(
      const MoeGemmParams& p, const Tile& t, int ci, uint32_t smem_base, uint32_t a_off,
      uint32_t full_bar, bool signals, Release release, StageRing<ST>& pipe, int num_kt,
      float (&acc)[kRegs], float (&part)[kRegs], int split0, int split1) {
    constexpr uint32_t kSlot = MoeGemmTmaScaleSlotBytes(TN);
    static_assert(64 + TN / 8 <= 128, "one scale per consumer thread");
    const int tid = threadIdx.x % 128;
    const uint32_t slots = smem_base + L.scale_offset + ci * kMoeGemmTmaScaleSlots * kSlot;
    const bool fetches = tid < 64 + (kUnits ? 2 * kHalves : TN / 8);
    const float* src = ScaleSource<kUnits>(p, t, ci, tid);
    const uint32_t dst = slots + tid * 4;
    // The scale of this thread's first accumulator row; its second is 8 rows further.
    const uint32_t sa = slots + (tid / 32 * 16 + tid % 32 / 4) * 4;
    const float first = fetches ? __ldg(src) : 0.0f;
    // k-tile kt (is_first: k-tile 0, whose slot is written here). The previous tile's
    // last barrier ordered its reads of slot 0 before that write.
    auto k_tile = [&](auto is_first, int kt) {
      const uint32_t cur = (kt & 1) * kSlot;
      const bool ahead = fetches && kt + 1 < num_kt;
      const float next = ahead ? __ldg(src + kt + 1) : 0.0f;
      MbarWait(full_bar + 8 * pipe.s, pipe.phase);
      Issue(smem_base + pipe.s * L.stage_bytes, a_off, part, false);
      if constexpr (decltype(is_first)::value) {
        if (fetches) StSharedF32(dst, first);
        NamedBarrier128(1 + ci);
      }
      WgmmaWait<0>();
      FenceRegs(part);
      if (signals) release(pipe.s);
      if constexpr (kUnits) {
        PromoteUnits(slots + cur, sa + cur, split0, split1, acc, part);
      } else {
        PromoteGroups(slots + cur, sa + cur, acc, part);
      }
      if (ahead) StSharedF32(dst + (kSlot - cur), next);
      NamedBarrier128(1 + ci);
      pipe.Advance();
    };
    k_tile(std::true_type{}, 0);  // MoeGemmCheck refuses K < 1: there is a k-tile 0
    for (int kt = 1; kt < num_kt; ++kt) k_tile(std::false_type{}, kt);
  }
  static constexpr int kHalves = kGated ? 2 : 1;
  static constexpr int kHalfGroups = kBRows / 8;
  static constexpr int kUnitGroups = MoeGemmSplitUnitGroups(TN, ACT);  // 8 or 4 at TN 192
  // The scale row whose k-tile element this consumer thread fetches into the slots:
  // threads 0-63 the A scales of their row (clamped into the tile's rows: rows past the
  // expert's end are computed, never stored); kUnits: thread 64 + 2h the B block of half
  // h's first group (lo), 65 + 2h that of its last (hi); else thread 64 + g the B block of
  // 8-column group g. B blocks as MoeGemmScaleBlockOfGroup gives them; threads past those
  // fetch nothing.
  template <bool kUnits>
  __device__ __forceinline__ static const float* ScaleSource(const MoeGemmParams& p,
                                                             const Tile& t, int ci, int tid) {
    const int kb = (p.k + 127) / 128;
    const int nb = (p.n + 127) / 128;
    if (tid < 64) {
      const int row = min(t.row_begin + ci * 64 + tid, t.row_end - 1);
      return static_cast<const float*>(p.a_scale) + static_cast<int64_t>(row) * kb;
    }
    int g;
    if constexpr (kUnits) {
      const int b = min(tid - 64, 2 * kHalves - 1);
      g = b / 2 * kHalfGroups + (b % 2 == 1 ? kHalfGroups - 1 : 0);
    } else {
      g = min(tid - 64, TN / 8 - 1);
    }
    const int block = MoeGemmScaleBlockOfGroup(p.n, ACT, TN, t.n_tile, g);
    return static_cast<const float*>(p.b_scale) +
           (static_cast<int64_t>(t.e) * nb + block) * kb;
  }
  // Promote with the scales of one slot: sa of this thread's two rows (at sa_addr and 8
  // rows further) and lo, hi of each half (one 16-byte broadcast read). Group g of half h
  // takes lo when g < the half's split, decided per unit of kUnitGroups groups
  // (MoeGemmUnitTakesLo): one select per unit and A row at most.
  __device__ __forceinline__ static void PromoteUnits(uint32_t slot, uint32_t sa_addr,
                                                      int split0, int split1,
                                                      float (&acc)[kRegs],
                                                      float (&part)[kRegs]) {
    const float sa0 = LdSharedF32(sa_addr), sa1 = LdSharedF32(sa_addr + 8 * 4);
    const uint4 v = LdShared128(slot + 64 * 4);
    const float lo[2] = {__uint_as_float(v.x), __uint_as_float(v.z)};
    const float hi[2] = {__uint_as_float(v.y), __uint_as_float(v.w)};
    float lo0[kHalves], lo1[kHalves], hi0[kHalves], hi1[kHalves];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      lo0[h] = sa0 * lo[h];
      lo1[h] = sa1 * lo[h];
      hi0[h] = sa0 * hi[h];
      hi1[h] = sa1 * hi[h];
    }
#pragma unroll
    for (int g = 0; g < TN / 8; ++g) {
      const int h = g / kHalfGroups;
      const bool low = MoeGemmUnitTakesLo(g % kHalfGroups, kUnitGroups, h == 1 ? split1 : split0);
      const float s0 = low ? lo0[h] : hi0[h], s1 = low ? lo1[h] : hi1[h];
      acc[g * 4 + 0] += part[g * 4 + 0] * s0;
      acc[g * 4 + 1] += part[g * 4 + 1] * s0;
      acc[g * 4 + 2] += part[g * 4 + 2] * s1;
      acc[g * 4 + 3] += part[g * 4 + 3] * s1;
    }
  }
  // Promote with the scales of one slot: sa of this thread's two rows, sb of each 8-column
  // group four at a time (one 16-byte broadcast read).
  __device__ __forceinline__ static void PromoteGroups(uint32_t slot, uint32_t sa_addr,
                                                       float (&acc)[kRegs],
                                                       float (&part)[kRegs]) {
    static_assert(TN % 32 == 0, "whole 16-byte reads of group scales");
    const float sa0 = LdSharedF32(sa_addr), sa1 = LdSharedF32(sa_addr + 8 * 4);
#pragma unroll
    for (int q = 0; q < TN / 32; ++q) {
      const uint4 v = LdShared128(slot + 64 * 4 + q * 16);
      const float sb4[4] = {__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z),
                            __uint_as_float(v.w)};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int g = q * 4 + j;
        const float s0 = sa0 * sb4[j], s1 = sa1 * sb4[j];
        acc[g * 4 + 0] += part[g * 4 + 0] * s0;
        acc[g * 4 + 1] += part[g * 4 + 1] * s0;
        acc[g * 4 + 2] += part[g * 4 + 2] * s1;
        acc[g * 4 + 3] += part[g * 4 + 3] * s1;
      }
    }
  }
  // fp8-block scale factors of one k-tile: sa per accumulator row half, and per B half
  // (x0, x1 when gated) the scales of its first (lo) and last (hi) 128-row block
  // (kernels/moe_gemm_block_split.h: a half spans at most two).
  struct Scales {
    float sa[2];
    float sb_lo[2], sb_hi[2];
  };
  __device__ __forceinline__ static Scales LoadScales(const MoeGemmParams& p, const Tile& t,
                                                      int ci, int kt) {
    Scales sc;
    const int kb = (p.k + 127) / 128;
    const int nb = (p.n + 127) / 128;
    const float* as = static_cast<const float*>(p.a_scale);
    const float* bs =
        static_cast<const float*>(p.b_scale) + static_cast<int64_t>(t.e) * nb * kb + kt;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = t.row_begin + ci * 64 + warp * 16 + lane / 4 + 8 * h;
      sc.sa[h] = row < t.row_end ? __ldg(as + static_cast<int64_t>(row) * kb + kt) : 0.0f;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lo = MoeGemmHalfLoBlock(p.n, ACT, TN, t.n_tile, h);
      const int hi = MoeGemmHalfHiBlock(p.n, ACT, TN, t.n_tile, h);
      sc.sb_lo[h] = h == 1 && !kGated ? 1.0f : __ldg(bs + static_cast<int64_t>(lo) * kb);
      sc.sb_hi[h] = h == 1 && !kGated   ? 1.0f
                    : hi == lo          ? sc.sb_lo[h]
                                        : __ldg(bs + static_cast<int64_t>(hi) * kb);
    }
    return sc;
  }
  // Where this thread's scales of every k-tile are, computed once per tile for tiles whose
  // B halves each lie in one 128-row block: the A scale rows of its two accumulator rows
  // (clamped into the tile's rows: rows past the expert's end are computed, never stored)
  // and the B scale row of each B half.
  struct ScaleRows {
    const float* a[2];
    const float* b[2];
  };
  __device__ __forceinline__ static ScaleRows ScaleRowsFor(const MoeGemmParams& p,
                                                           const Tile& t, int ci) {
    ScaleRows r;
    const int kb = (p.k + 127) / 128;
    const int nb = (p.n + 127) / 128;
    const float* as = static_cast<const float*>(p.a_scale);
    const float* bs = static_cast<const float*>(p.b_scale) + static_cast<int64_t>(t.e) * nb * kb;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(t.row_begin + ci * 64 + warp * 16 + lane / 4 + 8 * h, t.row_end - 1);
      r.a[h] = as + static_cast<int64_t>(row) * kb;
      r.b[h] = bs + static_cast<int64_t>(MoeGemmHalfLoBlock(p.n, ACT, TN, t.n_tile, h)) * kb;
    }
    return r;
  }
  __device__ __forceinline__ static Scales LoadUniformScales(const ScaleRows& r, int kt) {
    Scales sc;
    sc.sa[0] = __ldg(r.a[0] + kt);
    sc.sa[1] = __ldg(r.a[1] + kt);
    sc.sb_lo[0] = __ldg(r.b[0] + kt);
    sc.sb_lo[1] = kGated ? __ldg(r.b[1] + kt) : 1.0f;
    sc.sb_hi[0] = sc.sb_lo[0];
    sc.sb_hi[1] = sc.sb_lo[1];
    return sc;
  }
  // Bit g set: 8-column group g takes its B scale from the last block of its half.
  __device__ __forceinline__ static uint32_t HiBlockMask(const MoeGemmParams& p, const Tile& t) {
    uint32_t mask = 0;
#pragma unroll
    for (int g = 0; g < TN / 8; ++g) {
      const int h = kGated && g >= kHalfGroups ? 1 : 0;
      if (MoeGemmScaleBlockOfGroup(p.n, ACT, TN, t.n_tile, g) !=
          MoeGemmHalfLoBlock(p.n, ACT, TN, t.n_tile, h)) {
        mask |= 1u << g;
      }
    }
    return mask;
  }
  template <bool kUniform>
  __device__ __forceinline__ static void Promote(uint32_t hi_mask, const Scales& sc,
                                                 float (&acc)[kRegs], float (&part)[kRegs]) {
#pragma unroll
    for (int g = 0; g < TN / 8; ++g) {
      const int h = kGated && g * 8 >= kBRows ? 1 : 0;
      const float sb = kUniform || !((hi_mask >> g) & 1) ? sc.sb_lo[h] : sc.sb_hi[h];
      const float s0 = sc.sa[0] * sb, s1 = sc.sa[1] * sb;
      acc[g * 4 + 0] += part[g * 4 + 0] * s0;
      acc[g * 4 + 1] += part[g * 4 + 1] * s0;
      acc[g * 4 + 2] += part[g * 4 + 2] * s1;
      acc[g * 4 + 3] += part[g * 4 + 3] * s1;
    }
  }
};

}  // namespace
}  // namespace cubist::moe

using MoeTmaKernel =
    cubist::moe::MoeGemmTma<cubist::moe::MOE_FMT, cubist::moe::MOE_ACT, MOE_TM, MOE_TN,
                            MOE_STAGES, MOE_CLUSTER, cubist::moe::MOE_OUT,
                            MOE_GATHER_A != 0>;

// One CTA per SM caps two-consumer kernels at 168 registers at entry, below the setmaxnreg
// targets as setmaxnreg requires; one-consumer kernels ask for the CTAs per SM their
// shared memory allows.
// Cluster kernels carry their cluster shape, so that a launch without it fails instead of
// running without a peer.
#if MOE_CLUSTER > 1
#define MOE_CLUSTER_DIMS __cluster_dims__(MOE_CLUSTER, 1, 1)
#else
#define MOE_CLUSTER_DIMS
#endif
extern "C" __global__ void MOE_CLUSTER_DIMS __launch_bounds__(MoeTmaKernel::kThreads,
                                                              MoeTmaKernel::L.ctas_per_sm)
    MOE_NAME(const __grid_constant__ cubist::moe::MoeGemmParamsV2 p) {
  MoeTmaKernel::Run(p);
}
