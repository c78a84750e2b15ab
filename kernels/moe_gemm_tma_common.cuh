// Device code of the TMA (ABI version 2) kernels: kernels/moe_gemm_tma.cu (bf16, fp8),
// kernels/moe_gemm_fp4.cu (fp4 weights decoded into wgmma's A registers) and
// kernels/moe_gemm_fp4_fp8.cu (mxfp4 x mxfp8 on fp8 wgmma). mbarrier and TMA wrappers,
// the persistent tile scheduler all of them walk the same way, and the staged epilogue.
// Include only from a .cu file compiled for sm_90a.
#ifndef CUBIST_KERNELS_MOE_GEMM_TMA_COMMON_CUH_
#define CUBIST_KERNELS_MOE_GEMM_TMA_COMMON_CUH_

#include <stdint.h>

#include <type_traits>

#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_device.cuh"
#include "kernels/moe_gemm_layout.h"

namespace cubist::moe {
namespace {

// ---------------------------------------------------------------------------------
// mbarrier and TMA wrappers (shared-memory addresses are 32-bit).

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Raises the phase's expected bytes without arriving: for copies issued before the
// stage's one arrival, which MbarArriveExpectTx then makes with the rest of the bytes.
__device__ __forceinline__ void MbarExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "r"(bytes)
               : "memory");
}
// Waits for the completion of the phase with this parity.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
// 2-D tile copy global -> shared through a tensor map (a __grid_constant__ parameter);
// c0 is the element index along K, c1 the row.
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const MoeTensorMap* map, int32_t c0,
                                          int32_t c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// 16-byte asynchronous copy global -> shared (the gathering producer's A rows): `bytes`
// (0 or 16) are read from src and the rest of the 16 zero-filled, so a row past the
// expert's end or past K reads nothing. Completion is per thread: CpAsyncArriveNoinc.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes)
               : "memory");
}
// Arrives on the mbarrier once every cp.async this thread issued before has landed,
// without counting an extra arrival (.noinc: the barrier's count includes the thread).
__device__ __forceinline__ void CpAsyncArriveNoinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void TmaPrefetchMap(const MoeTensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map))
               : "memory");
}
// 2-D tile copy multicast to the CTAs of the cluster in cta_mask: each receives the box
// at the same shared-memory offset and its own mbarrier (same offset) gets the bytes.
__device__ __forceinline__ void TmaLoad2dMulticast(uint32_t dst, const MoeTensorMap* map,
                                                   int32_t c0, int32_t c1, uint32_t bar,
                                                   uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(cta_mask)
      : "memory");
}
__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every CTA of the cluster; not .aligned, so that threads of one warp may
// reach it from different places (the producer warp's idle lanes leave early).
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}
// Arrives on the mbarrier at the same shared-memory offset in cluster CTA `rank`. The
// arrival keeps the default .release.cta semantics: what it orders is this warpgroup's
// wgmma reads of the stage (already retired), not global memory. `.release.cluster`
// compiles to MEMBAR.ALL.GPU before every arrival, which waits for the epilogue's global
// stores too and made 2-CTA kernels 1.2-2.8x slower than single CTAs (docs/kernels.md).
__device__ __forceinline__ void MbarArriveCluster(uint32_t bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(bar), "r"(rank));
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsInc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void SetMaxRegsDec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---------------------------------------------------------------------------------
// The persistent scheduler (MoeGemmPersistentGridFor): each CTA reads offsets once into
// shared memory and builds the prefix sums of per-expert M tiles; tile i of the grouped
// order then maps to (expert, rows, N tile) without touching global memory.

struct MoeTile {
  int e;          // expert
  int row_begin;  // first row of A/out
  int row_end;    // one past the expert's last row (<= T)
  int n_tile;
};

__device__ __forceinline__ bool SettledInputs(const MoeGemmParams& p) {
  return (p.flags & kMoeGemmFlagSettledInputs) != 0;
}

// off[0..E] = offsets clamped to [0, T]; pre[e] = M tiles (of tm rows) of experts < e.
// Every thread of the CTA calls it; it ends with a barrier.
__device__ __forceinline__ void BuildTilePrefix(const MoeGemmParams& p, int tm, int* off,
                                                int* pre) {
  const int E = p.num_experts, T = p.num_tokens;
  // From the L2 (ld.global.cg), never the SM's L1: with settled inputs this read comes
  // before the grid-dependency wait, and a line an earlier kernel left in this SM's L1
  // may hold the previous step's offsets.
  for (int i = threadIdx.x; i <= E; i += blockDim.x) {
    off[i] = min(max(__ldcg(p.offsets + i), 0), T);
  }
  __syncthreads();
  if (threadIdx.x < 32) {
    // 32 experts per step: a warp prefix sum with a running carry.
    const int lane = threadIdx.x;
    int carry = 0;
    if (lane == 0) pre[0] = 0;
    for (int base = 0; base < E; base += 32) {
      const int e = base + lane;
      const int rows = e < E ? off[e + 1] - off[e] : 0;
      int incl = rows > 0 ? (rows + tm - 1) / tm : 0;
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xFFFFFFFFu, incl, d);
        if (lane >= d) incl += v;
      }
      if (e < E) pre[e + 1] = carry + incl;
      carry += __shfl_sync(0xFFFFFFFFu, incl, 31);
    }
  }
  __syncthreads();
}

// Tile `tile` (< m_tiles * n_tiles) of the grouped order (kMoeGemmGroupM M tiles per
// group, M fastest), its expert found by binary search in pre (experts without tokens have
// pre[e] == pre[e + 1] and are skipped by taking the last such e).
__device__ __forceinline__ MoeTile TileAt(int64_t tile, int64_t m_tiles, int64_t n_tiles,
                                          int E, int tm, const int* off, const int* pre) {
  const int64_t per_group = kMoeGemmGroupM * n_tiles;
  const int64_t first_m = tile / per_group * kMoeGemmGroupM;
  const int64_t gsize = m_tiles - first_m < kMoeGemmGroupM ? m_tiles - first_m : kMoeGemmGroupM;
  const int64_t in_group = tile % per_group;
  const int m_idx = static_cast<int>(first_m + in_group % gsize);
  MoeTile t;
  t.n_tile = static_cast<int>(in_group / gsize);
  int lo = 0, hi = E - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (pre[mid] <= m_idx) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  t.e = lo;
  t.row_begin = off[lo] + (m_idx - pre[lo]) * tm;
  t.row_end = off[lo + 1];
  return t;
}

// The prologue every version-2 kernel runs: thread 0 initialises the `kStages` stage
// mbarriers (full: `fills` arrivals - the producer's, or a gathering producer's 32 lanes
// and its TMA lane - plus the copy's bytes; empty: one arrival per consumer warpgroup)
// and prefetches the tensor maps; then the CTA builds the tile prefix
// sums (off, pre) for M tiles of tm rows. Returns the number of M tiles.
//
// Programmatic dependent launch (manifest "pdl": true): nothing above the wait reads
// global memory (the barriers are shared memory, the maps live in the parameter block),
// so under the launch attribute this part overlaps the previous kernel's tail, and every
// global read (offsets, A, B, scales, bias) comes after the previous grid has completed
// with its writes visible. The trigger then lets the next kernel's CTAs be scheduled as
// this grid's CTAs exit: it waits for this grid's completion before its own reads, as
// every kernel launched with the attribute must. Without the attribute both are no-ops.
//
// With kMoeGemmFlagSettledInputs (the MoE layer's GEMMs; kernels/moe_gemm_abi.h) the
// offsets and the weights were complete before the previous kernel's own wait returned,
// so they may be read before this one's: the CTA builds the tile prefix first, and
// thread 0 calls pre_wait(M tiles), where the producer issues its first tile's weight
// copies. Only the activations then wait for the previous kernel. At one token that
// takes the offsets' round trip and the first weights' off the step's critical path.
struct NoPreWait {
  __device__ void operator()(int64_t) const {}
};
template <int kStages, class PreWait = NoPreWait>
__device__ __forceinline__ int64_t PipelinePrologue(const MoeGemmParamsV2& pv, uint32_t full_bar,
                                                    uint32_t empty_bar, int consumers, int tm,
                                                    int* off, int* pre, int fills = 1,
                                                    PreWait pre_wait = {}) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full_bar + 8 * s, fills);
      MbarInit(empty_bar + 8 * s, consumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    TmaPrefetchMap(&pv.a_map);
    TmaPrefetchMap(&pv.b_map);
  }
  const bool settled = SettledInputs(pv.g);
  if (!settled) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  }
  BuildTilePrefix(pv.g, tm, off, pre);
  const int64_t m_tiles = pre[pv.g.num_experts];
  if (settled) {
    if (threadIdx.x == 0) pre_wait(m_tiles);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  }
  return m_tiles;
}

// Settled inputs, the producer's part of pre_wait (thread 0): for the CTA's first tile
// (if it has one), each of its first stages' weight bytes expected on `full` without an
// arrival and issue(tile, kt, full) issuing that stage's weight copies.
template <int kStages, class IssueWeights>
__device__ __forceinline__ void PreIssueFirstTile(const MoeGemmParams& p, int64_t m_tiles,
                                                  int64_t n_tiles, int tm, const int* off,
                                                  const int* pre, int num_kt,
                                                  uint32_t full_bar, uint32_t bytes,
                                                  IssueWeights issue) {
  if (blockIdx.x >= m_tiles * n_tiles) return;
  const MoeTile t = TileAt(blockIdx.x, m_tiles, n_tiles, p.num_experts, tm, off, pre);
  for (int kt = 0; kt < kStages && kt < num_kt; ++kt) {
    MbarExpectTx(full_bar + 8 * kt, bytes);
    issue(t, kt, full_bar + 8 * kt);
  }
}

// A consumer's (or the producer's) position in the ring of `stages` stages.
template <int kStages>
struct StageRing {
  int s = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void Advance() {
    if (++s == kStages) {
      s = 0;
      phase ^= 1;
    }
  }
};

// 16-byte shared-memory load and store (the fp4 kernels' decoders and converters).
__device__ __forceinline__ uint4 LdShared128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
  return v;
}
__device__ __forceinline__ void StShared128(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

// 4-byte shared-memory load and store (the fp8-block scale slots of kernels/moe_gemm_tma.cu);
// ordered against the named barriers around them.
__device__ __forceinline__ float LdSharedF32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void StSharedF32(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}

// ---------------------------------------------------------------------------------
// The staged epilogue (kernels/moe_gemm_tma.cu, kernels/moe_gemm_fp4_fp8.cu).

// Synchronises the 128 threads of one warpgroup on named barrier `id`.
__device__ __forceinline__ void NamedBarrier128(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

// The staged epilogue's chunking (StoreStaged): chunks of 64 output columns, or 32 where
// 64 do not divide the tile's columns (gated 192-row tiles: 96 output columns).
template <MoeActivation ACT, int TN>
__host__ __device__ constexpr int StagedChunkCols() {
  constexpr int kTileCols = IsGated(ACT) ? TN / 2 : TN;
  return kTileCols < kMoeGemmTmaEpilogueCols ? kTileCols
         : kTileCols % kMoeGemmTmaEpilogueCols == 0 ? kMoeGemmTmaEpilogueCols
                                                   : kMoeGemmTmaEpilogueCols / 2;
}

// The epilogue of one-CTA-per-SM kernels (moe_gemm_layout.h): each chunk of this
// consumer's 64 output rows (StagedChunkCols) goes through its shared-memory buffer (rows
// padded to 144 bytes, so that neither the accumulator layout's writes nor the 16-byte
// reads conflict on banks) and out to global memory as whole 16-byte row pieces. Named
// barrier 1 + ci orders the consumer's 128 threads around the buffer.
// OUT kBf16: each thread writes its bf16 pair of each 8-column group (4 bytes) at byte
// (lane % 4) * 4 + 16g of its buffer row; a piece is 8 columns.
// OUT kFp8 (version 4): the same chunks and buffer rows, holding e4m3: each thread writes
// its two e4m3 of each group (2 bytes) at byte (lane % 4) * 2 + 8g, the first half of the
// row; a piece is 16 columns (n_out a multiple of 16: kMoeGemmOutColsAlignFp8).
template <MoeFormat F, MoeActivation ACT, int TN, MoeFormat OUT = kBf16, int R>
__device__ __forceinline__ void StoreStaged(const MoeGemmParams& p, const MoeTile& t, int ci,
                                            float (&acc)[R], uint8_t* buf) {
  constexpr bool kE4m3 = OUT == kFp8;
  constexpr int kOutBytes = kE4m3 ? 1 : 2;  // per output element
  constexpr int kTileCols = IsGated(ACT) ? TN / 2 : TN;
  constexpr int kChunkCols = StagedChunkCols<ACT, TN>();
  static_assert(kTileCols % kChunkCols == 0, "whole chunks per tile");
  constexpr int kGroups = kChunkCols / 8;            // 8-column groups per row
  constexpr int kPieceCols = 16 / kOutBytes;         // columns per 16-byte piece
  constexpr int kPieces = kChunkCols / kPieceCols;   // pieces per row
  constexpr int kRowB = kMoeGemmTmaEpilogueRowBytes;
  static_assert(kChunkCols % kPieceCols == 0 && 64 * kPieces % 128 == 0,
                "whole pieces per thread");
  const int tid = threadIdx.x % 128, lane = tid % 32, warp = tid / 32;
  TileEpilogue<F, ACT> ep(p, t.e);
  ep.template FoldBias<TN>(acc, t.n_tile * kTileCols + (lane % 4) * 2);
  float inv_s = 0.0f;
  if constexpr (kE4m3) inv_s = OutInvScale(p);
  const int row0 = t.row_begin + ci * 64;
  const int n_out = MoeGemmOutCols(p.n, ACT);
  using Out = std::conditional_t<kE4m3, uint8_t, __nv_bfloat16>;
  Out* out = static_cast<Out*>(p.out);
  const uint32_t base = SmemAddr(buf);
#pragma unroll
  for (int c = 0; c < kTileCols / kChunkCols; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t row_addr =
          base + (warp * 16 + lane / 4 + 8 * h) * kRowB + (lane % 4) * 2 * kOutBytes;
#pragma unroll
      for (int g = 0; g < kGroups; ++g) {
        if constexpr (kE4m3) {
          const uint32_t v =
              Bf16x2ToE4m3x2(ep.template Pair<TN>(acc, c * kGroups + g, h), inv_s);
          asm volatile("st.shared.b16 [%0], %1;\n" ::"r"(row_addr + g * 8),
                       "h"(static_cast<uint16_t>(v))
                       : "memory");
        } else {
          const __nv_bfloat162 v = ep.template Pair<TN>(acc, c * kGroups + g, h);
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row_addr + g * 16),
                       "r"(*reinterpret_cast<const uint32_t*>(&v))
                       : "memory");
        }
      }
    }
    NamedBarrier128(1 + ci);
#pragma unroll
    for (int i = 0; i < 64 * kPieces / 128; ++i) {
      const int piece = i * 128 + tid;
      const int r = piece / kPieces, q = piece % kPieces;
      uint4 v;
      if constexpr (kE4m3) {
        v = LdShared128(base + r * kRowB + q * 16);
      } else {
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(base + r * kRowB + q * 16)
                     : "memory");
      }
      const int row = row0 + r;
      const int col = t.n_tile * kTileCols + c * kChunkCols + q * kPieceCols;
      if (row < t.row_end && col < n_out) {
        *reinterpret_cast<uint4*>(out + static_cast<int64_t>(row) * n_out + col) = v;
      }
    }
    NamedBarrier128(1 + ci);  // the buffer is free for the next chunk (or tile)
  }
}

}  // namespace
}  // namespace cubist::moe

#endif  // CUBIST_KERNELS_MOE_GEMM_TMA_COMMON_CUH_
