// The routed MoE layer's own kernels for sm_90a: routing, the sort of token slots by
// expert, the gather of token rows, the quantization of activations, the weighted
// finalize and the compaction of the expert-major masked layout (the layer's two GEMMs
// are moe_gemm kernels). All fourteen live in one cubin, built by scripts/build-artifacts
// with
//   nvcc -std=c++17 -O3 -cubin -gencode=arch=compute_90a,code=sm_90a -I<repo>
// Contract: kernels/moe_layer_abi.h (parameter structs, grids, thread counts, the
// semantics of every routing method, tie and NaN rules); docs/kernels.md, "The layer's
// kernels", summarizes it.
//
// Every kernel is launched with programmatic dependent launch: it waits for the
// previous kernel (griddepcontrol.wait) before its first global access - it reads that
// kernel's output, and may write what that kernel still reads - and then lets the next
// kernel launch at once (griddepcontrol.launch_dependents). Triggering early is always
// correct: the next kernel's own wait blocks until this grid has completed and its
// writes are visible; the trigger only lets that kernel's CTAs be resident and past
// their launch latency by then. Without the launch attribute both are no-ops.
//
// Determinism: no floating-point atomics and no order that depends on scheduling; the
// integer atomics of the sort's histograms commute. The same inputs give the same bits
// on every run.
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/moe_e2m1.h"
#include "kernels/moe_layer_abi.h"

namespace cubist::moe {
namespace {

// ---------------------------------------------------------------------------------
// Shared helpers.

__device__ __forceinline__ void GridDependencyWait() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
}
__device__ __forceinline__ void LaunchDependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

constexpr unsigned kFullMask = 0xFFFFFFFFu;
// The staged selection scores never hold this NaN (staging replaces every NaN with the
// canonical one), so it marks an entry that is out of the selection: chosen already,
// or in a group deepseek_v3 dropped.
constexpr uint32_t kRemovedBits = 0xFFFFFFFFu;
constexpr uint32_t kCanonicalNan = 0x7FC00000u;

__device__ __forceinline__ float Canonical(float v) {
  return v != v ? __uint_as_float(kCanonicalNan) : v;
}

// The selection order as an unsigned key, larger = earlier: numbers by value (-0 and +0
// equal), then NaN (below every number, -inf included), then removed entries (0).
__device__ __forceinline__ uint32_t RankKey(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == kRemovedBits) return 0;
  if (v != v) return 1;
  if (v == 0.0f) b = 0;
  // Positive: above every negative; negative: larger magnitude lower. The smallest
  // number key (-inf) is 0x007FFFFF, above the NaN's 1.
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
// Key and index: the larger value first, equal keys to the lower index.
__device__ __forceinline__ uint64_t IndexedKey(uint32_t key, int i) {
  return (static_cast<uint64_t>(key) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(i));
}
__device__ __forceinline__ int KeyIndex(uint64_t k) {
  return static_cast<int>(~static_cast<uint32_t>(k));
}

__device__ __forceinline__ uint64_t WarpMaxKey(uint64_t k) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint64_t other = __shfl_xor_sync(kFullMask, k, o);
    k = other > k ? other : k;
  }
  return k;
}
// fmaxf drops a NaN operand: with -inf as the start, a NaN counts as -inf. The xor
// butterfly gives every lane the same bits (each pair combines the same two values).
__device__ __forceinline__ float WarpMaxF(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}
__device__ __forceinline__ float WarpSumF(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
// The sum of lane j's v over j < k in slot order (j = 0, 1, ...), in every lane.
__device__ __forceinline__ float SlotOrderSum(float v, int k) {
  float s = 0.0f;
  for (int j = 0; j < k; ++j) s += __shfl_sync(kFullMask, v, j);
  return s;
}

// 8 bf16 in 16 bytes <-> 8 floats.
__device__ __forceinline__ void UnpackBf16x8(const uint4& v, float (&f)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(w[i] << 16);
    f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);  // nearest even, each
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint4 PackBf16x8(const float (&f)[8]) {
  return make_uint4(PackBf16x2(f[0], f[1]), PackBf16x2(f[2], f[3]), PackBf16x2(f[4], f[5]),
                    PackBf16x2(f[6], f[7]));
}

// ---------------------------------------------------------------------------------
// Routing: one warp per token. The warp stages the token's selection scores in shared
// memory (the logits, or deepseek_v3's sigmoid(x) + bias), selects by repeated warp
// arg-max - up to 256 experts over keys held in registers (WarpTopKInRegisters), beyond
// that each lane keeps the best of its strided entries and the winner's lane removes it
// and rescans its own (WarpTopK) - and computes the weights of the chosen in fp32.

constexpr int kRouteWarps = kMoeRouteThreads / 32;

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// A NaN logit counts as -inf in softmax sums and maxima.
__device__ __forceinline__ float NanToNegInf(float x) { return x != x ? -INFINITY : x; }

// Logit `at` (= t x E + i) of the kBf16 or fp32 logits.
template <bool kBf16>
__device__ __forceinline__ float LogitAt(const MoeRouteParams& p, int64_t at) {
  if constexpr (kBf16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p.logits)[at]);
  } else {
    return static_cast<const float*>(p.logits)[at];
  }
}
__device__ __forceinline__ float Logit(const MoeRouteParams& p, int64_t t, int i) {
  const int64_t at = t * p.num_experts + i;
  return p.logits_bf16 ? LogitAt<true>(p, at) : LogitAt<false>(p, at);
}
// The score deepseek_v3 selects on; the other methods select on the logit itself.
__device__ __forceinline__ float Score(const MoeRouteParams& p, int64_t t, int i, bool ds) {
  const float x = Logit(p, t, i);
  if (!ds) return x;
  return Sigmoid(x) + (p.bias != nullptr ? p.bias[i] : 0.0f);
}

// The best key of this lane's entries a[i * stride], i = lane, lane + 32, ... < n.
__device__ __forceinline__ uint64_t LaneBest(const float* a, int n, int stride, int lane) {
  uint64_t best = 0;
  for (int i = lane; i < n; i += 32) {
    const uint64_t k = IndexedKey(RankKey(a[i * stride]), i);
    best = k > best ? k : best;
  }
  return best;
}

// Top-k of a[i * stride], i < n, in selection order: lane j < min(k, 32) returns the
// index of slot j (-1 elsewhere). Each chosen entry is overwritten with kRemovedBits.
// Stops early, leaving -1, when only removed entries are left (k > n).
__device__ __noinline__ int WarpTopK(float* a, int n, int stride, int k, int lane) {
  uint64_t best = LaneBest(a, n, stride, lane);
  int mine = -1;
  for (int j = 0; j < k; ++j) {
    const uint64_t win = WarpMaxKey(best);
    if ((win >> 32) == 0) break;  // nothing left but removed entries (uniform)
    const int i = KeyIndex(win);
    if (lane == j) mine = i;
    if (lane == (i & 31)) {  // the owner of entry i removes it and rescans
      a[i * stride] = __uint_as_float(kRemovedBits);
      best = LaneBest(a, n, stride, lane);
    }
  }
  __syncwarp();
  return mine;
}

// WarpTopK over a[0..n), n <= 32 x kPerLane, with the selection keys in registers: lane l
// keeps the keys of entries l, l + 32, ... and recomputes its best each round (a few
// compares, every lane at once); the warp's winner is two `redux.sync` maxima - of the
// keys, then of the complemented indices holding that key (the lowest index wins a tie)
// - and its owner zeroes its key. The same choices as WarpTopK, whose rounds cost more:
// the owner lane alone rescanned its entries from shared memory (recomputing their keys)
// while the warp waited, and the arg-max took ten 64-bit shuffles. Routing 4,096 tokens
// (H100): 128 experts top-8 16.1 -> 11.5 us, top-4 11.5 -> 9.2, DeepSeek-V3's 256 in
// groups 30.6 -> 23.8. a is not modified.
template <int kPerLane>
__device__ int WarpTopKInRegisters(const float* a, int n, int k, int lane) {
  uint32_t key[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    key[j] = i < n ? RankKey(a[i]) : 0u;
  }
  int mine = -1;
  for (int r = 0; r < k; ++r) {
    uint32_t best = 0;
    int best_j = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {  // strictly larger: the lowest index on ties
      best_j = key[j] > best ? j : best_j;
      best = key[j] > best ? key[j] : best;
    }
    const uint32_t top = __reduce_max_sync(kFullMask, best);
    if (top == 0) break;  // nothing left but removed entries (uniform)
    const uint32_t mine_inv = best == top ? ~static_cast<uint32_t>(lane + 32 * best_j) : 0u;
    const int i = static_cast<int>(~__reduce_max_sync(kFullMask, mine_inv));
    if (lane == r) mine = i;
    if (lane == (i & 31)) {
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) key[j] = j == (i >> 5) ? 0u : key[j];
    }
  }
  return mine;
}

// deepseek_v3's group limit on the staged scores a[0..E): a group's score is the sum of
// its two largest scores (its only one when groups have one expert); the topk_group
// best groups stay, every entry of the others is removed.
__device__ __noinline__ void KeepBestGroups(const MoeRouteParams& p, int64_t t, float* a,
                                            int lane) {
  const int E = p.num_experts, groups = p.n_group;
  const int size = E / groups;
  // Each lane scores its groups and parks the score in the group's first entry: the
  // group is this lane's alone, so nobody else reads the entry meanwhile. The entry's
  // own score is kept in a register for the lane's first group (every group when there
  // are at most 32), so restoring it below needs no second read of the logits.
  float kept_first = 0.0f;
  for (int g = lane; g < groups; g += 32) {
    float* m = a + g * size;
    if (g == lane) kept_first = m[0];
    uint32_t k1 = 0, k2 = 0;  // the two best keys
    float v1 = 0.0f, v2 = 0.0f;
    for (int i = 0; i < size; ++i) {
      const float v = m[i];
      const uint32_t k = RankKey(v);
      if (k > k1) {
        k2 = k1, v2 = v1, k1 = k, v1 = v;
      } else if (k > k2) {
        k2 = k, v2 = v;
      }
    }
    m[0] = Canonical(size >= 2 ? v1 + v2 : v1);
  }
  __syncwarp();
  // The kept groups' first entries become kRemovedBits: the flag read below.
  WarpTopK(a, groups, size, p.topk_group, lane);
  // Remove the members of dropped groups but their first entries (which hold the flags),
  // then restore the kept groups' first entries and remove the dropped ones'.
  for (int i = lane; i < E; i += 32) {
    if (i % size == 0) continue;
    if (__float_as_uint(a[(i / size) * size]) != kRemovedBits) {
      a[i] = __uint_as_float(kRemovedBits);
    }
  }
  __syncwarp();
  for (int g = lane; g < groups; g += 32) {
    float* first = a + g * size;
    const float own = g == lane ? kept_first : Canonical(Score(p, t, g * size, /*ds=*/true));
    *first = __float_as_uint(*first) == kRemovedBits ? own : __uint_as_float(kRemovedBits);
  }
  __syncwarp();
}

// Stages token t's selection scores into a[0..E) (NaN canonical, so that kRemovedBits
// stays free). A batch's logit and bias loads are all issued before the first is used:
// at decode the logits come from DRAM, and one round trip per 32 experts (two with
// deepseek_v3's bias) was most of a token's routing time. Entries past E load entry E - 1
// and are not stored, so the loads need no branch: with a branch around each (and the
// format chosen per load) the decode path of route-and-sort ran through 840 distinct
// instructions, and at one token the warp stalled on instruction fetch for 44% of its
// cycles (ncu, H100).
template <bool kBf16, bool kDs>
__device__ __forceinline__ void StageScores(const MoeRouteParams& p, int64_t t, float* a,
                                            int lane) {
  const int E = p.num_experts;
  const int64_t row = t * E;
  const float* bias = kDs ? p.bias : nullptr;
  constexpr int kStageBatch = 8;
  for (int base = 0; base < E; base += 32 * kStageBatch) {
    float x[kStageBatch], b[kStageBatch];
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int i = min(base + lane + 32 * u, E - 1);
      x[u] = LogitAt<kBf16>(p, row + i);
      b[u] = bias != nullptr ? bias[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kStageBatch; ++u) {
      const int i = base + lane + 32 * u;
      if (i < E) a[i] = Canonical(kDs ? Sigmoid(x[u]) + b[u] : x[u]);
    }
  }
}

// deepseek_v3's staging (a sigmoid per entry, unrolled: 600 instructions) out of line,
// as the group limit and the many-expert top-k are: at one token route-and-sort is bound
// by instruction fetch, and the other methods' path then runs through fewer cache lines.
__device__ __noinline__ void StageDeepSeekScores(const MoeRouteParams& p, int64_t t, float* a,
                                                 int lane) {
  p.logits_bf16 ? StageScores<true, true>(p, t, a, lane)
                : StageScores<false, true>(p, t, a, lane);
}

// Routes token t with the calling warp: its selection scores staged in a[0..E), its ids
// and weights written to topk_ids/topk_weights[t * k ...] (and the ids to
// ids_shared[t * k ...] when given). The whole warp calls it.
__device__ __forceinline__ void RouteToken(const MoeRouteParams& p, int64_t t, float* a,
                                           int lane, int32_t* ids_shared = nullptr) {
  const int E = p.num_experts;
  const int k = min(p.top_k, kMoeRouteMaxTopK);
  const int method = p.method;
  const bool ds = method == kRouteDeepSeekV3;
  if (ds) {
    StageDeepSeekScores(p, t, a, lane);
  } else {
    p.logits_bf16 ? StageScores<true, false>(p, t, a, lane)
                  : StageScores<false, false>(p, t, a, lane);
  }
  __syncwarp();

  // Softmax over all E (default, renormalize_naive): maximum and sum, NaN as -inf.
  float m = -INFINITY, sum = 0.0f;
  if (method == kRouteDefault || method == kRouteRenormalizeNaive) {
    for (int i = lane; i < E; i += 32) m = fmaxf(m, a[i]);
    m = WarpMaxF(m);
    for (int i = lane; i < E; i += 32) sum += expf(NanToNegInf(a[i]) - m);
    sum = WarpSumF(sum);
  }
  // The host validates n_group; the guard only keeps a bad one from dividing by zero.
  if (ds && p.n_group >= 1 && p.n_group <= E) KeepBestGroups(p, t, a, lane);
  // Up to 256 experts the keys fit in registers (every model of docs/benchmarks.md). One
  // instantiation: with a second for 128 experts, ptxas spilled the token index across
  // the weights' division calls below.
  const int id = E <= 256 ? WarpTopKInRegisters<8>(a, E, k, lane) : WarpTopK(a, E, 1, k, lane);
  const bool chosen = lane < k && id >= 0;
  // Weights from the unstaged logit (a NaN keeps its bits where a weight is the logit).
  const float x = chosen ? Logit(p, t, id) : 0.0f;
  float w = 0.0f;
  switch (method) {
    case kRouteDefault:
      w = expf(NanToNegInf(x) - m) / sum;
      break;
    case kRouteRenormalize: {
      const float xm = chosen ? NanToNegInf(x) : -INFINITY;
      const float mk = WarpMaxF(xm);
      const float e = chosen ? expf(xm - mk) : 0.0f;
      w = e / SlotOrderSum(e, k);
      break;
    }
    case kRouteRenormalizeNaive: {
      const float pr = chosen ? expf(NanToNegInf(x) - m) / sum : 0.0f;
      w = pr / SlotOrderSum(pr, k);
      break;
    }
    case kRouteDeepSeekV3: {
      const float s = chosen ? Sigmoid(x) : 0.0f;
      w = s / (SlotOrderSum(s, k) + 1e-20f) * p.routed_scaling_factor;
      break;
    }
    case kRouteTopK:
      w = x;
      break;
    case kRouteLlama4:
    case kRouteSigmoid:
      w = Sigmoid(x);
      break;
    case kRouteSigmoidRenorm: {
      const float s = chosen ? Sigmoid(x) : 0.0f;
      w = s / SlotOrderSum(s, k);
      break;
    }
    default:
      break;
  }
  if (lane < k) {
    const int64_t at = t * p.top_k + lane;
    p.topk_ids[at] = id;
    if (ids_shared != nullptr) ids_shared[at] = id;
    p.topk_weights[at] = chosen ? w : 0.0f;
  }
}

}  // namespace
}  // namespace cubist::moe

using namespace cubist::moe;

// Dynamic shared memory: MoeRouteSharedBytes(E), E fp32 scores per warp.
extern "C" __global__ void __launch_bounds__(kMoeRouteThreads)
    cubist_moe_route(const __grid_constant__ MoeRouteParams p) {
  extern __shared__ float route_scores[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  GridDependencyWait();
  LaunchDependents();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= p.num_tokens) return;
  RouteToken(p, t, route_scores + warp * p.num_experts, lane);
}

// ---------------------------------------------------------------------------------
// The sort. A slot's bin: its local expert 0..L-1, L when its id is outside
// 0..num_experts-1 (dropped, counted), L + 1 when it is a valid expert of another rank
// (not kept). A chunk of kMoeSortChunk slots is ranked stably by a block radix sort of
// the bins (slot indices as values, in slot order before the sort): within a bin slots
// keep their order.

namespace cubist::moe {
namespace {

constexpr int kSortItems = kMoeSortChunk / kMoeSortThreads;
static_assert(kSortItems * kMoeSortThreads == kMoeSortChunk, "chunk = threads x items");
constexpr int kScanItems = (kMoeSortMaxExperts + 1 + kMoeSortThreads - 1) / kMoeSortThreads;
// The fused sort ranks at most this many slots (decode: T x k <= 256) by counting, in
// one pass, instead of a radix sort of a whole padded chunk: a few hundred shared-memory
// reads against several block-wide passes.
constexpr int kSmallSort = 256;
static_assert(kMoeRouteSortMaxSlots <= kSmallSort, "route-and-sort sorts small only");
static_assert(kSmallSort <= kMoeSortThreads, "one slot per thread");
using SortBins = cub::BlockRadixSort<uint32_t, kMoeSortThreads, kSortItems, int32_t>;
using ScanBins = cub::BlockScan<int32_t, kMoeSortThreads>;

// The radix sort's storage is the largest part; the histogram and its scan are done
// before the sort starts, and the first positions are written after it ends.
struct SortShared {
  union {
    SortBins::TempStorage sort;
    struct {
      ScanBins::TempStorage scan;
      int32_t bins[kMoeSortMaxExperts + 1];  // counts, offsets or first positions per bin
      uint32_t slot_bins[kSmallSort];        // the small sort's bin of each slot
    };
  };
  uint32_t warp_last[kMoeSortThreads / 32];
};

__device__ __forceinline__ uint32_t SlotBin(const MoeSortParams& p, int32_t id) {
  const uint32_t L = static_cast<uint32_t>(p.num_local_experts);
  if (id < 0 || id >= p.num_experts) return L;
  const int64_t e = static_cast<int64_t>(id) - p.local_expert_offset;
  return e >= 0 && e < p.num_local_experts ? static_cast<uint32_t>(e) : L + 1;
}

// counts[0..L] = the bins 0..L of slots [begin, begin + n) (kept experts, dropped).
// Lanes with the same bin add once (__match_any_sync): routing skew piles slots on one
// expert, and one shared atomic per lane would serialize on it.
__device__ void ChunkHistogram(const MoeSortParams& p, const int32_t* ids, int begin, int n,
                               int32_t* counts) {
  const int L = p.num_local_experts;
  for (int e = threadIdx.x; e <= L; e += kMoeSortThreads) counts[e] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31;
  for (int base = 0; base < n; base += kMoeSortThreads) {  // whole warps iterate
    const int i = base + threadIdx.x;
    const uint32_t bin = i < n ? SlotBin(p, ids[begin + i]) : L + 1;
    const unsigned peers = __match_any_sync(kFullMask, bin);
    if (bin <= static_cast<uint32_t>(L) && lane == __ffs(peers) - 1) {
      atomicAdd(&counts[bin], __popc(peers));
    }
  }
  __syncthreads();
}

// v[0..n) -> its exclusive prefix sums, in place; returns the total. n <= the scan's
// capacity (kMoeSortMaxExperts + 1).
__device__ int32_t BlockExclusiveScan(int32_t* v, int n, ScanBins::TempStorage& tmp) {
  int32_t items[kScanItems];
  const int first = threadIdx.x * kScanItems;
#pragma unroll
  for (int j = 0; j < kScanItems; ++j) items[j] = first + j < n ? v[first + j] : 0;
  int32_t total;
  ScanBins(tmp).ExclusiveSum(items, items, total);
#pragma unroll
  for (int j = 0; j < kScanItems; ++j) {
    if (first + j < n) v[first + j] = items[j];
  }
  __syncthreads();
  return total;
}

// Ranks slots [begin, begin + n) and writes both permutations. A kept slot's row:
// with `bases` (the chunk's row of chunk_counts after the scan: the first row of each
// expert for this chunk), bases[bin] + its position among the chunk's slots of that
// bin; without (one chunk holds every slot), its position in the sorted chunk, since
// kept bins sort first and in expert order.
__device__ void ChunkScatter(const MoeSortParams& p, int begin, int n, const int32_t* bases,
                             SortShared& s) {
  const uint32_t L = static_cast<uint32_t>(p.num_local_experts);
  uint32_t keys[kSortItems];
  int32_t vals[kSortItems];
#pragma unroll
  for (int j = 0; j < kSortItems; ++j) {
    const int i = threadIdx.x * kSortItems + j;  // blocked: slot order before the sort
    keys[j] = i < n ? SlotBin(p, p.topk_ids[begin + i]) : L + 1;
    vals[j] = i;
    if (i < n && keys[j] >= L) p.expanded_to_permuted[begin + i] = -1;
  }
  const int bits = 32 - __clz(static_cast<int>(L) + 1);  // bins 0..L+1
  SortBins(s.sort).Sort(keys, vals, 0, bits);
  const int pos0 = threadIdx.x * kSortItems;  // blocked: sorted positions
  if (bases != nullptr) {
    // The first position of each bin in the sorted chunk, where the bin changes.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint32_t prev = __shfl_up_sync(kFullMask, keys[kSortItems - 1], 1);
    if (lane == 31) s.warp_last[warp] = keys[kSortItems - 1];
    __syncthreads();
    if (lane == 0) prev = warp == 0 ? ~0u : s.warp_last[warp - 1];
#pragma unroll
    for (int j = 0; j < kSortItems; ++j) {
      const uint32_t before = j == 0 ? prev : keys[j - 1];
      if (keys[j] < L && keys[j] != before) s.bins[keys[j]] = pos0 + j;
    }
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kSortItems; ++j) {
    if (keys[j] >= L) continue;
    const int row = bases != nullptr ? bases[keys[j]] + (pos0 + j - s.bins[keys[j]]) : pos0 + j;
    const int slot = begin + vals[j];
    p.permuted_to_expanded[row] = slot;
    p.expanded_to_permuted[slot] = row;
  }
}

// The fused sort of n <= kSmallSort slots, with s.bins holding the offsets: a kept
// slot's row is its expert's offset plus the number of earlier slots of that expert.
__device__ void SmallScatter(const MoeSortParams& p, const int32_t* ids, int n, SortShared& s) {
  const uint32_t L = static_cast<uint32_t>(p.num_local_experts);
  const int i = threadIdx.x;
  const uint32_t bin = i < n ? SlotBin(p, ids[i]) : L + 1;
  if (i < n) s.slot_bins[i] = bin;
  __syncthreads();
  if (i >= n) return;
  if (bin >= L) {
    p.expanded_to_permuted[i] = -1;
    return;
  }
  int rank = 0;
  for (int j = 0; j < i; ++j) rank += s.slot_bins[j] == bin;
  const int row = s.bins[bin] + rank;
  p.permuted_to_expanded[row] = i;
  p.expanded_to_permuted[i] = row;
}

// s.bins[0..L] holds the slot counts of every bin: it becomes the offsets (exclusive
// prefix sums over the L experts), written out with offsets[L] (the kept slots) and the
// dropped count.
__device__ void PublishOffsets(const MoeSortParams& p, SortShared& s) {
  const int L = p.num_local_experts;
  const int32_t dropped = s.bins[L];
  const int32_t kept = BlockExclusiveScan(s.bins, L, s.scan);
  for (int e = threadIdx.x; e < L; e += kMoeSortThreads) p.offsets[e] = s.bins[e];
  if (threadIdx.x == 0) {
    p.offsets[L] = kept;
    p.dropped[0] = dropped;
  }
}

}  // namespace
}  // namespace cubist::moe

namespace cubist::moe {
namespace {

// The whole sort of up to kMoeSortChunk slots by one CTA: histogram, offsets, ranks.
// `ids`: p.topk_ids, or the route-and-sort kernel's shared copy of them (no global round
// trip between its routing and its sort at decode). kSmallOnly: at most kSmallSort slots
// (route-and-sort's limit), so the radix sort is not compiled in - at one token that
// kernel is bound by instruction fetch, and dead code between its live parts is fetched
// too.
template <bool kSmallOnly>
__device__ __forceinline__ void SortOneChunk(const MoeSortParams& p, SortShared& s,
                                             const int32_t* ids) {
  const int n = max(0, min(p.num_slots, kSmallOnly ? kSmallSort : kMoeSortChunk));
  ChunkHistogram(p, ids, 0, n, s.bins);
  PublishOffsets(p, s);
  if (kSmallOnly || n <= kSmallSort) {
    SmallScatter(p, ids, n, s);
    return;
  }
  __syncthreads();  // the scan's storage becomes the sort's
  ChunkScatter(p, 0, n, nullptr, s);
}

}  // namespace
}  // namespace cubist::moe

// One CTA sorts up to kMoeSortChunk slots: histogram, offsets, ranks.
extern "C" __global__ void __launch_bounds__(kMoeSortThreads, 1)
    cubist_moe_sort_fused(const __grid_constant__ MoeSortParams p) {
  __shared__ SortShared s;
  GridDependencyWait();
  LaunchDependents();
  SortOneChunk</*kSmallOnly=*/false>(p, s, p.topk_ids);
}

// Decode's routing and sort in one launch (one kernel boundary less on the critical path
// of a step): warp w of the one CTA routes token w (T <= kMoeRouteSortMaxTokens), then
// the CTA sorts the T x k slots as cubist_moe_sort_fused does. The warps write the ids
// to topk_ids (the layer's output) and to shared memory, which the sort reads after the
// barrier: no global round trip between the two halves.
// Dynamic shared memory: MoeRouteSortSharedBytes(T, E), E fp32 scores per token.
extern "C" __global__ void __launch_bounds__(kMoeSortThreads, 1)
    cubist_moe_route_sort(const __grid_constant__ MoeRouteSortParams p) {
  extern __shared__ float route_scores[];
  __shared__ SortShared s;
  __shared__ int32_t route_ids[kMoeRouteSortMaxSlots];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  GridDependencyWait();
  LaunchDependents();
  if (warp < p.route.num_tokens) {
    RouteToken(p.route, warp, route_scores + warp * p.route.num_experts, lane, route_ids);
  }
  __syncthreads();
  SortOneChunk</*kSmallOnly=*/true>(p.sort, s, route_ids);
}

// Chunk c = blockIdx.x: chunk_counts[c * (L + 1) + e] = its slots of bin e, e = 0..L.
extern "C" __global__ void __launch_bounds__(kMoeSortThreads, 1)
    cubist_moe_sort_count(const __grid_constant__ MoeSortParams p) {
  __shared__ int32_t counts[kMoeSortMaxExperts + 1];
  GridDependencyWait();
  LaunchDependents();
  const int begin = blockIdx.x * kMoeSortChunk;
  const int n = min(p.num_slots - begin, kMoeSortChunk);
  if (n <= 0) return;
  const int L = p.num_local_experts;
  ChunkHistogram(p, p.topk_ids, begin, n, counts);
  int32_t* row = p.chunk_counts + static_cast<int64_t>(blockIdx.x) * (L + 1);
  for (int e = threadIdx.x; e <= L; e += kMoeSortThreads) row[e] = counts[e];
}

// One CTA: per bin, the chunks' counts become running sums down the column (in place),
// the column totals give offsets and dropped, and each chunk's entry becomes the first
// row of its slots of that expert: offsets[e] + the counts of the chunks before it.
extern "C" __global__ void __launch_bounds__(kMoeSortThreads, 1)
    cubist_moe_sort_scan(const __grid_constant__ MoeSortParams p) {
  __shared__ SortShared s;
  GridDependencyWait();
  LaunchDependents();
  const int L = p.num_local_experts;
  const int chunks = static_cast<int>(MoeSortChunks(max(p.num_slots, 0)));
  for (int e = threadIdx.x; e <= L; e += kMoeSortThreads) {
    int32_t run = 0;
    for (int c = 0; c < chunks; ++c) {
      int32_t* q = p.chunk_counts + static_cast<int64_t>(c) * (L + 1) + e;
      const int32_t v = *q;
      *q = run;
      run += v;
    }
    s.bins[e] = run;
  }
  __syncthreads();
  PublishOffsets(p, s);
  for (int e = threadIdx.x; e < L; e += kMoeSortThreads) {
    const int32_t offset = s.bins[e];
    for (int c = 0; c < chunks; ++c) {
      p.chunk_counts[static_cast<int64_t>(c) * (L + 1) + e] += offset;
    }
  }
}

// Chunk c = blockIdx.x: ranks its slots and places them from the chunk's bases.
extern "C" __global__ void __launch_bounds__(kMoeSortThreads, 1)
    cubist_moe_sort_scatter(const __grid_constant__ MoeSortParams p) {
  __shared__ SortShared s;
  GridDependencyWait();
  LaunchDependents();
  const int begin = blockIdx.x * kMoeSortChunk;
  const int n = min(p.num_slots - begin, kMoeSortChunk);
  if (n <= 0) return;
  ChunkScatter(p, begin, n,
               p.chunk_counts + static_cast<int64_t>(blockIdx.x) * (p.num_local_experts + 1), s);
}

// ---------------------------------------------------------------------------------
// Gather: rows in a grid-stride loop, 16-byte vectors, eight loads in flight per thread
// (a row of DeepSeek-V3's 7168 columns is 7 vectors per thread: one round trip).

extern "C" __global__ void __launch_bounds__(kMoeGatherThreads)
    cubist_moe_gather_bf16(const __grid_constant__ MoeGatherParams p) {
  GridDependencyWait();
  LaunchDependents();
  const int32_t rows = p.offsets[p.num_local_experts];
  const int vecs = p.hidden / 8;
  const uint4* __restrict__ in = static_cast<const uint4*>(p.input);
  uint4* __restrict__ out = static_cast<uint4*>(p.out);
  constexpr int kUnroll = 8;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t slot = p.permuted_to_expanded[r];
    const uint4* src = in + static_cast<int64_t>(slot / p.top_k) * vecs;
    uint4* dst = out + r * vecs;
    const bool scale = p.weights != nullptr;
    const float w = scale ? p.weights[slot] : 1.0f;
    for (int v0 = threadIdx.x; v0 < vecs; v0 += kUnroll * kMoeGatherThreads) {
      uint4 x[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int v = v0 + u * kMoeGatherThreads;
        if (v < vecs) x[u] = __ldg(src + v);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int v = v0 + u * kMoeGatherThreads;
        if (v >= vecs) continue;
        if (scale) {  // fp32 product, one rounding to bf16 (nearest even)
          float f[8];
          UnpackBf16x8(x[u], f);
#pragma unroll
          for (int i = 0; i < 8; ++i) f[i] *= w;
          x[u] = PackBf16x8(f);
        }
        dst[v] = x[u];
      }
    }
  }
}

// ---------------------------------------------------------------------------------
// Finalize: one CTA per token (grid-stride beyond gridDim), or, with a grid of S x T CTAs
// (S >= 2), S CTAs per token, each over one of S column ranges: at decode one CTA per
// token leaves a handful of SMs to read T x k x H x 2 bytes, a round trip per 16-byte
// column of each thread. Warp 0 ranks the token's k slots in the summation order -
// weight descending, equal weights to the lower expert id, equal both to the lower slot -
// with shuffles, and publishes each slot's row and weight in that order; every thread
// then owns 16-byte columns of the hidden row and sums them in fp32 in that order, with
// up to kBatch row loads in flight. The bits do not depend on the grid.

extern "C" __global__ void __launch_bounds__(kMoeFinalizeThreads)
    cubist_moe_finalize(const __grid_constant__ MoeFinalizeParams p) {
  __shared__ int32_t order_row[kMoeRouteMaxTopK];
  __shared__ float order_w[kMoeRouteMaxTopK];
  GridDependencyWait();
  LaunchDependents();
  const int k = max(0, min(p.top_k, kMoeRouteMaxTopK));
  const int vecs = p.hidden / 8;
  const int lane = threadIdx.x & 31;
  const uint4* __restrict__ rows = static_cast<const uint4*>(p.rows);
  uint4* __restrict__ out = static_cast<uint4*>(p.out);
  constexpr int kBatch = 8;
  // Column split: S CTAs per token when the grid holds at least two per token.
  const int64_t T = p.num_tokens;
  const int64_t split = T > 0 && gridDim.x >= 2 * T ? gridDim.x / T : 1;
  int64_t t0 = blockIdx.x, t_step = gridDim.x;
  int v_begin = 0, v_end = vecs;
  if (split > 1) {
    if (blockIdx.x >= split * T) return;
    t0 = blockIdx.x / split;
    t_step = T;  // one token
    const int part = static_cast<int>(blockIdx.x % split);
    const int chunk = static_cast<int>((vecs + split - 1) / split);
    v_begin = min(vecs, part * chunk);
    v_end = min(vecs, v_begin + chunk);
  }
  for (int64_t t = t0; t < T; t += t_step) {
    if (threadIdx.x < 32) {
      const bool slot = lane < k;
      const int64_t at = t * p.top_k + lane;
      // unit_weights: every w is 1 (topk_weights is not read), so the ids alone order.
      // The three loads are issued together: they do not depend on each other.
      const float w = slot && !p.unit_weights ? p.topk_weights[at] : 1.0f;
      const int32_t id = slot ? p.topk_ids[at] : 0;
      const int32_t row = slot ? p.expanded_to_permuted[at] : -1;
      const uint32_t key = RankKey(w);
      int rank = 0;
      for (int i = 0; i < k; ++i) {
        const uint32_t ki = __shfl_sync(kFullMask, key, i);
        const int32_t idi = __shfl_sync(kFullMask, id, i);
        rank += ki > key || (ki == key && (idi < id || (idi == id && i < lane)));
      }
      if (slot) {
        order_row[rank] = row;
        order_w[rank] = w;
      }
    }
    __syncthreads();
    for (int v = v_begin + static_cast<int>(threadIdx.x); v < v_end; v += kMoeFinalizeThreads) {
      float acc[8];
      if (p.accumulate) {
        UnpackBf16x8(out[t * vecs + v], acc);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
      }
      for (int r0 = 0; r0 < k; r0 += kBatch) {
        uint4 x[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int r = r0 + u;
          const int32_t row = r < k ? order_row[r] : -1;
          if (row >= 0) x[u] = __ldg(rows + static_cast<int64_t>(row) * vecs + v);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int r = r0 + u;
          if (r >= k || order_row[r] < 0) continue;  // not kept: adds nothing
          const float w = order_w[r];
          float f[8];
          UnpackBf16x8(x[u], f);
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[i] = fmaf(w, f[i], acc[i]);
        }
      }
      out[t * vecs + v] = PackBf16x8(acc);
    }
    __syncthreads();  // the order arrays are rewritten for the next token
  }
}

// ---------------------------------------------------------------------------------
// Quantization of activations (kernels/moe_layer_abi.h, MoeQuantizeParams, states the
// rounding rules). One CTA per item at a time (grid-stride over rows x col_parts items:
// a row, or a range of its passes); each thread owns 8 consecutive elements (one 16-byte
// load) per pass over the row, so a scale block of B elements is B/8 neighbouring lanes,
// reduced with xor shuffles among them. Every lane of a warp runs the same number of
// passes (the bound is rounded up to a whole pass), so the shuffles always see the full
// warp; lanes past K hold zeros and store nothing.

namespace cubist::moe {
namespace {

constexpr int kQuantPass = kMoeQuantizePassCols;  // elements of a row per pass

// kNvfp4Decoded: nvfp4's quantization, written as the bf16 values e2m1 x e4m3 scale of
// the codes and scales kNvfp4 writes (exact in bf16), for nvfp4 x bf16 GEMMs.
enum class QuantFormat { kFp8, kFp8Block, kMxfp8, kNvfp4, kNvfp4Decoded };

// Elements sharing one scale (fp8: none; reduce nothing).
template <QuantFormat F>
__host__ __device__ constexpr int QuantBlock() {
  return F == QuantFormat::kFp8Block ? 128 : F == QuantFormat::kMxfp8 ? 32
       : F == QuantFormat::kNvfp4 || F == QuantFormat::kNvfp4Decoded ? 16 : 8;
}

// amax over the block of `lanes` neighbouring lanes (a power of two, aligned); fmaxf
// drops NaN operands, so NaN elements are ignored.
template <int kLanes>
__device__ __forceinline__ float GroupMax(float v) {
#pragma unroll
  for (int o = 1; o < kLanes; o <<= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// e4m3 with round to nearest even, saturating (inf -> 448), NaN -> 0x7F.
__device__ __forceinline__ uint32_t E4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float E4m3Value(uint32_t code) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h) : "h"(static_cast<uint16_t>(code)));
  return __half2float(__ushort_as_half(static_cast<uint16_t>(h & 0xFFFF)));
}
// The bf16 row r of the quantizer's input, as a pointer to 16-byte vectors, and the
// weight to apply on it (1 when none).
__device__ __forceinline__ const uint4* QuantRow(const MoeQuantizeParams& p, int64_t r,
                                                 float* w) {
  int64_t src = r;
  *w = 1.0f;
  if (p.top_k > 0) {
    const int32_t slot = p.permuted_to_expanded[r];
    src = slot / p.top_k;
    if (p.weights != nullptr) *w = p.weights[slot];
  }
  return static_cast<const uint4*>(p.input) + src * (p.cols / 8);
}

template <QuantFormat F>
__device__ __forceinline__ void QuantizeRows(const MoeQuantizeParams& p) {
  constexpr int kBlock = QuantBlock<F>();
  constexpr int kLanes = kBlock / 8;
  constexpr bool kNv = F == QuantFormat::kNvfp4 || F == QuantFormat::kNvfp4Decoded;
  const int32_t rows = p.offsets[p.num_local_experts];
  const int cols = p.cols;
  const int passes = (cols + kQuantPass - 1) / kQuantPass;
  // Per-tensor factors, each computed once: fp8's rcp(s); nvfp4's g and rcp(g).
  float inv_s = 1.0f, g = 1.0f, inv_g = 1.0f;
  if constexpr (F == QuantFormat::kFp8) inv_s = __frcp_rn(p.scale[0]);
  if constexpr (kNv) {
    g = p.scale[0];
    inv_g = __frcp_rn(g);
    if (blockIdx.x == 0 && threadIdx.x == 0) p.global_out[0] = inv_g;
  }
  const float inv6 = __frcp_rn(6.0f);
  // Passes of a row are independent (a scale block never spans two), so the loads of
  // kQuantLoads passes are issued before the first is used: a row of DeepSeek-V3's 7168
  // columns is 7 passes, and one DRAM round trip each was most of a decode step's
  // quantization.
  constexpr int kQuantLoads = 8;
  // Items: a row's passes in col_parts ranges of `per_part` (the last ones may be empty).
  const int parts = max(1, p.col_parts);
  const int per_part = (passes + parts - 1) / parts;
  const int64_t items = static_cast<int64_t>(rows) * parts;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t r = item / parts;
    const int pass_begin = static_cast<int>(item - r * parts) * per_part;
    const int pass_end = min(passes, pass_begin + per_part);
    if (pass_begin >= pass_end) continue;
    float w;
    const uint4* src = QuantRow(p, r, &w);
    for (int p0 = pass_begin; p0 < pass_end; p0 += kQuantLoads) {
      uint4 raw[kQuantLoads];
#pragma unroll
      for (int u = 0; u < kQuantLoads; ++u) {
        const int c = (p0 + u) * kQuantPass + threadIdx.x * 8;
        if (p0 + u < pass_end && c < cols) raw[u] = __ldg(src + c / 8);
      }
#pragma unroll
      for (int u = 0; u < kQuantLoads; ++u) {
        const int pass = p0 + u;
        if (pass >= pass_end) break;  // uniform: every lane has the same passes
        const int c = pass * kQuantPass + threadIdx.x * 8;
        const bool here = c < cols;
        float x[8];
        if (here) {
          UnpackBf16x8(raw[u], x);
          if (p.weights != nullptr) {  // fp32 product, rounded to bf16 as the bf16 gather
#pragma unroll
            for (int i = 0; i < 8; ++i) x[i] = __bfloat162float(__float2bfloat16_rn(x[i] * w));
          }
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i) x[i] = 0.0f;
        }
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(x[i]));
        if constexpr (kLanes > 1) amax = GroupMax<kLanes>(amax);
        const bool first = here && (threadIdx.x % kLanes) == 0;
        float f = 1.0f;    // the factor each element is multiplied by
        float sfv = 0.0f;  // nvfp4: the block scale's value
        if constexpr (F == QuantFormat::kFp8) {
          f = inv_s;
        } else if constexpr (F == QuantFormat::kFp8Block) {
          const float s = __fdiv_rn(fmaxf(amax, 1e-4f), 448.0f);
          f = __frcp_rn(s);
          if (first) static_cast<float*>(p.out_scale)[r * ((cols + 127) / 128) + c / 128] = s;
        } else if constexpr (F == QuantFormat::kMxfp8) {
          const int biased = static_cast<int>((__float_as_uint(amax) >> 23) & 0xFF);
          const int byte = biased > 8 ? biased - 8 : 0;
          f = __uint_as_float(static_cast<uint32_t>(254 - byte) << 23);  // 2^(127 - byte)
          if (first) static_cast<uint8_t*>(p.out_scale)[r * (cols / 32) + c / 32] = byte;
        } else {
          const uint32_t sf = E4m3x2(__fmul_rn(g, __fmul_rn(amax, inv6)), 0.0f) & 0xFF;
          sfv = E4m3Value(sf);
          f = sfv != 0.0f ? __frcp_rn(__fmul_rn(sfv, inv_g)) : 0.0f;
          if (F == QuantFormat::kNvfp4 && first) {
            static_cast<uint8_t*>(p.out_scale)[r * (cols / 16) + c / 16] = sf;
          }
        }
        if (!here) continue;
        float q[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) q[i] = __fmul_rn(x[i], f);
        if constexpr (F == QuantFormat::kNvfp4Decoded) {
          // The code's value times the block scale: at most 2 + 4 significant bits, so
          // the fp32 product and its bf16 are exact.
          uint32_t v[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            v[i] = PackBf16x2(__fmul_rn(E2m1Value(E2m1Code(q[2 * i])), sfv),
                              __fmul_rn(E2m1Value(E2m1Code(q[2 * i + 1])), sfv));
          }
          static_cast<uint4*>(p.out)[(r * cols + c) / 8] = make_uint4(v[0], v[1], v[2], v[3]);
        } else if constexpr (F == QuantFormat::kNvfp4) {
          uint32_t packed = 0;
#pragma unroll
          for (int i = 0; i < 8; ++i) packed |= E2m1Code(q[i]) << (4 * i);
          static_cast<uint32_t*>(p.out)[(r * cols + c) / 8] = packed;
        } else {
          const uint2 v = make_uint2(E4m3x2(q[0], q[1]) | E4m3x2(q[2], q[3]) << 16,
                                     E4m3x2(q[4], q[5]) | E4m3x2(q[6], q[7]) << 16);
          static_cast<uint2*>(p.out)[(r * cols + c) / 8] = v;
        }
      }
    }
  }
}

}  // namespace
}  // namespace cubist::moe

// One entry point per output format (the manifest names each function).
#define CUBIST_MOE_QUANTIZE_KERNEL(name, format)                                     \
  extern "C" __global__ void __launch_bounds__(kMoeQuantizeThreads)                  \
      name(const __grid_constant__ MoeQuantizeParams p) {                            \
    GridDependencyWait();                                                            \
    LaunchDependents();                                                              \
    QuantizeRows<QuantFormat::format>(p);                                            \
  }
CUBIST_MOE_QUANTIZE_KERNEL(cubist_moe_quantize_fp8, kFp8)
CUBIST_MOE_QUANTIZE_KERNEL(cubist_moe_quantize_fp8_block, kFp8Block)
CUBIST_MOE_QUANTIZE_KERNEL(cubist_moe_quantize_mxfp8, kMxfp8)
CUBIST_MOE_QUANTIZE_KERNEL(cubist_moe_quantize_nvfp4, kNvfp4)
CUBIST_MOE_QUANTIZE_KERNEL(cubist_moe_quantize_nvfp4_decoded, kNvfp4Decoded)
#undef CUBIST_MOE_QUANTIZE_KERNEL

// ---------------------------------------------------------------------------------
// The expert-major masked layout (kernels/moe_layer_abi.h, MoeMaskedParams): the scan of
// the clamped counts into offsets and the row map, and the scatter of GEMM2's rows back
// into [L, max_m, H].

namespace cubist::moe {
namespace {

using ScanMasked = cub::BlockScan<int32_t, kMoeMaskedThreads>;
constexpr int kMaskedScanItems = (kMoeSortMaxExperts + kMoeMaskedThreads - 1) / kMoeMaskedThreads;

__device__ __forceinline__ int32_t ClampedCount(const MoeMaskedParams& p, int e) {
  return min(max(p.counts[e], 0), p.max_m);
}

}  // namespace
}  // namespace cubist::moe

// Every CTA scans the L clamped counts (a few thousand at most) itself, so no CTA waits
// for another; each then writes the row map of its experts.
extern "C" __global__ void __launch_bounds__(kMoeMaskedThreads)
    cubist_moe_sort_masked(const __grid_constant__ MoeMaskedParams p) {
  __shared__ ScanMasked::TempStorage scan;
  __shared__ int32_t offsets[kMoeSortMaxExperts + 1];
  GridDependencyWait();
  LaunchDependents();
  const int L = max(0, min(p.num_local_experts, kMoeSortMaxExperts));
  int32_t items[kMaskedScanItems];
  const int first = threadIdx.x * kMaskedScanItems;  // blocked: thread i owns a run
#pragma unroll
  for (int j = 0; j < kMaskedScanItems; ++j) {
    items[j] = first + j < L ? ClampedCount(p, first + j) : 0;
  }
  int32_t total;
  ScanMasked(scan).ExclusiveSum(items, items, total);
#pragma unroll
  for (int j = 0; j < kMaskedScanItems; ++j) {
    if (first + j < L) offsets[first + j] = items[j];
  }
  if (threadIdx.x == 0) offsets[L] = total;
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int e = threadIdx.x; e <= L; e += kMoeMaskedThreads) p.offsets[e] = offsets[e];
  }
  for (int e = blockIdx.x; e < L; e += gridDim.x) {
    const int32_t base = offsets[e], n = offsets[e + 1] - base;
    const int32_t row0 = e * p.max_m;  // L x max_m fits int32 (the host checks)
    for (int i = threadIdx.x; i < n; i += kMoeMaskedThreads) p.row_map[base + i] = row0 + i;
  }
}

// Rows in a grid-stride loop, 16-byte vectors; rows past a count are never touched.
extern "C" __global__ void __launch_bounds__(kMoeMaskedThreads)
    cubist_moe_finalize_masked(const __grid_constant__ MoeMaskedParams p) {
  GridDependencyWait();
  LaunchDependents();
  const int32_t rows = p.offsets[p.num_local_experts];
  const int vecs = p.hidden / 8;
  const uint4* __restrict__ in = static_cast<const uint4*>(p.rows);
  uint4* __restrict__ out = static_cast<uint4*>(p.out);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const uint4* src = in + r * vecs;
    uint4* dst = out + static_cast<int64_t>(p.row_map[r]) * vecs;
    for (int v = threadIdx.x; v < vecs; v += kMoeMaskedThreads) dst[v] = __ldg(src + v);
  }
}
