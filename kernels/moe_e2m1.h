// The e2m1 code of a float without branches: the rounding the nvfp4 quantize kernel
// applies to every element (kernels/moe_layer_abi.h, MoeQuantizeParams: nearest even,
// saturating at +-6, NaN -> 0, the sign in bit 3 even for -0). In plain C++ so that a host
// test checks it against the reference encoder (dispatch/reference.h, FloatToE2m1) over
// every float near each rounding boundary. Header-only, no CUDA headers.
//
// Why not a chain of comparisons: nvcc compiled the seven-way compare chain into branches,
// about 50 instructions an element, and at decode the quantize kernel's few CTAs walk a
// row's elements one pass after another, so its time was that chain's latency.
//
// The e2m1 grid is 0.5 apart below 2, 1 apart in [2, 4) and 2 apart in [4, 6]; the code
// (the magnitude's index in 0, 0.5, 1, 1.5, 2, 3, 4, 6) is linear in each range:
//   a < 2:  code = rint(2a)        (0 .. 4)
//   a < 4:  code = rint(a) + 2     (4 .. 6)
//   a <= 6: code = rint(a / 2) + 4 (6 .. 7)
// rint to nearest even is one fp32 add: a x m + 2^23 rounds a x m (exact: m is a power of
// two) to an integer, which the sum's low mantissa bits then hold. The ranges meet
// without a gap: 2a just below 4 rounds to 4, as does a = 2 in the middle range.
#ifndef CUBIST_KERNELS_MOE_E2M1_H_
#define CUBIST_KERNELS_MOE_E2M1_H_

#include <stdint.h>

#include <string.h>  // memcpy (host and device)

#include "kernels/moe_gemm_abi.h"  // CUBIST_HD

namespace cubist::moe {

// The bits of one 4-byte type as another's (memcpy compiles to a register move on both
// sides, where a union or reinterpret_cast would be undefined behaviour in C++).
template <typename To, typename From>
CUBIST_HD inline To E2m1BitCast(From v) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To t;
  memcpy(&t, &v, sizeof t);
  return t;
}

// Bits 0-2 the magnitude's code, bit 3 the sign.
CUBIST_HD inline uint32_t E2m1Code(float v) {
  const uint32_t bits = E2m1BitCast<uint32_t>(v);
  const uint32_t sign = (bits >> 28) & 8u;
  float a = E2m1BitCast<float>(bits & 0x7FFFFFFFu);
  a = a < 6.0f ? a : 6.0f;  // saturates (inf too); a NaN becomes 6 here, 0 below
  const bool low = a < 2.0f, middle = a < 4.0f;
  const float m = low ? 2.0f : middle ? 1.0f : 0.5f;
  const uint32_t base = low ? 0u : middle ? 2u : 4u;
  const float rounded = a * m + 8388608.0f;  // 2^23 + rint(a x m), rint(a x m) <= 4
  const uint32_t code = E2m1BitCast<uint32_t>(rounded) - 0x4B000000u + base;
  return v != v ? 0u : (code | sign);
}

// The value of an E2m1Code: magnitudes 0, 0.5, 1, 1.5 (m / 2), 2, 3 (m - 2), 4, 6
// (2 (m - 4)); code 8 is -0.
CUBIST_HD inline float E2m1Value(uint32_t code) {
  const float m = static_cast<float>(code & 7u);
  const float a = m < 4.0f ? 0.5f * m : m < 6.0f ? m - 2.0f : 2.0f * (m - 4.0f);
  return (code & 8u) != 0 ? -a : a;
}

}  // namespace cubist::moe

#endif  // CUBIST_KERNELS_MOE_E2M1_H_
