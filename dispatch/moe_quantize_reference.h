// CPU reference of the layer's activation quantizers (kernels/moe_layer_abi.h,
// MoeQuantizeParams): bf16 rows -> the elements and block scales of one moe_gemm
// activation format, with exactly the kernels' rounding, so a kernel's bytes can be
// compared bit for bit. Each operation is one fp32 operation rounded to nearest even, as
// on the device (host float arithmetic is IEEE single precision; nothing here may be
// built with fast-math).
//
// Pure functions of their arguments; thread-safe.
#ifndef CUBIST_DISPATCH_MOE_QUANTIZE_REFERENCE_H_
#define CUBIST_DISPATCH_MOE_QUANTIZE_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "kernels/moe_gemm_abi.h"

namespace cubist::reference {

// One quantized operand, laid out as a moe_gemm kernel reads it (kernels/moe_gemm_abi.h).
struct QuantizedRows {
  std::vector<uint8_t> data;   // [rows, K] e4m3, or [rows, K/2] packed e2m1
  std::vector<uint8_t> scale;  // block scales: fp32 [rows, ceil(K/128)] (fp8-block),
                               // ue8m0 [rows, K/32] (mxfp8), e4m3 [rows, K/16] (nvfp4)
  // The per-tensor dequantization factor the GEMM reads as a_global_scale: fp8 s itself,
  // nvfp4 rcp(g); 1 for the other formats.
  float global = 1.0f;
};

// Quantizes bf16 rows `x` ([rows, k] bit patterns) into `format` (fp8, fp8-block, mxfp8
// or nvfp4; k as the kernels require). `scale` is fp8's dequantization scale s or
// nvfp4's global quantization scale g (FlashInfer's convention, 448 x 6 / amax); the
// other formats ignore it.
QuantizedRows QuantizeActivations(moe::MoeFormat format, const std::vector<uint16_t>& x,
                                  int rows, int k, float scale);

// The correctly rounded fp32 reciprocal, as the kernels' rcp.
float Rcp(float v);

}  // namespace cubist::reference

#endif  // CUBIST_DISPATCH_MOE_QUANTIZE_REFERENCE_H_
