// `cubist run --op moe`: the routed MoE layer (dispatch/moe_layer.h) on random inputs,
// checked against the CPU reference on a sample of tokens and timed. cli/run.cc parses
// the flags and opens the runtime; this file runs the layer.
#ifndef CUBIST_CLI_RUN_MOE_LAYER_H_
#define CUBIST_CLI_RUN_MOE_LAYER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "dispatch/moe_layer.h"
#include "dispatch/runtime.h"

namespace cubist::cli {

struct MoeLayerRunFlags {
  std::string weights = "bf16";
  std::string activations = "bf16";
  std::string activation = "swiglu";  // GEMM1's
  int experts = 0;                    // E
  int tokens = -1;                    // T
  int top_k = 0;
  int hidden = 0;
  int intermediate = 0;
  std::string routing = "renormalize";
  int n_group = 0;
  int topk_group = 0;
  float routed_scaling_factor = 1.0f;
  int64_t max_chunk_tokens = 0;
  // "token_major", or "expert_major_masked": [E, max_m, H] rows with per-expert counts
  // drawn from the seed (T = E x max_m; no routing).
  std::string input_layout = "token_major";
  int64_t max_m = 0;
  // fp8 x fp8: GEMM1's epilogue quantizes GEMM2's input ("on"), a separate kernel does
  // ("off"), or whichever the manifest serves ("auto"): MoeLayerOptions'.
  std::string fuse_intermediate_quantization = "auto";
  // nvfp4 x nvfp4: the GEMMs on nvfp4's bytes ("packed") or on their bf16 values
  // ("decoded"), or the cost model's choice ("auto"): MoeLayerOptions'.
  std::string nvfp4_gemm_inputs = "auto";
  // bf16 x bf16: GEMM1 reads the token rows through the row map itself ("on"), a gather
  // kernel copies them first ("off"), or whichever the manifest serves ("auto").
  std::string fuse_gather = "auto";
  // "on": each kernel's launch overlaps the previous one's tail (programmatic dependent
  // launch, MoeLayerOptions' default); "off": plain stream order.
  std::string pdl = "on";
  int check_tokens = 16;   // tokens compared with the reference
  int iterations = 20;
  int warmup = 3;
  uint64_t seed = 1;
  double copy_tbps = 4.0;  // the floor's read bandwidth
  bool json = false;
};

// The layer's options from the flags, checked (InvalidArgument naming the flag or the
// option; Unimplemented for a pair the layer does not serve), before any GPU is touched.
[[nodiscard]] absl::StatusOr<MoeLayerOptions> MoeLayerOptionsFromFlags(
    const MoeLayerRunFlags& flags);

// Runs, checks and times the layer on `rt`; returns the exit code (errors printed).
int RunMoeLayer(const MoeLayerRunFlags& flags, const MoeLayerOptions& options, Runtime& rt);

}  // namespace cubist::cli

#endif  // CUBIST_CLI_RUN_MOE_LAYER_H_
