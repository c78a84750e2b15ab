// CPU reference for the moe_gemm kernel family (kernels/moe_gemm_abi.h, docs/kernels.md):
// exact decoders and round-to-nearest-even encoders for every element and scale format,
// quantizers that turn real matrices into each format's bytes, the reference GEMM
// (double accumulation) with every activation, and a comparison of a kernel's bf16
// output against it with per-format tolerances. `cubist run` checks every result with
// it; random problems for tests are tests/testlib/random_problem.h.
//
// Everything is a pure function of its arguments and thread-safe. Byte layouts are
// exactly the kernels': row-major, K contiguous, fp4 two per byte low nibble first,
// scales [rows, K/block].
#ifndef CUBIST_DISPATCH_REFERENCE_H_
#define CUBIST_DISPATCH_REFERENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/moe_gemm_abi.h"

namespace cubist::reference {

using moe::MoeActivation;
using moe::MoeFormat;

// ---- Element and scale codecs (exact; encoders round to nearest, ties to even). ----
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float x);  // NaN stays NaN, overflow -> inf
// e4m3 (OCP "fn"): bias 7, no infinities, S.1111.111 is NaN, max 448.
float E4m3ToFloat(uint8_t bits);
uint8_t FloatToE4m3(float x);  // saturates to +-448; NaN -> 0x7F
// e2m1: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}; bit 3 is the sign.
float E2m1ToFloat(uint8_t nibble);
uint8_t FloatToE2m1(float x);  // saturates to +-6; NaN -> 0 (e2m1 has no NaN)
// ue8m0: 2^(bits-127); 0xFF is NaN.
float Ue8m0ToFloat(uint8_t bits);

// ---- A problem in memory formats: exactly the bytes a kernel reads. ----
struct MoeProblemData {
  MoeFormat weight_format = moe::kBf16;
  MoeFormat activation_format = moe::kBf16;
  int num_experts = 0;  // E
  int num_tokens = 0;   // T
  int n = 0;            // N (both halves for gated activations)
  int k = 0;            // K
  std::vector<int32_t> offsets;  // E+1
  std::vector<uint8_t> a;        // [T, K] activation format
  std::vector<uint8_t> b;        // [E, N, K] weight format
  std::vector<uint8_t> a_scale;  // block scales (bytes; fp32 for fp8-block), or empty
  std::vector<uint8_t> b_scale;
  std::vector<float> a_global_scale;  // [1] for fp8 / nvfp4, else empty
  std::vector<float> b_global_scale;  // [E] for fp8 / nvfp4, else empty
  std::vector<float> alpha, beta, limit;  // [E] or empty (moe::MoeActDefaults)
  std::vector<float> bias;  // [E, N] or empty: added to C before the activation
};

// Quantizes `x` ([rows, k], row-major) into `format`: elements into *data, block scales
// into *scale (empty for bf16/fp8), and the per-tensor scale into *global (1 for
// formats without one). fp8-block uses 1x128 blocks, or 128x128 when `square_blocks`
// (weights). nvfp4: global = amax / (448 * 6).
void Quantize(MoeFormat format, const std::vector<float>& x, int rows, int k,
              bool square_blocks, std::vector<uint8_t>* data, std::vector<uint8_t>* scale,
              float* global);

// Fully dequantized operands: A as [T, K], B as [E, N, K] (block and global scales
// applied), in float (every decoded value is exact in float).
std::vector<float> DequantizeA(const MoeProblemData& p);
std::vector<float> DequantizeB(const MoeProblemData& p);

// C = A_e * B_e^T per expert, accumulated in double: [T, N].
std::vector<double> ReferenceGemm(const MoeProblemData& p);
// act(C + bias) as the kernels define it, [T, N] or [T, N/2] for gated activations.
std::vector<double> ApplyActivation(const MoeProblemData& p, const std::vector<double>& c,
                                    MoeActivation act);
double ActivationValue(MoeActivation act, double x0, double x1, double alpha, double beta,
                       double limit);

// ---- Comparison. ----
struct Tolerance {
  double rel_fro = 0;   // ||out - ref||_F / ||ref||_F at most this
  double rtol = 0;      // and every element |out - ref| <= atol + rtol * |ref|,
  double atol_rel = 0;  // with atol = atol_rel * max|ref|
};
// Per format pair: the kernels see exactly the decoded values the reference sees, so the
// error is fp32 accumulation order plus the bf16 rounding of the output (2^-9 relative);
// the fp8 tensor-core path accumulates 128-deep partial sums in reduced precision.
Tolerance ToleranceFor(MoeFormat weight_format, MoeFormat activation_format);

struct Comparison {
  bool ok = false;
  double rel_fro = 0;
  double max_abs_err = 0;
  int64_t bad_elements = 0;  // outside the elementwise bound, NaN mismatches included
  int64_t first_bad = -1;    // flat index
  std::string summary;       // "rel_fro 1.2e-3, max_abs 4e-3, 0 bad of 12345"
};
// `out` is the kernel's bf16 output, `ref` the reference (same length). The absolute
// term is atol_rel * max(max|ref|, atol_scale): pass max|C| (the GEMM before the
// activation) as atol_scale, since the kernel's error arises in C and activations such
// as SiTU compress the output's range without shrinking that error.
Comparison CompareBf16(const std::vector<uint16_t>& out, const std::vector<double>& ref,
                       const Tolerance& tol, double atol_scale = 0);
// max |x| over the finite elements.
double MaxAbs(const std::vector<double>& x);

}  // namespace cubist::reference

#endif  // CUBIST_DISPATCH_REFERENCE_H_
