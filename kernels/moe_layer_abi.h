// The parameter ABI of the routed MoE layer's own kernels: routing, the sort of token
// slots by expert, the gather of token rows, and the weighted finalize. The layer's two
// GEMMs are moe_gemm kernels (kernels/moe_gemm_abi.h); these kernels are the glue around
// them, published in the same manifest as ops of their own:
//
//   op            function                 parameter          what it does
//   moe_route     cubist_moe_route         MoeRouteParams     logits [T, E] -> ids, weights [T, k]
//   moe_route     cubist_moe_route_sort    MoeRouteSortParams route + fused sort, one CTA (decode)
//   moe_sort      cubist_moe_sort_fused    MoeSortParams      ids -> offsets, permutation (one CTA)
//   moe_sort      cubist_moe_sort_count    MoeSortParams      per-chunk expert counts
//   moe_sort      cubist_moe_sort_scan     MoeSortParams      chunk bases and offsets (one CTA)
//   moe_sort      cubist_moe_sort_scatter  MoeSortParams      permutation of each chunk
//   moe_sort      cubist_moe_sort_masked   MoeMaskedParams    counts [L] -> offsets, row map
//   moe_gather    cubist_moe_gather_bf16   MoeGatherParams    token rows in expert order
//   moe_finalize  cubist_moe_finalize      MoeFinalizeParams  weighted sum of each token's rows
//   moe_finalize  cubist_moe_finalize_masked  MoeMaskedParams  rows back to [L, max_m, H]
//   moe_quantize  cubist_moe_quantize_fp8  MoeQuantizeParams  bf16 rows -> fp8, per-tensor scale
//   moe_quantize  cubist_moe_quantize_fp8_block  (same)    -> fp8 with 1x128 block scales
//   moe_quantize  cubist_moe_quantize_mxfp8      (same)    -> mxfp8 (ue8m0 per 32)
//   moe_quantize  cubist_moe_quantize_nvfp4      (same)    -> nvfp4 (e4m3 per 16, global scale)
//   moe_quantize  cubist_moe_quantize_nvfp4_decoded  (same) -> nvfp4's values as bf16
//
// Every kernel takes its struct by value as the only parameter, like moe_gemm. Host
// code (dispatch/moe_layer.cc, the CPU reference, tests) and device code
// (kernels/moe_layer.cu) include this header; plain C++17, no CUDA header, no state.
//
// Versions: each struct starts with `abi`; kMoeLayerAbi is recorded in every kernel's
// manifest entry ("abi"). A change to a struct's layout or a field's meaning is a new
// version; a new function with a struct of its own is not (the masked-layout kernels
// came later than the others: a manifest without them serves every mode but the masked
// one, and the layer says which function is missing).
#ifndef CUBIST_KERNELS_MOE_LAYER_ABI_H_
#define CUBIST_KERNELS_MOE_LAYER_ABI_H_

#include <stddef.h>  // offsetof
#include <stdint.h>

#include "kernels/moe_gemm_abi.h"  // CUBIST_HD

namespace cubist::moe {

inline constexpr int kMoeLayerAbi = 1;
inline constexpr char kMoeRouteOp[] = "moe_route";
inline constexpr char kMoeSortOp[] = "moe_sort";
inline constexpr char kMoeGatherOp[] = "moe_gather";
inline constexpr char kMoeFinalizeOp[] = "moe_finalize";
inline constexpr char kMoeQuantizeOp[] = "moe_quantize";

// Limits of the routing kernel: the logits of one token sit in shared memory (E fp32),
// the chosen experts in registers.
inline constexpr int32_t kMoeRouteMaxExperts = 4096;
inline constexpr int32_t kMoeRouteMaxTopK = 32;
// Token slots (T x k) one sort CTA ranks; fewer slots than this sort in one launch
// (cubist_moe_sort_fused), more in three (count, scan, scatter) over chunks of this size.
inline constexpr int32_t kMoeSortChunk = 4096;
// Local experts the sort kernels can count (a shared-memory histogram).
inline constexpr int32_t kMoeSortMaxExperts = 4096;

// Routing methods. Every interface outside this header uses the names
// (MoeRoutingMethodName): projects number them differently.
//
// Notation: x = the token's logits in fp32 (bf16 logits widened exactly), E experts.
// Selection ("top-k of s"): the k largest of s in descending order; equal values go to
// the lower expert index; a NaN ranks below every number, -inf included. Softmax over a
// set S: m = max over S, p_i = exp(x_i - m) / sum_{j in S} exp(x_j - m); a NaN logit
// counts as -inf in every sum and maximum, so its probability is 0 (and, were it chosen,
// its weight 0). sigmoid(x) = 1 / (1 + exp(-x)).
//   default            ids = top-k of x; weights = softmax over all E of the chosen
//   renormalize        ids = top-k of x; weights = softmax over the k chosen
//   renormalize_naive  ids = top-k of x; w = softmax over all E, then w_i / sum of the k
//   deepseek_v3        s = sigmoid(x) + bias (bias 0 when absent); experts in n_group
//                      equal groups; a group's score = the sum of its two largest s; the
//                      topk_group best groups (ties: lower group) are kept; ids = top-k
//                      of s within the kept groups; weights = sigmoid(x_i) /
//                      (sum over the chosen of sigmoid(x_j) + 1e-20) x routed_scaling_factor
//   llama4             k = 1; ids = top-1 of x; weight = sigmoid(x_id)
//   topk               ids = top-k of x; weights = x (the raw logits)
//   sigmoid            ids = top-k of x; weights = sigmoid(x)
//   sigmoid_renorm     ids = top-k of x; weights = sigmoid(x_i) / sum of the chosen
// Since softmax and sigmoid are increasing, every method but deepseek_v3 selects on the
// logits themselves: the ids do not depend on how exp rounds. Weights come out in the
// selection's order: descending score, ties to the lower id ("slot order").
enum MoeRoutingMethod : int32_t {
  kRouteDefault = 0,
  kRouteRenormalize = 1,
  kRouteRenormalizeNaive = 2,
  kRouteDeepSeekV3 = 3,
  kRouteLlama4 = 4,
  kRouteTopK = 5,
  kRouteSigmoid = 6,
  kRouteSigmoidRenorm = 7,
};
inline constexpr int32_t kMoeRoutingMethods = 8;

inline const char* MoeRoutingMethodName(MoeRoutingMethod m) {
  switch (m) {
    case kRouteDefault: return "default";
    case kRouteRenormalize: return "renormalize";
    case kRouteRenormalizeNaive: return "renormalize_naive";
    case kRouteDeepSeekV3: return "deepseek_v3";
    case kRouteLlama4: return "llama4";
    case kRouteTopK: return "topk";
    case kRouteSigmoid: return "sigmoid";
    case kRouteSigmoidRenorm: return "sigmoid_renorm";
  }
  return "?";
}

// cubist_moe_route: one warp per token; grid = ceil(T / warps per CTA) CTAs of
// kMoeRouteThreads threads, dynamic shared memory MoeRouteSharedBytes(E) (past 48 KiB,
// E > 3072, the launcher raises the function's dynamic shared memory limit first).
inline constexpr int32_t kMoeRouteThreads = 128;
CUBIST_HD constexpr int32_t MoeRouteSharedBytes(int32_t num_experts) {
  return (kMoeRouteThreads / 32) * num_experts * 4;
}
struct MoeRouteParams {
  int32_t abi;           // kMoeLayerAbi
  int32_t method;        // MoeRoutingMethod
  int32_t num_tokens;    // T >= 0
  int32_t num_experts;   // E, 1..kMoeRouteMaxExperts
  int32_t top_k;         // 1..min(E, kMoeRouteMaxTopK); 1 for llama4
  int32_t logits_bf16;   // 0: logits are fp32, 1: bf16
  int32_t n_group;       // deepseek_v3: groups (E % n_group == 0), else 0
  int32_t topk_group;    // deepseek_v3: groups kept (1..n_group), else 0
  float routed_scaling_factor;  // deepseek_v3 (1 elsewhere; ignored)
  int32_t reserved0;
  const void* logits;    // [T, E] fp32 or bf16, rows dense
  const float* bias;     // [E] or null (deepseek_v3 only)
  int32_t* topk_ids;     // [T, k] out: global expert ids, slot order
  float* topk_weights;   // [T, k] out
  int64_t reserved[2];
};
static_assert(sizeof(MoeRouteParams) == 88, "MoeRouteParams layout is ABI");

// The sort: the T x k slots (slot s = t * k + j) are grouped by local expert
// (id - local_expert_offset, kept when in 0..num_local_experts-1), stably: within an
// expert, slots keep their order. Outputs:
//   offsets[0..L]              int32, offsets[0] = 0, offsets[L] = kept slots (L local experts)
//   expanded_to_permuted[s]    the slot's row in expert order, or -1 when not kept
//   permuted_to_expanded[r]    the slot of row r, for r < offsets[L]
//   dropped[0]                 slots whose id is outside 0..num_experts-1: not kept
//                              (-1 in expanded_to_permuted, so no later kernel reads
//                              or writes anything for them) and counted here; the
//                              fused or the scan kernel stores the count (no zeroing
//                              needed), the caller may read it
// Grids: fused = 1 CTA when T x k <= kMoeSortChunk; otherwise count and scatter run
// MoeSortChunks(T x k) CTAs and scan one CTA, all of kMoeSortThreads threads. The count
// kernel writes chunk_counts[c * (L + 1) + e] (e = L: the chunk's dropped slots); the
// scan turns them into chunk bases in place and writes offsets and dropped.
inline constexpr int32_t kMoeSortThreads = 1024;
CUBIST_HD constexpr int64_t MoeSortChunks(int64_t slots) {
  return (slots + kMoeSortChunk - 1) / kMoeSortChunk;
}
struct MoeSortParams {
  int32_t abi;                  // kMoeLayerAbi
  int32_t num_slots;            // T x k >= 0
  int32_t top_k;                // k
  int32_t num_experts;          // E (global)
  int32_t local_expert_offset;  // first local expert's global id
  int32_t num_local_experts;    // L, 1..kMoeSortMaxExperts
  const int32_t* topk_ids;      // [T, k]
  int32_t* offsets;             // [L + 1] out
  int32_t* expanded_to_permuted;  // [T x k] out
  int32_t* permuted_to_expanded;  // [T x k] out
  int32_t* chunk_counts;        // [MoeSortChunks(T x k), L + 1] workspace (multi-CTA only)
  int32_t* dropped;             // [1] out
  int64_t reserved[2];
};
static_assert(sizeof(MoeSortParams) == 88, "MoeSortParams layout is ABI");

// cubist_moe_route_sort: decode's route and sort in one launch - one CTA of
// kMoeSortThreads threads, warp t routing token t as cubist_moe_route does, then the sort
// of cubist_moe_sort_fused - for T <= kMoeRouteSortMaxTokens and T x k <= 256 (the small
// sort; MoeRouteSortServes). Dynamic shared memory MoeRouteSortSharedBytes(T, E) (past 48
// KiB the launcher raises the function's limit). `route` and `sort` are filled as for the
// two kernels (sort.topk_ids = route.topk_ids). Optional: a manifest without it gets the
// two launches.
inline constexpr int32_t kMoeRouteSortMaxTokens = kMoeSortThreads / 32;
inline constexpr int32_t kMoeRouteSortMaxSlots = 256;
inline constexpr int32_t kMoeRouteSortMaxSharedBytes = 96 * 1024;
CUBIST_HD constexpr int32_t MoeRouteSortSharedBytes(int64_t tokens, int32_t num_experts) {
  return static_cast<int32_t>(tokens) * num_experts * 4;
}
CUBIST_HD constexpr bool MoeRouteSortServes(int64_t tokens, int32_t top_k, int32_t num_experts) {
  return tokens >= 1 && tokens <= kMoeRouteSortMaxTokens &&
         tokens * top_k <= kMoeRouteSortMaxSlots &&
         static_cast<int64_t>(tokens) * num_experts * 4 <= kMoeRouteSortMaxSharedBytes;
}
struct MoeRouteSortParams {
  MoeRouteParams route;
  MoeSortParams sort;
};
static_assert(sizeof(MoeRouteSortParams) == 176, "MoeRouteSortParams layout is ABI");

// cubist_moe_gather_bf16: row r of `out` = the bf16 hidden row of the token of slot
// permuted_to_expanded[r], for r < offsets[L]; with `weights` set, multiplied by the
// slot's routing weight in fp32 and rounded to bf16 (nearest even): the llama4
// apply-weight-on-input mode. Grid: any number of CTAs of kMoeGatherThreads threads,
// rows taken in a grid-stride loop (the row count is read on the device).
inline constexpr int32_t kMoeGatherThreads = 128;
struct MoeGatherParams {
  int32_t abi;          // kMoeLayerAbi
  int32_t hidden;       // H, a multiple of 8
  int32_t top_k;        // k
  int32_t num_local_experts;  // L (offsets[L] = rows)
  const void* input;    // [T, H] bf16
  const int32_t* offsets;
  const int32_t* permuted_to_expanded;
  const float* weights;  // [T, k] or null
  void* out;            // [rows, H] bf16
  void* out_scale;      // reserved for quantizing gathers (null for bf16)
  int64_t reserved[2];
};
static_assert(sizeof(MoeGatherParams) == 80, "MoeGatherParams layout is ABI");

// cubist_moe_finalize: for each token t,
//   out[t] = bf16( [accumulate ? float(out[t]) : 0] + sum over its kept slots, in slot
//            order, of w x float(rows[expanded_to_permuted[slot]]) )
// in fp32, one rounding at the end. Slot order: weight descending, equal weights to the
// lower expert id (the finalize kernel orders the token's k slots itself, so pre-routed
// input in any order sums the same way). w = the routing weight, or 1 when the weight
// was applied on input (`unit_weights`; then every w is 1, so the ids alone order the
// slots, and topk_weights is not read: it may be null). NaN weights order below every
// number, -0 equals +0, a repeated id keeps slot order. A token with no kept slot gets
// 0 (or keeps out when accumulating). The same bits on every run for the same GPU and
// kernels.
// Grid: T CTAs of kMoeFinalizeThreads threads (a token per CTA, grid-stride when fewer),
// or S x T CTAs with S >= 2: CTA b sums part b % S of token b / S's columns (S ranges of
// ceil(H/8 / S) 16-byte vectors). A kernel from before the split runs such a grid as
// T CTAs plus idle ones, so either grid is correct with either kernel; the bits never
// depend on it. MoeFinalizeCtas is the layer's choice.
inline constexpr int32_t kMoeFinalizeThreads = 128;
// How many parts each of `rows` rows is split into for the finalize and quantize grids:
// up to `want`, while parts x rows fits twice the SMs; 1 when that is fewer than 2.
CUBIST_HD constexpr int64_t MoeRowParts(int64_t want, int64_t rows, int32_t sm_count) {
  const int64_t fit = rows > 0 ? 2 * static_cast<int64_t>(sm_count) / rows : 0;
  const int64_t parts = want < fit ? want : fit;
  return parts >= 2 ? parts : 1;
}
// S x T when the columns give each thread of S CTAs a vector and S x T fits twice the SMs
// (decode: DeepSeek-V3's H = 7168 is 7 CTAs per token up to 37 tokens on 132 SMs), else T.
CUBIST_HD constexpr int64_t MoeFinalizeCtas(int64_t tokens, int32_t hidden, int32_t sm_count) {
  const int64_t want = (hidden / 8 + kMoeFinalizeThreads - 1) / kMoeFinalizeThreads;
  return MoeRowParts(want, tokens, sm_count) * tokens;
}
struct MoeFinalizeParams {
  int32_t abi;          // kMoeLayerAbi
  int32_t num_tokens;   // T
  int32_t hidden;       // H, a multiple of 8
  int32_t top_k;        // k, 1..kMoeRouteMaxTopK
  int32_t accumulate;   // 1: add into out
  int32_t unit_weights;  // 1: weights were applied on input
  const void* rows;     // [T x k, H] bf16 (GEMM2's output, expert order)
  const int32_t* topk_ids;       // [T, k]
  const float* topk_weights;     // [T, k] (null allowed with unit_weights)
  const int32_t* expanded_to_permuted;  // [T x k]
  void* out;            // [T, H] bf16
  int64_t reserved[2];
};
static_assert(sizeof(MoeFinalizeParams) == 80, "MoeFinalizeParams layout is ABI");

// The quantization of activations for the quantized format pairs: GEMM1's input (the
// token rows, gathered into expert order on the way) and GEMM2's input (GEMM1's bf16
// output, already in expert order). One function per output format; each reads bf16 rows
// [.., K] and writes the elements and block scales of one moe_gemm activation format
// (kernels/moe_gemm_abi.h: row-major, K contiguous, scales [rows, K/block]).
//
// Rows: r = 0 .. offsets[L] - 1 (read on the device). With `top_k` > 0 row r is input
// row permuted_to_expanded[r] / top_k (the gather); with top_k = 0 it is input row r.
// With `weights` set (the gather only), the row is first multiplied by the slot's weight
// in fp32 and rounded to bf16, exactly as cubist_moe_gather_bf16 does.
//
// Rounding, bit for bit the same in the CPU reference (dispatch/moe_quantize_reference.h).
// Every product and quotient is one fp32 operation rounded to nearest even; rcp(v) is the
// correctly rounded 1/v; amax is the largest |x| of the block, NaN elements ignored
// (an all-NaN block has amax 0); e4m3(v) rounds to nearest even and saturates to +-448
// (+-inf too), NaN -> 0x7F; e2m1(v) rounds to nearest even and saturates to +-6, NaN -> 0,
// the sign kept (so -0 is 0x8).
//   fp8        scale[0] = s, the caller's dequantization scale (x ~ q * s):
//              q = e4m3(x * rcp(s)), rcp(s) computed once.
//   fp8_block  per 1x128 block (the last one partial when K % 128 != 0):
//              s = max(amax, 1e-4) / 448; out_scale = s (fp32); q = e4m3(x * rcp(s)).
//   mxfp8      per 32: the OCP MX shared exponent floor(log2 amax) - 8, from amax's fp32
//              exponent field: byte = max(biased_exponent(amax) - 8, 0) (an all-zero
//              block gets 0, an infinite amax 247); q = e4m3(x * 2^(127 - byte)), exact.
//   nvfp4      scale[0] = g, the caller's global quantization scale in FlashInfer's
//              convention (g = 448 x 6 / amax of the tensor; x ~ q x sf / g): per 16,
//              sf = e4m3(g * (amax * rcp(6))); f = sf != 0 ? rcp(float(sf) * rcp(g)) : 0;
//              q = e2m1(x * f), two per byte, low nibble first. FlashInfer's fp4_quantize
//              computes the same with rcp.approx in place of rcp. `global_out`[0] =
//              rcp(g): the dequantization scale the GEMM reads as its a_global_scale.
//   nvfp4_decoded  nvfp4's q and sf as above, written as bf16 [rows, K] values
//              value(q) * float(sf) (exact: at most 2 x 4 significant bits; out_scale
//              unused), and global_out[0] = rcp(g): the input of an nvfp4 x bf16 GEMM
//              whose a_global_scale is rcp(g) computes what the nvfp4 x nvfp4 GEMM does
//              from nvfp4's bytes (the layer's nvfp4_gemm_inputs).
// Grid: any number of CTAs of kMoeQuantizeThreads threads. A CTA quantizes a pass of
// kMoeQuantizePassCols columns at a time (a scale block never spans two passes). With
// `col_parts` = S >= 2 each row is S items, item i covering passes
// [i * ceil(P / S), (i + 1) * ceil(P / S)) of the row's P (some may be empty), and the
// CTAs take the rows x S items in a grid-stride loop; with 0 or 1, whole rows. A kernel
// from before the split reads col_parts as reserved and quantizes whole rows of the same
// grid: either kernel is correct with either grid, and the bytes never depend on it.
// MoeQuantizeParts is the layer's choice.
inline constexpr int32_t kMoeQuantizeThreads = 128;
inline constexpr int32_t kMoeQuantizePassCols = kMoeQuantizeThreads * 8;
// S when a row holds at least two passes and S x rows fits twice the SMs (decode:
// Mixtral's 14,336-column intermediate is 14 passes, one after another in one CTA per
// row without the split), else 1.
CUBIST_HD constexpr int32_t MoeQuantizeParts(int64_t rows, int32_t cols, int32_t sm_count) {
  const int64_t passes = (static_cast<int64_t>(cols) + kMoeQuantizePassCols - 1) /
                         kMoeQuantizePassCols;
  return static_cast<int32_t>(MoeRowParts(passes, rows, sm_count));
}
struct MoeQuantizeParams {
  int32_t abi;          // kMoeLayerAbi
  int32_t cols;         // K, a multiple of 8 (fp8_block), 32 (mxfp8), 16 (nvfp4)
  int32_t top_k;        // k for a gather, 0 for rows in place
  int32_t num_local_experts;  // L (offsets[L] = rows)
  const void* input;    // bf16 [.., K]
  const int32_t* offsets;               // [L + 1]
  const int32_t* permuted_to_expanded;  // [rows] (gather only)
  const float* weights;  // [T, k] or null (gather only)
  const float* scale;    // [1]: fp8's s or nvfp4's g; null for fp8_block and mxfp8
  void* out;             // [rows, K] elements (nvfp4: [rows, K/2])
  void* out_scale;       // block scales, or null (fp8)
  float* global_out;     // nvfp4: [1] out, rcp(g); else null
  int32_t col_parts;     // S: items per row (0 or 1: whole rows)
  int32_t reserved32;
  int64_t reserved;
};
static_assert(sizeof(MoeQuantizeParams) == 96, "MoeQuantizeParams layout is ABI");
static_assert(offsetof(MoeQuantizeParams, col_parts) == 80, "col_parts was reserved[0]");

// The expert-major masked layout that low-latency all-to-all libraries deliver (DeepEP's
// low-latency dispatch, DeepGEMM's m_grouped_*_masked): hidden states [L, max_m, H] and
// per-expert counts [L]; rows i < count of expert e's slot are valid, the rest padding.
// The layer compacts the valid rows so the moe_gemm kernels see contiguous experts, and
// writes GEMM2's rows back into the same layout. A count is clamped to 0..max_m first
// (a bad count never reads or writes outside its expert's slot).
//
// cubist_moe_sort_masked: c_e = min(max(counts[e], 0), max_m);
//   offsets[e] = c_0 + ... + c_{e-1}, offsets[L] = the valid rows;
//   row_map[offsets[e] + i] = e * max_m + i for i < c_e (the row of [L x max_m, H]).
// The gather (cubist_moe_gather_bf16, or a quantize kernel) then reads input row
// row_map[r] with top_k = 1: row_map is its permuted_to_expanded.
// Grid: any number of CTAs of kMoeMaskedThreads threads; each computes the scan in
// shared memory (L <= kMoeSortMaxExperts) and writes the row map of experts blockIdx.x,
// blockIdx.x + gridDim.x, ...; CTA 0 writes offsets.
//
// cubist_moe_finalize_masked: out row row_map[r] = rows[r] (bf16, H wide) for
// r < offsets[L]; every other row of out is left as it was. Grid: any number of CTAs of
// kMoeMaskedThreads threads (rows in a grid-stride loop).
inline constexpr int32_t kMoeMaskedThreads = 128;
struct MoeMaskedParams {
  int32_t abi;                // kMoeLayerAbi
  int32_t num_local_experts;  // L, 1..kMoeSortMaxExperts
  int32_t max_m;              // rows per expert slot, L x max_m <= INT32_MAX
  int32_t hidden;             // H, a multiple of 8 (finalize)
  const int32_t* counts;      // [L] (sort)
  int32_t* offsets;           // [L + 1]: out of the sort, read by the finalize
  int32_t* row_map;           // [L x max_m]: out of the sort, read by the finalize
  const void* rows;           // [rows, H] bf16: GEMM2's output (finalize)
  void* out;                  // [L, max_m, H] bf16 (finalize)
  int64_t reserved[2];
};
static_assert(sizeof(MoeMaskedParams) == 72, "MoeMaskedParams layout is ABI");

}  // namespace cubist::moe

#endif  // CUBIST_KERNELS_MOE_LAYER_ABI_H_
