// CPU reference of the routed MoE layer (kernels/moe_layer_abi.h, dispatch/moe_layer.h):
// routing exactly as the ABI header defines each method (fp32 arithmetic), the stable
// sort of token slots by local expert, and the whole layer with the GEMMs and the
// weighted sum in double. The tests and `cubist run --op moe` check the kernels
// against it.
//
// The layer's intermediates are bf16 where the kernels store bf16 (the gathered rows,
// GEMM1's activated output, GEMM2's output): the reference rounds them the same way, so
// its only departures from the kernels are accumulation order and precision.
//
// Everything is a pure function of its arguments and thread-safe.
#ifndef CUBIST_DISPATCH_MOE_LAYER_REFERENCE_H_
#define CUBIST_DISPATCH_MOE_LAYER_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "kernels/moe_gemm_abi.h"
#include "dispatch/reference.h"
#include "kernels/moe_layer_abi.h"

namespace cubist::reference {

struct RoutingConfig {
  moe::MoeRoutingMethod method = moe::kRouteRenormalize;
  int num_experts = 0;  // E
  int top_k = 0;        // k
  int n_group = 0;      // deepseek_v3
  int topk_group = 0;   // deepseek_v3
  float routed_scaling_factor = 1.0f;  // deepseek_v3
};

// Per token, k (expert id, weight) pairs in slot order.
struct Routing {
  int tokens = 0;
  int top_k = 0;
  std::vector<int32_t> ids;     // [T, k]
  std::vector<float> weights;   // [T, k]
};

// `logits` [T, E] in fp32 (bf16 logits: widen them first, exactly); `bias` [E] or
// empty. The config must be valid (MoeLayer checks it; here it is assumed).
Routing Route(const RoutingConfig& config, const std::vector<float>& logits,
              const std::vector<float>& bias, int tokens);

// The sort of the T x k slots by local expert (kernels/moe_layer_abi.h, MoeSortParams).
struct SlotSort {
  std::vector<int32_t> offsets;               // [L + 1]
  std::vector<int32_t> expanded_to_permuted;  // [T x k], -1 when not kept
  std::vector<int32_t> permuted_to_expanded;  // [offsets[L]]
  int32_t dropped = 0;                        // ids outside 0..E-1
};
SlotSort SortSlots(const std::vector<int32_t>& ids, int num_experts, int local_expert_offset,
                   int num_local_experts);

// The k slots of token t in the finalize's summation order: weight descending, equal
// weights to the lower id (then the lower slot).
std::vector<int> SlotOrder(const Routing& routing, int token);

// An MoE layer: x is bf16 bit patterns, row-major; the weights are bf16 (w1, w2) or,
// for a quantized pair, the weight format's bytes (w1q, w2q with their scales) as the
// moe_gemm kernels read them (kernels/moe_gemm_abi.h).
struct MoeLayerData {
  moe::MoeFormat weight_format = moe::kBf16;
  moe::MoeFormat activation_format = moe::kBf16;
  int tokens = 0;        // T
  int hidden = 0;        // H
  int intermediate = 0;  // I: GEMM1 has N = 2I rows per expert when gated, I otherwise
  int num_experts = 0;   // E (global)
  int local_expert_offset = 0;
  int num_local_experts = 0;  // L
  moe::MoeActivation activation = moe::kSwiglu;
  bool apply_weight_on_input = false;
  std::vector<uint16_t> x;   // [T, H]
  std::vector<uint16_t> w1;  // [L, N1, H]
  std::vector<uint16_t> w2;  // [L, H, I]
  // Quantized weights (weight_format != bf16): elements, block scales, per-expert global
  // scales [L] (fp8, nvfp4).
  std::vector<uint8_t> w1q, w2q, w1_scale, w2_scale;
  std::vector<float> w1_global, w2_global;
  // The activation quantizers' per-tensor scales (dispatch/moe_quantize_reference.h):
  // fp8's s or nvfp4's g, of GEMM1's input and of GEMM2's input.
  float input_scale = 1.0f, intermediate_scale = 1.0f;
  // The experts' biases, or empty: [L, N1] before the activation, [L, H] on GEMM2's
  // output (in fp32 with the GEMM, before its bf16 rounding).
  std::vector<float> w1_bias, w2_bias;
  std::vector<float> alpha, beta, limit;  // [L] or empty
};

// Fills w1q, w2q, their block scales and per-expert global scales from the bf16 w1 and
// w2, each expert quantized on its own into layer->weight_format (fp8-block: 128x128
// blocks) with Quantize (dispatch/reference.h), as a quantized checkpoint holds them.
// Nothing for bf16 weights.
void QuantizeLayerWeights(MoeLayerData* layer);

// The per-tensor scale an engine calibrates for activations of magnitude up to `amax`
// in `format` (the layer's input_scale / intermediate_scale): fp8 amax / 448, nvfp4
// 448 x 6 / amax (FlashInfer's global scale); 1 for the other formats.
float ActivationScaleFor(moe::MoeFormat format, float amax);

// The tolerance of a layer's bf16 output against MoeLayerReference. bf16 activations:
// accumulation order and bf16 rounding. Quantized ones: a kernel's bf16 GEMM1 output one
// ulp off the reference's may quantize to the neighbouring code for GEMM2 (an e4m3 step is
// up to 12.5%, an e2m1 step up to 50%), though such flips are rare: the quantized pairs
// measured rel_fro 1.6e-3 to 7.8e-3 against this reference on the H200.
Tolerance MoeLayerTolerance(moe::MoeFormat activation_format);

// The layer's output [T, H] in double (before the final bf16 rounding): for each token,
// the sum over its kept slots of w x y, where y = bf16(Q(bf16(act(Q(a) W1^T))) W2^T), a
// is the token's row (times w, rounded to bf16, when the weight applies on input; then
// w = 1 in the sum) and Q the activation format's quantizer (identity for bf16), bit-exact
// as the kernels quantize. `accumulate_into`, when not empty, is added ([T, H] bf16).
std::vector<double> MoeLayerReference(const MoeLayerData& layer, const Routing& routing,
                                      const std::vector<uint16_t>& accumulate_into = {});

// The expert-major masked layer (MoeLayerOptions::input_layout "expert_major_masked"):
// layer.x is [L, max_m, H], expert e's rows 0 .. clamp(counts[e], 0, max_m) - 1 valid.
// Returns [L, max_m, H] in double: each valid row's y as MoeLayerReference computes it
// (before the final bf16 rounding; no routing weight, no sum), NaN for the rows past a
// count (the layer leaves them untouched). layer.tokens is not read.
std::vector<double> MaskedMoeLayerReference(const MoeLayerData& layer,
                                            const std::vector<int32_t>& counts, int max_m);

}  // namespace cubist::reference

#endif  // CUBIST_DISPATCH_MOE_LAYER_REFERENCE_H_
