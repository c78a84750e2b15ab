// Device code shared by the moe_gemm kernels (kernels/moe_gemm_tma.cu, moe_gemm_fp4.cu,
// moe_gemm_fp4_fp8.cu): PTX wrappers, the exact element decoders and the activations.
// Include only from a .cu file compiled for sm_90a.
#ifndef CUBIST_KERNELS_MOE_GEMM_DEVICE_CUH_
#define CUBIST_KERNELS_MOE_GEMM_DEVICE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/moe_gemm_abi.h"

namespace cubist::moe {
namespace {

// ---------------------------------------------------------------------------------
// PTX helpers.

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Shared memory written by the generic proxy (st.shared) and read next by
// wgmma (the async proxy) needs this fence in every writing thread before the barrier.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator accesses across wgmma issue/wait.
template <int R>
__device__ __forceinline__ void FenceRegs(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Matrix descriptor of a K-major operand in a 128-byte-swizzled panel: start address,
// leading byte offset 16 (unused by this mode), stride 1024 bytes between 8-row groups,
// swizzle mode 1 (128 B). Advancing the start by 32 bytes selects the next k-step.
__device__ __forceinline__ uint64_t Desc(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{64} << 32) | (uint64_t{1} << 62);
}

// Byte offset of 16-byte chunk `chunk` (0 .. row_bytes/16-1) of row `r` in an operand
// tile of `rows` rows stored as 128-byte-swizzled panels.
__device__ __forceinline__ uint32_t SwizzledChunk(int rows, int r, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * rows * 128 + r * 128 +
                               (((chunk & 7) ^ (r & 7)) << 4));
}

// ---------------------------------------------------------------------------------
// Element decoding (exact: every value below is representable in bf16, except that
// a block scale beyond bf16's exponent range saturates like the fp32 product would).

__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}
__device__ __forceinline__ __nv_bfloat162 Bits2(uint32_t v) {
  return *reinterpret_cast<__nv_bfloat162*>(&v);
}
__device__ __forceinline__ uint32_t Bits(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}
// 8 e2m1 (one 32-bit word, low nibble first) times a scale -> 8 bf16. The bf16 bytes of
// the 8 magnitudes are two 8-byte tables; prmt looks up four nibbles at once (high and
// low byte separately), two more prmt interleave them. The signs come from prmt's
// sign-replicating mode: the high nibble's sign is its byte's msb, the low nibble's is
// the msb of the same byte of w << 4; one lop3 puts them at bits 15 and 31. About 2.5
// instructions per element, the scale multiply included.
// s_lo scales elements 0-3, s_hi elements 4-7 (nvfp4's 16-element blocks meet there
// when the word is gathered from four words of a 32-element block).
__device__ __forceinline__ uint4 DecodeE2m1x8(uint32_t w, __nv_bfloat162 s_lo,
                                              __nv_bfloat162 s_hi) {
  constexpr uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u;  // 0, .5, 1, 1.5 | 2, 3, 4, 6
  constexpr uint32_t kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;
  const uint32_t idx = w & 0x77777777u;
  const uint32_t hi_a = Prmt(kHi0, kHi1, idx), hi_b = Prmt(kHi0, kHi1, idx >> 16);
  const uint32_t lo_a = Prmt(kLo0, kLo1, idx), lo_b = Prmt(kLo0, kLo1, idx >> 16);
  uint32_t o[4] = {Prmt(lo_a, hi_a, 0x5140), Prmt(lo_a, hi_a, 0x7362),
                   Prmt(lo_b, hi_b, 0x5140), Prmt(lo_b, hi_b, 0x7362)};
  const uint32_t w4 = w << 4;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // byte 1 = sign of element 2j (low nibble of byte j), byte 3 = sign of element 2j+1.
    const uint32_t sel = ((8u | (4u + j)) << 4) | ((8u | j) << 12);
    o[j] |= Prmt(w, w4, sel) & 0x80008000u;
    o[j] = Bits(__hmul2(Bits2(o[j]), j < 2 ? s_lo : s_hi));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}
__device__ __forceinline__ uint4 DecodeE2m1x8(uint32_t w, __nv_bfloat162 s) {
  return DecodeE2m1x8(w, s, s);
}
// 8 e2m1 (one word, low nibble first) times a scale -> 4 bf16 pairs (element i, element
// i + 4), i = 0..3: the order of the "permuted" fp4 kernels (kernels/moe_gemm_fp4.cu),
// whose activations are laid out to match. Each pair is built in integer registers: the
// two nibbles' magnitude bits land on bf16 bits 6-8 (exponent lsbs and mantissa msb),
// their signs on bit 15, by one multiply that makes two copies of the pair (x 2^6 + 2^12)
// and one mask. That bit pattern is the e2m1 value times 2^-126 (e2m1's subnormal 0.5
// becomes a bf16 subnormal), so one multiply by 2^126 restores it exactly and one by the
// scale applies the scale (two multiplies, so that no scale overflows the bias). 21
// instructions per 8 elements; the 12 multiplies run on the FMA pipe.
__device__ __forceinline__ uint4 DecodeE2m1Pairs(uint32_t w, __nv_bfloat162 s) {
  const uint32_t w8 = w >> 8;
  uint32_t o[4] = {(w & 0x000F000Fu) * 0x1040u, (w & 0x00F000F0u) * 0x0104u,
                   (w8 & 0x000F000Fu) * 0x1040u, (w8 & 0x00F000F0u) * 0x0104u};
  const __nv_bfloat162 bias = Bits2(0x7E807E80u);  // 2^126 in both halves
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[i] = Bits(__hmul2(__hmul2(Bits2(o[i] & 0x81C081C0u), bias), s));
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}
// DecodeE2m1Pairs with one multiply instead of two: m is the scale times 2^126 (both
// halves), which the caller has checked is representable (ue8m0 scales up to 2^0:
// Ue8m0ExpsTimes2p126; e4m3 scales times 2^118, the value then 2^-8 of its own: nvfp4).
// 17 instructions per 8 elements; the products are the same exact values (scaled by a
// power of two that the caller undoes), so the result is the same bits.
__device__ __forceinline__ uint4 DecodeE2m1PairsOneMul(uint32_t w, __nv_bfloat162 m) {
  const uint32_t w8 = w >> 8;
  uint32_t o[4] = {(w & 0x000F000Fu) * 0x1040u, (w & 0x00F000F0u) * 0x0104u,
                   (w8 & 0x000F000Fu) * 0x1040u, (w8 & 0x00F000F0u) * 0x0104u};
#pragma unroll
  for (int i = 0; i < 4; ++i) o[i] = Bits(__hmul2(Bits2(o[i] & 0x81C081C0u), m));
  return make_uint4(o[0], o[1], o[2], o[3]);
}
__device__ __forceinline__ __nv_bfloat162 E4m3x2ToBf16x2(uint32_t two_bytes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(two_bytes & 0xFFFFu), __NV_E4M3);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return __floats2bfloat162_rn(f.x, f.y);
}
// ue8m0: 2^(s-127); 0 is 2^-127 (a bf16 subnormal), 0xFF is NaN. s << 7 in both halves is
// one multiply; the two special bytes take one compare.
__device__ __forceinline__ __nv_bfloat162 Ue8m0ToBf16x2(uint32_t s) {
  uint32_t b = s * 0x00800080u;
  if (s - 1u >= 0xFEu) b = s == 0u ? 0x00400040u : 0x7FC07FC0u;
  return Bits2(b);
}

// ---------------------------------------------------------------------------------
// e2m1 weights as e4m3 (the mxfp4 x mxfp8 kernels on fp8 wgmma: kernels/moe_gemm_fp4_fp8.cu).

// ue8m0 byte s -> 2^(s-127) in fp32: 0 is 2^-127 (an fp32 subnormal), 0xFF NaN.
__device__ __forceinline__ float Ue8m0ToFloat(uint32_t s) {
  const uint32_t bits = s == 0u ? 0x00400000u : s == 0xFFu ? 0x7FC00000u : s << 23;
  return __uint_as_float(bits);
}

// 2^e in fp32 for e in [-149, 127], subnormals included.
__device__ __forceinline__ float Pow2(int e) {
  return __uint_as_float(e >= -126 ? static_cast<uint32_t>(e + 127) << 23
                                   : 1u << (e + 149));
}

// The e4m3 bytes of the eight e2m1 magnitudes times 2^v, v in [-5, 6], as a prmt table
// (0, 0.5, 1, 1.5 | 2, 3, 4, 6): every entry but zero's is a normal e4m3 whose exponent
// field grows by v. No byte borrows or carries: the smallest nonzero entry is 0x30 and
// v >= -5 subtracts 0x28; the largest is 0x4C and v <= 6 adds 0x30 (384, below 448).
struct E4m3Table {
  uint32_t lo, hi;
};
__device__ __forceinline__ E4m3Table TableFor(int v) {
  const uint32_t u = static_cast<uint32_t>(v);
  return {0x3C383000u + u * 0x08080800u, 0x4C484440u + u * 0x08080808u};
}
// 8 e2m1 (one word, low nibble first) -> 8 e4m3 bytes in the same order (two words):
// prmt looks up four magnitudes at once; the signs come from bit 3 of each byte (even
// elements: bit 7 of the same byte of w << 4) and bit 7 (odd elements), moved into place
// by one prmt per output word. 9 instructions per 8 elements.
__device__ __forceinline__ uint2 DecodeE2m1ToE4m3x8(uint32_t w, E4m3Table t) {
  const uint32_t idx = w & 0x77777777u;
  const uint32_t m0 = Prmt(t.lo, t.hi, idx), m1 = Prmt(t.lo, t.hi, idx >> 16);
  const uint32_t w4 = w << 4;
  const uint32_t s0 = Prmt(w, w4, 0x1504u), s1 = Prmt(w, w4, 0x3726u);
  return make_uint2(m0 | (s0 & 0x80808080u), m1 | (s1 & 0x80808080u));
}

// ---------------------------------------------------------------------------------
// Activations (docs/kernels.md); NaN propagates through every clamp.

// The gated epilogues' sigmoid with the hardware's exp2 and reciprocal (ex2.approx,
// rcp.approx: relative error about 2^-21 for |x| <= 20, far below bf16's 2^-9 rounding
// of the output): expf and an IEEE division took about 30 instructions per output value
// (ncu: fp8 128x192 SwiGLU issued 1.38x the identity kernel's instructions on Mixtral's
// FC1), and SwiGLU tiles ran 5-10% faster without them (docs/benchmarks.md).
// Limits as the exact form's: 0 at -inf (1 / inf), 1 at +inf, NaN stays NaN.
__device__ __forceinline__ float Sigmoid(float x) {
  return __fdividef(1.0f, 1.0f + __expf(-x));
}

using ActParams = MoeActParams;

template <MoeActivation A>
__device__ __forceinline__ float Act(float x0, float x1, const ActParams& q) {
  if constexpr (A == kIdentity) {
    return x0;
  } else if constexpr (A == kRelu2) {
    const float r = x0 < 0.0f ? 0.0f : x0;
    return r * r;
  } else {
    x1 = x1 > q.limit ? q.limit : x1;
    x0 = x0 > q.limit ? q.limit : (x0 < -q.limit ? -q.limit : x0);
    if constexpr (A == kSwiglu) {
      return x1 * Sigmoid(q.alpha * x1) * (x0 + q.beta);
    } else if constexpr (A == kGeglu) {
      return 0.5f * x1 * (1.0f + erff(x1 * 0.70710678118654752f)) * x0;
    } else {
      return q.beta * tanhf(x0 / q.beta) * q.alpha * tanhf(x1 / q.alpha) * Sigmoid(x1);
    }
  }
}


// ---------------------------------------------------------------------------------
// The epilogue: one warpgroup's 64 x TN accumulators (wgmma's register layout) times the
// global scales, through the activation, to bf16 `out`. row0 is the warpgroup's first row
// of A/out; rows at or past row_end (the expert's end) and columns past the output width
// are not stored.

// What turns accumulators into output values: the global scales, the expert's bias row
// (version 3) and the activation's per-expert parameters, read once per tile.
template <MoeFormat WF, MoeActivation ACT>
struct TileEpilogue {
  float scale = 1.0f;
  ActParams q = MoeActDefaults(ACT);
  const float* bias = nullptr;  // the expert's [N] bias row, or null
  int32_t gate = 0;             // gated: the gate half's first bias column (N/2)
  int32_t n_out = 0;            // output columns: bias is read below this only

  __device__ __forceinline__ TileEpilogue(const MoeGemmParams& p, int e) {
    if constexpr (WF == kFp8 || WF == kNvfp4) {
      if (p.a_global_scale != nullptr) scale *= __ldg(p.a_global_scale);
      if (p.b_global_scale != nullptr) scale *= __ldg(p.b_global_scale + e);
    }
    if constexpr (IsGated(ACT)) {
      if (p.alpha != nullptr) q.alpha = __ldg(p.alpha + e);
      if (p.beta != nullptr) q.beta = __ldg(p.beta + e);
      if (p.limit != nullptr) q.limit = __ldg(p.limit + e);
    }
    if (p.bias != nullptr) bias = p.bias + static_cast<int64_t>(e) * p.n;
    gate = p.n / 2;
    n_out = MoeGemmOutCols(p.n, ACT);
  }
  // With a bias, applies the scale and adds the bias to this thread's accumulators in place
  // (acc = acc * scale + bias, in the order Pair would) and leaves scale 1, so that Pair
  // stays the multiply it is without one. The epilogue thus decides once per tile: testing
  // the bias per element, as Pair once did, cost the tiles 4-11% even without a bias.
  // col0: the output column of this thread's first value (group 0); TN: B rows per tile.
  // The loads are volatile so that the compiler keeps each beside its use instead of
  // hoisting a tile's worth of them ahead (that spilled the 64x256 bf16 tile).
  template <int TN, int R>
  __device__ __forceinline__ void FoldBias(float (&acc)[R], int col0) {
    if (bias == nullptr) return;
    constexpr int kOutGroups = IsGated(ACT) ? TN / 16 : TN / 8;
#pragma unroll
    for (int g = 0; g < kOutGroups; ++g) {
      const int col = col0 + g * 8;
      if (col >= n_out) continue;  // columns past the output are never stored
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float b = Bias(col + j);
        const float bg = IsGated(ACT) ? Bias(gate + col + j) : 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i0 = g * 4 + 2 * h + j;
          acc[i0] = acc[i0] * scale + b;
          if constexpr (IsGated(ACT)) {
            const int i1 = (g + TN / 16) * 4 + 2 * h + j;
            acc[i1] = acc[i1] * scale + bg;
          }
        }
      }
    }
    scale = 1.0f;
  }
  __device__ __forceinline__ float Bias(int n) const {
    float v;
    asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(v) : "l"(bias + n));
    return v;
  }
  // The two output values this thread holds in 8-column group g of out, row half h (rows
  // lane / 4 and lane / 4 + 8 of its warp's 16); gated activations pair column c of the
  // tile's up half with column c of its gate half (TN / 2 further).
  template <int TN, int R>
  __device__ __forceinline__ __nv_bfloat162 Pair(const float (&acc)[R], int g, int h) const {
    const int i0 = g * 4 + 2 * h;
    if constexpr (IsGated(ACT)) {
      const int i1 = (g + TN / 16) * 4 + 2 * h;
      return __floats2bfloat162_rn(Act<ACT>(acc[i0] * scale, acc[i1] * scale, q),
                                   Act<ACT>(acc[i0 + 1] * scale, acc[i1 + 1] * scale, q));
    } else {
      return __floats2bfloat162_rn(Act<ACT>(acc[i0] * scale, 0.0f, q),
                                   Act<ACT>(acc[i0 + 1] * scale, 0.0f, q));
    }
  }
};

// Prefetches into L2 the bias entries that tile n_tile's epilogue (TN rows of B per tile,
// as StoreTile and StoreStaged take it) reads, so that they hit L2 instead of DRAM. The
// producer calls it as it starts the tile, and the tile's main loop hides the latency: at
// decode a tile's main loop is short, and a DRAM round trip in every tile's epilogue made
// gpt-oss's biased layer 6-17% slower than the same layer without biases.
template <MoeActivation ACT, int TN>
__device__ __forceinline__ void PrefetchBiasL2(const MoeGemmParams& p, int e, int n_tile) {
  if (p.bias == nullptr) return;
  constexpr int kTileCols = IsGated(ACT) ? TN / 2 : TN;
  const int n_out = MoeGemmOutCols(p.n, ACT);
  const int c0 = n_tile * kTileCols;
  if (c0 >= n_out) return;
  const int c1 = min(c0 + kTileCols, n_out) - 1;  // the tile's last output column
  const float* row = p.bias + static_cast<int64_t>(e) * p.n;
  // One prefetch per 128-byte line (32 floats), and the last column's line.
#pragma unroll
  for (int c = 0; c <= kTileCols; c += 32) {
    const int col = min(c0 + c, c1);
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + col));
    if constexpr (IsGated(ACT)) {
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(row + p.n / 2 + col));
    }
  }
}

// fp8 output (parameter struct version 4, kernels whose entry says "output_format":
// "fp8"): the two bf16 values the bf16 epilogue would store, times inv_s = rcp(out_scale)
// (one correctly rounded fp32 multiply each), to e4m3 rounded to nearest even, saturating
// at +-448, NaN -> 0x7F: exactly the layer's fp8 quantizer (kernels/moe_layer.cu) applied
// to the bf16 output, so a fused GEMM1 writes the bytes the separate quantize would.
// Element 0 in the low byte.
__device__ __forceinline__ uint32_t Bf16x2ToE4m3x2(__nv_bfloat162 v, float inv_s) {
  const float lo = __fmul_rn(__low2float(v), inv_s);
  const float hi = __fmul_rn(__high2float(v), inv_s);
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}
// The factor an fp8-output epilogue multiplies by: the correctly rounded reciprocal of
// out_scale[0], computed once per tile (as the quantizer computes it once).
__device__ __forceinline__ float OutInvScale(const MoeGemmParams& p) {
  return __frcp_rn(__ldg(p.out_scale));
}

// OUT: the output format, kBf16 (versions 2 and 3) or kFp8 (version 4: 1 byte per
// element, rows of n_out bytes).
template <MoeFormat WF, MoeActivation ACT, int TN, MoeFormat OUT = kBf16, int R>
__device__ __forceinline__ void StoreTile(const MoeGemmParams& p, int e, int row0, int row_end,
                                          int n_tile, float (&acc)[R]) {
  static_assert(OUT == kBf16 || OUT == kFp8, "moe_gemm kernels write bf16 or e4m3");
  constexpr bool kGated = IsGated(ACT);
  const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
  constexpr int kOutGroups = kGated ? TN / 16 : TN / 8;  // 8-column groups of out
  constexpr int kTileCols = kGated ? TN / 2 : TN;
  TileEpilogue<WF, ACT> ep(p, e);
  ep.template FoldBias<TN>(acc, n_tile * kTileCols + (lane % 4) * 2);
  const int n_out = MoeGemmOutCols(p.n, ACT);
  // e4m3 output: one byte per element, each pair of the bf16 epilogue quantized.
  using Out = std::conditional_t<OUT == kFp8, uint8_t, __nv_bfloat16>;
  float inv_s = 0.0f;
  if constexpr (OUT == kFp8) inv_s = OutInvScale(p);
  Out* out = static_cast<Out*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + warp * 16 + lane / 4 + 8 * h;
    if (row >= row_end) continue;
    Out* orow = out + static_cast<int64_t>(row) * n_out;
#pragma unroll
    for (int g = 0; g < kOutGroups; ++g) {
      const int col = n_tile * kTileCols + g * 8 + (lane % 4) * 2;
      if (col >= n_out) continue;
      if constexpr (OUT == kFp8) {
        *reinterpret_cast<uint16_t*>(orow + col) =
            static_cast<uint16_t>(Bf16x2ToE4m3x2(ep.template Pair<TN>(acc, g, h), inv_s));
      } else {
        *reinterpret_cast<__nv_bfloat162*>(orow + col) = ep.template Pair<TN>(acc, g, h);
      }
    }
  }
}

}  // namespace
}  // namespace cubist::moe

#endif  // CUBIST_KERNELS_MOE_GEMM_DEVICE_CUH_
