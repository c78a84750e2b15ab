// The parameter ABI of the "moe_gemm" kernel family: the one struct every kernel takes
// by value, the format and activation vocabularies, the launch-grid rule and the shape
// requirements. Host code (the dispatcher, tests, benchmarks) and device code
// (kernels/moe_gemm_tma.cu, moe_gemm_fp4.cu, moe_gemm_fp4_fp8.cu) include this same
// header, so it is plain C++17 that compiles under nvcc and g++ without any CUDA header,
// and it holds no state.
//
// The operation (docs/kernels.md):
//   tokens are sorted by expert; expert e owns rows offsets[e] .. offsets[e+1]-1 of A
//   [T, K]; its weights are B[e] = [N, K] (K contiguous, "TN"); C = A_e * B_e^T in fp32
//   after dequantisation, plus the expert's bias row when given (version 3); out =
//   act(C) in bf16, [T, N] or, for gated activations, [T, N/2] with x0 = C[:, 0:N/2]
//   (linear) and x1 = C[:, N/2:N] (gate). Kernels whose manifest entry says
//   "output_format": "fp8" (version 4) write e4m3 instead: out = the saturating,
//   round-to-nearest-even e4m3 of float(bf16(act(C))) x (1 / out_scale[0]), the
//   reciprocal computed once in fp32 - the bytes the layer's fp8 quantizer
//   (kernels/moe_layer_abi.h) makes of the bf16 output.
//
// Versions: every kernel's manifest entry records the version of the parameter struct it
// takes ("abi"). Any change to a struct's layout or to the meaning of a field is a new
// version; a dispatcher fills versions kMoeGemmAbiOldest to kMoeGemmAbi and refuses the
// others.
//   1  retired: MoeGemmParams alone, one CTA per (M tile, N tile) (generation 1, cp.async
//      main loops). Generation 2 served every problem it did, faster; a manifest entry of
//      version 1 is refused with kMoeGemmAbiRetiredFix.
//   2  MoeGemmParamsV2 = MoeGemmParams plus TMA tensor maps of A and B built by the host;
//      a persistent grid, MoeGemmPersistentGridFor (kernels/moe_gemm_tma.cu)
//   3  version 2's struct, whose kernels also add `bias` (fp32 [E, N]: one value per
//      expert and B row, both halves when gated) to C after the global scales, before
//      the activation. Version 2 never reads the field (it was reserved, 0): a problem
//      with a bias needs a version-3 kernel.
//   4  version 3's struct (same size and layout), whose reserved[0] became `out_scale`:
//      the fp32 [1] dequantization scale of an fp8 output. Only kernels whose entry says
//      "output_format": "fp8" are built as version 4, and they require it; every
//      kernel writing bf16 stays version 3 and never reads it (null). fp8-output kernels
//      take a version of their own so that a dispatcher that predates them (versions up
//      to 3, no notion of an output format) refuses them instead of selecting one for a
//      bf16 problem and reading its e4m3 bytes as bf16.
//   5  version 4's struct grown by the gather of A (a_row_map, a_row_divisor, a_rows: 16
//      bytes that were MoeGemmParamsV2's padding, so every older field keeps its offset).
//      Only kernels whose entry says "a_gather": true are built as version 5, and they
//      require the map: row r of the problem reads A's row a_row_map[r] / a_row_divisor
//      of a_rows, so that the MoE layer's GEMM1 reads the token rows where they are
//      instead of a gathered copy. Every other kernel stays version 3 or 4 and never
//      reads the fields (null and 0); a dispatcher that predates them refuses version 5
//      instead of selecting a gathering kernel for rows in order.
#ifndef CUBIST_KERNELS_MOE_GEMM_ABI_H_
#define CUBIST_KERNELS_MOE_GEMM_ABI_H_

#include <stdint.h>

#if defined(__CUDACC__)
#define CUBIST_HD __host__ __device__
#else
#define CUBIST_HD
#endif

namespace cubist::moe {

inline constexpr int kMoeGemmAbiV2 = 2;
inline constexpr int kMoeGemmAbiV3 = 3;
inline constexpr int kMoeGemmAbiV4 = 4;
inline constexpr int kMoeGemmAbiV5 = 5;
inline constexpr int kMoeGemmAbi = 5;  // the newest version
static_assert(kMoeGemmAbi == kMoeGemmAbiV5, "kMoeGemmAbi names the newest version");
inline constexpr int kMoeGemmAbiOldest = kMoeGemmAbiV2;  // the oldest one still launched
inline constexpr int kMoeGemmAbiRetiredV1 = 1;  // generation 1's, refused with the fix below
// What to do with a kernel of a retired version (below kMoeGemmAbiOldest): the message's
// tail wherever one is refused (the dispatcher's selection and launch, MoeGemmCheck).
inline constexpr char kMoeGemmAbiRetiredFix[] =
    "parameter struct version 1 (generation 1) is retired and no longer launched; rebuild "
    "the family with scripts/build-artifacts (manifest version 3 and later: version-3 "
    "kernels only)";
inline constexpr char kMoeGemmOp[] = "moe_gemm";

// Element formats of A (activations) and B (weights). Names match the manifest's
// weight_format / activation_format vocabulary (FormatName).
//   kBf16      bf16, no scale.
//   kFp8       e4m3; one fp32 scale per tensor (A) and per expert (B), passed as
//              a_global_scale[1] and b_global_scale[E]; applied in the epilogue.
//   kFp8Block  e4m3 with DeepSeek block scales, fp32, row-major:
//              a_scale [T, ceil(K/128)] (1x128 blocks), b_scale [E, ceil(N/128),
//              ceil(K/128)] (128x128 blocks).
//   kMxfp8     e4m3 with ue8m0 scales per 32 along K: a_scale [T, K/32] bytes.
//   kMxfp4     e2m1, two per byte, low nibble first (element 2i in bits 0-3),
//              ue8m0 scale per 32 along K: b_scale [E, N, K/32] bytes.
//   kNvfp4     e2m1, two per byte, e4m3 scale per 16 along K ([rows, K/16] bytes),
//              times one fp32 global scale: a_global_scale[1], b_global_scale[E].
// ue8m0 byte s means 2^(s-127); s = 0xFF is NaN. Every decoded value is
// element * block scale * global scale (each factor 1 where the format has none).
// The last two are names only, for kernel sets imported from elsewhere (trtllm-gen):
// no moe_gemm kernel takes them (MoeGemmEncodes), and the dispatcher never launches
// them; they live here so that the whole project has one format vocabulary.
//   kFp16      fp16, no scale.
//   kMxint4    int4 with ue8m0 scales per 32 along K.
enum MoeFormat : int32_t {
  kBf16 = 0,
  kFp8 = 1,
  kFp8Block = 2,
  kMxfp8 = 3,
  kMxfp4 = 4,
  kNvfp4 = 5,
  kFp16 = 6,
  kMxint4 = 7,
};

// Activations. Gated ones (kSwiglu, kGeglu, kSitu) read alpha/beta/limit per expert
// (null pointer: the default); element-wise ones ignore them.
//   identity  out = x
//   relu2     out = max(x, 0)^2
//   swiglu    out = x1 * sigmoid(alpha * x1) * (x0 + beta)      alpha 1, beta 0
//   geglu     out = gelu_erf(x1) * x0
//   situ      out = beta*tanh(x0/beta) * alpha*tanh(x1/alpha) * sigmoid(x1)   alpha, beta 1
// With a limit L (gated only): x1 = min(x1, L), x0 = clamp(x0, -L, L) first.
// gelu and silu (element-wise) are names only, for imported kernel sets (as above).
enum MoeActivation : int32_t {
  kIdentity = 0,
  kRelu2 = 1,
  kSwiglu = 2,
  kGeglu = 3,
  kSitu = 4,
  kGelu = 5,
  kSilu = 6,
};

// Whether the moe_gemm parameter ABI has an encoding for the format / activation
// (the names-only ones above it has not).
CUBIST_HD constexpr bool MoeGemmEncodes(MoeFormat f) { return f >= kBf16 && f <= kNvfp4; }
CUBIST_HD constexpr bool MoeGemmEncodes(MoeActivation a) {
  return a >= kIdentity && a <= kSitu;
}

// The one kernel parameter, passed by value (cuLaunchKernel's kernelParams[0] points
// at it). All pointers are device pointers; "null" marks an optional input.
// Layout is fixed: 8-byte fields are 8-byte aligned, sizeof == 136 (checked below).
// MoeGemmParams::flags. kMoeGemmFlagSettledInputs: offsets, B and its scales (and the
// per-expert parameters) were complete before the kernel that precedes this launch in the
// stream returned from its grid-dependency wait - true where that kernel waits before it
// lets this one launch and reads nothing the writer of those inputs did not finish (the
// MoE layer's GEMMs after a gather or quantize kernel, and GEMM2). The kernel may then
// read them before its own wait: only A (with its scales and row map) waits for the
// previous kernel. Kernels that predate the bit ignore it, which is always correct.
inline constexpr int32_t kMoeGemmFlagSettledInputs = 1;

struct MoeGemmParams {
  int32_t abi;          // kMoeGemmAbi as the caller fills it (MoeGemmParamsInit); the
                        // launcher sets the kernel's version inside MoeGemmParamsV2
  int32_t num_experts;  // E >= 1
  int32_t num_tokens;   // T >= 0: rows of A and of out
  int32_t n;            // N: rows of each expert's B, both halves when gated
  int32_t k;            // K >= 1
  int32_t flags;        // kMoeGemmFlag* bits; 0 for a plain call
  const void* a;        // [T, K] activations, activation format
  const void* b;        // [E, N, K] weights, weight format
  const void* a_scale;  // block scales of A (formats above), else null
  const void* b_scale;  // block scales of B, else null
  const float* a_global_scale;  // [1] (fp8, nvfp4) or null (= 1); nvfp4 x bf16 kernels
                                // multiply by it too when set (the layer's decoded nvfp4
                                // inputs: their rcp(g))
  const float* b_global_scale;  // [E] (fp8, nvfp4) or null (= 1)
  const int32_t* offsets;       // [E+1] int32, offsets[0] = 0, non-decreasing, <= T
  const float* alpha;  // [E] or null
  const float* beta;   // [E] or null
  const float* limit;  // [E] or null (= +inf)
  void* out;           // bf16 (or e4m3: fp8-output kernels) [T, N] or [T, N/2] (gated),
                       // dense rows
  const float* bias;   // [E, N] or null; read by version-3 and -4 kernels (null for 2)
  // fp32 [1]: the dequantization scale s of an fp8 output (out ~ e4m3 x s), read by the
  // kernels whose entry says "output_format": "fp8" (version 4), which need it; null for
  // every kernel that writes bf16 (MoeGemmCheck refuses it there). Was reserved[0].
  const float* out_scale;
  int64_t reserved[1];  // 0; room for a stride without an ABI bump of the size
  // Version 5, the gather of A (kernels whose entry says "a_gather": true, which need
  // it; null and 0 for every other kernel, which MoeGemmCheck refuses them for): row r
  // of the problem (r < offsets[E]) reads row a_row_map[r] / a_row_divisor of A, which
  // is then [a_rows, K]; a quotient outside 0..a_rows-1 reads zeros (never out of
  // bounds). The MoE layer passes its permuted_to_expanded map and top_k (expanded
  // index = token x top_k + slot), so GEMM1 reads each token's row where it is.
  const int32_t* a_row_map;  // int32 [T]
  int32_t a_row_divisor;     // >= 1
  int32_t a_rows;            // >= 1
};
static_assert(sizeof(MoeGemmParams) == 152, "MoeGemmParams layout is ABI");

CUBIST_HD constexpr bool IsGated(MoeActivation a) {
  return a == kSwiglu || a == kGeglu || a == kSitu;
}

// A gated activation's per-expert parameters (MoeGemmParams::alpha, beta, limit).
struct MoeActParams {
  float alpha;
  float beta;
  float limit;  // +inf: no clamp
};

// The parameters an activation uses where MoeGemmParams' pointer is null: alpha 1; beta
// 1 for situ (it divides by beta) and 0 otherwise; no limit. The kernels' epilogues and
// the CPU reference (dispatch/reference.h) both start from these.
CUBIST_HD constexpr MoeActParams MoeActDefaults(MoeActivation a) {
  return MoeActParams{1.0f, a == kSitu ? 1.0f : 0.0f, __builtin_huge_valf()};
}

// Columns of `out`.
CUBIST_HD constexpr int32_t MoeGemmOutCols(int32_t n, MoeActivation act) {
  return IsGated(act) ? n / 2 : n;
}

// Output columns one CTA computes: tile_n B rows (x0 and x1 halves when gated).
CUBIST_HD constexpr int32_t MoeGemmOutTileCols(int32_t tile_n, MoeActivation act) {
  return IsGated(act) ? tile_n / 2 : tile_n;
}

// Upper bound on the number of M tiles over all experts, computed WITHOUT reading
// offsets: T rows reach at most n = min(T, E) experts, and sum_e ceil(c_e / tm) <=
// (T + n * (tm - 1)) / tm for any split of them. (Bounding by E alone sized a decode
// step's grid for every expert: Mixtral's one token got 224 CTAs for its 64 tiles.)
CUBIST_HD constexpr int64_t MoeGemmMaxMTiles(int64_t t, int64_t e, int64_t tile_m) {
  const int64_t n = t < e ? t : e;
  return (t + n * (tile_m - 1)) / tile_m;
}

CUBIST_HD constexpr int64_t MoeGemmNTiles(int32_t n, MoeActivation act, int32_t tile_n) {
  const int64_t cols = MoeGemmOutCols(n, act);
  const int64_t tc = MoeGemmOutTileCols(tile_n, act);
  return (cols + tc - 1) / tc;
}

// Tiles are ordered (M tile, N tile) in groups of kMoeGemmGroupM M tiles (L2 reuse of A
// and B); the launch grid is MoeGemmPersistentGridFor below.
inline constexpr int kMoeGemmGroupM = 8;
struct MoeGemmGrid {
  uint32_t x = 1, y = 1, z = 1;
};

// Alignment the kernels require (also written into each manifest entry's extras as
// "k_align" and "n_align"): K a multiple of k_align elements, the output width
// (N, or N/2 when gated) a multiple of 8, every pointer 16-byte aligned. k_align is the
// larger of one 16-byte load of the narrowest operand and the scale block.
CUBIST_HD constexpr int32_t FormatBits(MoeFormat f) {
  return f == kBf16 || f == kFp16 ? 16 : (f == kMxfp4 || f == kNvfp4 || f == kMxint4) ? 4 : 8;
}
// Elements along K that share one block scale; 0 for formats without block scales.
CUBIST_HD constexpr int32_t FormatScaleBlock(MoeFormat f) {
  return f == kMxfp4 || f == kMxfp8 || f == kMxint4 ? 32
         : f == kNvfp4                             ? 16
         : f == kFp8Block                          ? 128
                                                   : 0;
}
// Bytes of one block scale: fp32 for fp8-block, one byte (ue8m0 or e4m3) otherwise.
CUBIST_HD constexpr int32_t FormatScaleBytes(MoeFormat f) {
  return f == kFp8Block ? 4 : FormatScaleBlock(f) != 0 ? 1 : 0;
}
// Whether the format carries an fp32 per-tensor (A) / per-expert (B) global scale.
CUBIST_HD constexpr bool FormatHasGlobalScale(MoeFormat f) { return f == kFp8 || f == kNvfp4; }
// Whether a kernel of weights w reads a_global_scale and b_global_scale: the epilogues
// of fp8 and nvfp4 weights multiply by both when set (nvfp4 x bf16 by A's too: the
// layer's decoded nvfp4 inputs); every other kernel ignores them, so a caller passing
// one would not get the scaling it asks for (MoeGemmCheck refuses it).
CUBIST_HD constexpr bool MoeGemmReadsGlobalScales(MoeFormat w) { return FormatHasGlobalScale(w); }
CUBIST_HD constexpr int32_t MoeGemmKAlign(MoeFormat w, MoeFormat a) {
  const int32_t bits = FormatBits(w) < FormatBits(a) ? FormatBits(w) : FormatBits(a);
  int32_t align = 128 / bits;  // elements in 16 bytes
  // ue8m0/e4m3 block scales: whole blocks only (fp8-block allows a partial last block).
  const int32_t wb = w == kFp8Block ? 0 : FormatScaleBlock(w);
  const int32_t ab = a == kFp8Block ? 0 : FormatScaleBlock(a);
  if (wb > align) align = wb;
  if (ab > align) align = ab;
  return align;
}
inline constexpr int32_t kMoeGemmOutColsAlign = 8;
// fp8-output kernels store whole 16-byte pieces of e4m3 rows (16 columns), so their
// output width is a multiple of 16 (manifest "n_multiple": twice the bf16 kernels').
inline constexpr int32_t kMoeGemmOutColsAlignFp8 = 16;
// The output width's alignment for a kernel writing `out` (kBf16 or kFp8).
CUBIST_HD constexpr int32_t MoeGemmOutColsAlign(MoeFormat out) {
  return out == kFp8 ? kMoeGemmOutColsAlignFp8 : kMoeGemmOutColsAlign;
}

// The size in bytes of every array of one problem (E experts, T tokens, N, K): the one
// place that says it, for the dispatcher, `cubist run`, the benchmarks and the CPU
// reference alike. Scales are [rows, ceil(K / block)] (whole blocks for ue8m0/e4m3
// scales, whose K is a multiple of the block); fp8-block weights use 128x128 blocks,
// so B's scales are [E, ceil(N/128), ceil(K/128)].
struct MoeGemmBytes {
  int64_t a = 0, b = 0;              // elements
  int64_t a_scale = 0, b_scale = 0;  // block scales
  int64_t a_global_scale = 0, b_global_scale = 0;  // fp32 [1] and [E]
  int64_t offsets = 0;               // int32 [E+1]
  int64_t out = 0;                   // bf16 [T, N] or [T, N/2]
  CUBIST_HD constexpr int64_t inputs() const { return a + b + a_scale + b_scale; }
};
CUBIST_HD constexpr int64_t MoeElementBytes(MoeFormat f, int64_t count) {
  return (count * FormatBits(f) + 7) / 8;
}
// Block-scale bytes of a [rows, k] operand whose scales come in `scale_rows` rows
// (rows itself, except for fp8-block weights: one per 128 rows of each expert).
CUBIST_HD constexpr int64_t MoeScaleBytes(MoeFormat f, int64_t scale_rows, int64_t k) {
  const int64_t block = FormatScaleBlock(f);
  if (block == 0) return 0;
  const int64_t per_row = f == kFp8Block ? (k + block - 1) / block : k / block;
  return scale_rows * per_row * FormatScaleBytes(f);
}
CUBIST_HD constexpr MoeGemmBytes MoeGemmBytesFor(MoeFormat w, MoeFormat a, MoeActivation act,
                                                 int64_t e, int64_t t, int64_t n,
                                                 int64_t k) {
  MoeGemmBytes s;
  s.a = MoeElementBytes(a, t * k);
  s.b = MoeElementBytes(w, e * n * k);
  s.a_scale = MoeScaleBytes(a, t, k);
  s.b_scale = MoeScaleBytes(w, w == kFp8Block ? e * ((n + 127) / 128) : e * n, k);
  s.a_global_scale = FormatHasGlobalScale(a) ? 4 : 0;
  s.b_global_scale = FormatHasGlobalScale(w) ? 4 * e : 0;
  s.offsets = 4 * (e + 1);
  s.out = 2 * t * (IsGated(act) ? n / 2 : n);
  return s;
}

// Sets abi (kMoeGemmAbi: the caller fills the newest version's fields) and zeroes
// everything else.
inline MoeGemmParams MoeGemmParamsInit() {
  MoeGemmParams p{};
  p.abi = kMoeGemmAbi;
  return p;
}

// ---------------------------------------------------------------------------------
// Versions 2 and 3: TMA kernels (kernels/moe_gemm_tma.cu, moe_gemm_fp4.cu,
// moe_gemm_fp4_fp8.cu).
//
// The host encodes two tensor maps (cuTensorMapEncodeTiled) and passes them by value
// inside the parameter struct, which the kernel takes as a __grid_constant__:
//   a_map: A viewed as 2-D [T rows, K], box [tile_m rows, 128 bytes of K]
//   b_map: B viewed as 2-D [E*N rows, K], box [MoeGemmTmaBRows rows, 128 bytes of K]
// both with 128-byte swizzle, no interleave, L2 promotion 256 B, out-of-bounds fill
// zero; the element type is bf16 for bf16 operands and uint8 for fp8 ones (128 bytes of
// K = 64 bf16 or 128 fp8 elements: the kernel's k-tile). Rows of a box that run past an
// expert's end belong to the next expert or lie outside the tensor (zero-filled); the
// kernel computes them and never stores them.
// MoeTensorMap is CUtensorMap's size and alignment without the CUDA header.
struct alignas(64) MoeTensorMap {
  uint64_t opaque[16];
};
struct MoeGemmParamsV2 {
  MoeGemmParams g;  // g.abi == 2
  uint8_t pad[40];  // a_map at offset 192, 64-byte aligned (versions 2-4: pad[56] after
                    // the 136 bytes of their struct; version 5 took the first 16)
  MoeTensorMap a_map;
  MoeTensorMap b_map;
};
static_assert(sizeof(MoeTensorMap) == 128 && alignof(MoeTensorMap) == 64, "CUtensorMap");
static_assert(sizeof(MoeGemmParamsV2) == 448, "MoeGemmParamsV2 layout is ABI");

inline MoeGemmParamsV2 MoeGemmParamsV2Init() {
  MoeGemmParamsV2 p{};
  p.g.abi = kMoeGemmAbiV2;
  return p;
}

// Bytes of K one TMA box row covers, and the rows of B one box brings: gated kernels
// load the linear (x0) and gate (x1) halves of their tile_n rows as two boxes.
inline constexpr int32_t kMoeGemmTmaBoxBytes = 128;
CUBIST_HD constexpr int32_t MoeGemmTmaBRows(int32_t tile_n, MoeActivation act) {
  return IsGated(act) ? tile_n / 2 : tile_n;
}

// Experts a version-2 kernel can schedule: it keeps offsets and per-expert tile counts
// in shared memory (manifest extras "max_experts").
inline constexpr int32_t kMoeGemmTmaMaxExperts = 1024;

// The version-2 launch grid: persistent, one-dimensional, min(tiles, SMs x
// ctas_per_sm) CTAs where tiles = MoeGemmMaxMTiles * MoeGemmNTiles (computed without
// reading offsets). Each CTA reads offsets once, then walks tiles blockIdx.x,
// blockIdx.x + gridDim.x, ... in the grouped order above (kMoeGemmGroupM).
CUBIST_HD constexpr MoeGemmGrid MoeGemmPersistentGridFor(const MoeGemmParams& p,
                                                         MoeActivation act, int32_t tile_m,
                                                         int32_t tile_n, int32_t sm_count,
                                                         int32_t ctas_per_sm) {
  const int64_t tiles = MoeGemmMaxMTiles(p.num_tokens, p.num_experts, tile_m) *
                        MoeGemmNTiles(p.n, act, tile_n);
  const int64_t cap = static_cast<int64_t>(sm_count < 1 ? 1 : sm_count) *
                      (ctas_per_sm < 1 ? 1 : ctas_per_sm);
  MoeGemmGrid g;
  g.x = static_cast<uint32_t>(tiles < 1 ? 1 : (tiles < cap ? tiles : cap));
  return g;
}

// Manifest vocabulary: the one name table (dispatch/moe_types.h parses with it).
inline const char* FormatName(MoeFormat f) {
  switch (f) {
    case kBf16: return "bf16";
    case kFp8: return "fp8";
    case kFp8Block: return "fp8-block";
    case kMxfp8: return "mxfp8";
    case kMxfp4: return "mxfp4";
    case kNvfp4: return "nvfp4";
    case kFp16: return "fp16";
    case kMxint4: return "mxint4";
  }
  return "?";
}
inline const char* ActivationName(MoeActivation a) {
  switch (a) {
    case kIdentity: return "identity";
    case kRelu2: return "relu2";
    case kSwiglu: return "swiglu";
    case kGeglu: return "geglu";
    case kSitu: return "situ";
    case kGelu: return "gelu";
    case kSilu: return "silu";
  }
  return "?";
}

}  // namespace cubist::moe

#endif  // CUBIST_KERNELS_MOE_GEMM_ABI_H_
