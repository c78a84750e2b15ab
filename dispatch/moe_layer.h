// The routed Mixture-of-Experts layer as one op: routing, the sort of token slots by
// expert, the gather of token rows, GEMM1 with the gated activation, GEMM2 and the
// weighted sum of each token's rows - every step a kernel published in the manifest
// (kernels/moe_layer_abi.h for the glue, kernels/moe_gemm_abi.h for the GEMMs).
//
//   MoeLayerOptions o;
//   o.num_experts = 128;  o.top_k = 8;  o.hidden = 2048;  o.intermediate = 768;
//   o.routing_method = "renormalize";  o.activation = Activation::kSwiglu;
//   CUBIST_ASSIGN_OR_RETURN(auto layer, MoeLayer::Create(*runtime, o));
//   size_t bytes = MoeLayer::WorkspaceSize(o, max_tokens);   // the caller allocates it
//   MoeLayerArgs a;  a.tokens = T;  a.hidden_states = x;  a.router_logits = logits;
//   a.w1 = w1;  a.w2 = w2;  a.out = out;  a.workspace = ws;  a.workspace_bytes = bytes;
//   CUBIST_RETURN_IF_ERROR(layer->CanImplement(a, max_tokens));   // once, before capture
//   CUBIST_RETURN_IF_ERROR(layer->Run(a, stream));                  // every step
//
// The op is stateless with respect to the model: weights, their scales and the per-expert
// activation parameters come in Run's arguments, so one MoeLayer serves every layer of
// a model that shares the options.
//
// Run allocates nothing and never synchronizes with the host: every count (rows per
// expert, offsets, the permutation) is computed and read on the device, so a step can be
// captured in a CUDA graph. The GEMMs' grids are sized from a bucketed row capacity
// (a power of two >= T x k, capped by the workspace), so CanImplement(max_tokens)
// selects, fetches and loads every kernel any T <= max_tokens needs: capture loads nothing.
//
// Determinism: the sort is stable and the finalize sums each token's rows in slot order
// (weight descending, equal weights to the lower expert id) in fp32: the same bits on
// every run for the same GPU and kernel choice.
//
// Format pairs (weights x activations, both GEMMs): bf16 x bf16, fp8 x fp8 (per-tensor),
// fp8-block x fp8-block (1x128 activations, 128x128 weights), mxfp4 x bf16, mxfp4 x mxfp8
// and nvfp4 x nvfp4. For the quantized activation formats the layer quantizes both GEMMs'
// inputs itself with its moe_quantize kernels (kernels/moe_layer_abi.h states the
// rounding): the token rows on their way into expert order, and GEMM1's bf16 output -
// for fp8 x fp8, in GEMM1's own epilogue where the manifest has such a kernel
// (fuse_intermediate_quantization; the same bytes either way). Other pairs are refused by Create (Unimplemented naming the pair).
// For bf16 x bf16, GEMM1 reads the token rows from hidden_states through the sort's row
// map itself where the manifest has such kernels (fuse_gather), and no gather kernel runs.
//
// Masked input (input_layout "expert_major_masked"): the expert-major layout that
// low-latency all-to-all libraries deliver (DeepEP's low-latency dispatch; DeepGEMM's
// m_grouped_*_masked GEMMs take it): hidden_states bf16 [L, max_m, H] and
// masked_counts int32 [L] on the device, expert e's rows 0 .. counts[e] - 1 valid. The
// tokens are routed already and the library combines them afterwards, so the layer runs
// no routing and no finalize: out bf16 [L, max_m, H] gets, for each valid row (e, i),
// bf16(GEMM2(act(GEMM1(row)))) - the same per-row arithmetic, quantization and biases as
// the token-major layer - and rows i >= counts[e] of out are left untouched (neither
// read nor written). Counts are clamped to 0..max_m on the device, so a bad count never
// reads or writes outside its expert's slot. The valid rows are compacted on the device
// (moe_sort's cubist_moe_sort_masked, then the usual gather or quantizing gather), both
// GEMMs run on them as in the token-major layer, and moe_finalize's
// cubist_moe_finalize_masked writes them back; no host synchronization. Options: top_k,
// the routing options, apply_weight_on_input, finalize "none" and max_chunk_tokens are
// refused (InvalidArgument naming the field); args.tokens is L x max_m (0: a no-op
// that launches nothing); router_logits, routing_bias, topk_ids, topk_weights and
// accumulate are refused. The workspace holds L x max_m rows whatever max_tokens is.
//
// Thread safety: CanImplement and Run may be called from any number of threads at once;
// the calling thread's current context must be the runtime's (as for MoeGemm).
#ifndef CUBIST_DISPATCH_MOE_LAYER_H_
#define CUBIST_DISPATCH_MOE_LAYER_H_

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/runtime.h"
#include "dispatch/selector.h"
#include "kernels/moe_layer_abi.h"

namespace cubist {

struct MoeLayerOptions {
  DataFormat weight_format = DataFormat::kBf16;      // both GEMMs' weights
  DataFormat activation_format = DataFormat::kBf16;  // both GEMMs' activations
  Activation activation = Activation::kSwiglu;      // GEMM1's; GEMM2 is identity
  int64_t num_experts = 0;   // E: the router's width, global expert ids 0..E-1
  int64_t top_k = 0;         // k
  int64_t hidden = 0;        // H: a multiple of 8
  int64_t intermediate = 0;  // I: GEMM1 has 2I rows per expert when gated, I otherwise
  // Expert parallelism: this rank holds experts local_expert_offset ..
  // local_expert_offset + num_local_experts - 1 (0: all E). Slots routed elsewhere are
  // skipped and add nothing.
  int64_t local_expert_offset = 0;
  int64_t num_local_experts = 0;
  // "default", "renormalize", "renormalize_naive", "deepseek_v3", "llama4", "topk",
  // "sigmoid", "sigmoid_renorm" (kernels/moe_layer_abi.h defines each).
  std::string routing_method = "renormalize";
  int64_t n_group = 0;     // deepseek_v3
  int64_t topk_group = 0;  // deepseek_v3
  float routed_scaling_factor = 1.0f;  // deepseek_v3
  // Multiply each token's input row by its routing weight before GEMM1 (llama4; needs
  // top_k 1), instead of the rows after GEMM2.
  bool apply_weight_on_input = false;
  std::string logits_format = "fp32";  // "fp32" or "bf16"
  // Tokens per pass: Run processes larger batches in chunks of this many tokens, so the
  // workspace is bounded (0: one pass; WorkspaceSize is then for max_tokens).
  int64_t max_chunk_tokens = 0;
  // "sum": the deterministic weighted sum into out. "none": no finalize; Run leaves the
  // unweighted rows, the routing and the permutation in the workspace (MoeLayerOutputs).
  std::string finalize = "sum";
  // Launch every kernel with programmatic stream serialization, so each one's prologue
  // overlaps the previous one's tail (the GEMMs only where their entries say "pdl"). It
  // overrides gemm.programmatic_dependent_launch.
  bool programmatic_dependent_launch = true;
  // "token_major": hidden_states [T, H], routed and summed into out [T, H] as above.
  // "expert_major_masked": hidden_states [L, max_m, H] with per-expert counts, out
  // [L, max_m, H] ("Masked input" above).
  std::string input_layout = "token_major";
  int64_t max_m = 0;  // expert_major_masked: rows per expert slot (L x max_m <= 2^31 - 1)
  // The fp8 x fp8 (per-tensor) pair's quantization of GEMM1's output to GEMM2's input:
  // "on": GEMM1's epilogue writes e4m3 straight into GEMM2's input (a kernel whose entry
  // says "output_format": "fp8"; CanImplement fails NotFound without one); "off": GEMM1
  // writes bf16 and the separate quantize kernel converts it; "auto": on when the
  // manifest has an fp8-output GEMM1 kernel that serves the layer's shape (its
  // activation, formats, alignment) on this device, else off. Both give the same bytes:
  // the fused epilogue rounds to bf16 first and then quantizes with the same rule
  // (kernels/moe_gemm_abi.h, version 4). Other pairs accept "auto" and "off" only.
  std::string fuse_intermediate_quantization = "auto";
  // The nvfp4 x nvfp4 pair's GEMM inputs. "packed": the GEMMs read nvfp4's codes and
  // scales, and every CTA decodes its activation tile (nvfp4 x nvfp4 kernels).
  // "decoded": the quantize kernels write each element's value e2m1 x e4m3 as bf16
  // (cubist_moe_quantize_nvfp4_decoded: the same quantization, exact in bf16) and nvfp4
  // x bf16 kernels read it, the global scale in their epilogue: the same products, read
  // once instead of decoded by every weight-row tile (1.3x faster GEMMs at 128 tokens per
  // expert), for 3.6x the bytes of the inputs. "auto": per row bucket, decoded where the
  // cost model prices both decoded GEMMs at least 5% below the packed ones and the
  // manifest has the decoding quantize kernel. Other pairs take "auto" and "packed".
  // "auto" and "decoded" size GEMM2's input for bf16 (WorkspaceLayout).
  std::string nvfp4_gemm_inputs = "auto";
  // How GEMM1 gets the bf16 x bf16 pair's token rows in expert order. "on": GEMM1 reads
  // each row from hidden_states through the sort's row map (a kernel whose entry says
  // "a_gather", kernels/moe_gemm_abi.h version 5; CanImplement fails NotFound without
  // one), so no gather kernel runs and no gathered copy is written and read back; "off":
  // cubist_moe_gather_bf16 writes the rows in expert order and GEMM1 reads them; "auto":
  // on where the manifest has a gathering GEMM1 kernel for the layer's shape on this
  // device and GEMM1 is narrower than 8,192 columns (N = 2I gated, I otherwise): from
  // there the gather kernel measured faster (docs/benchmarks.md, "Gather in GEMM1"). The
  // same bits either way (the same products; only where A's rows come from differs).
  // Quantized pairs gather inside their quantize kernel and take "auto" and "off"; so
  // does apply_weight_on_input, whose rows are scaled before GEMM1.
  std::string fuse_gather = "auto";
  MoeGemmOptions gemm;  // for both GEMMs (pinning, inexact kernels)
};

struct MoeLayerArgs {
  int64_t tokens = 0;              // T (expert_major_masked: L x max_m, or 0)
  CUdeviceptr hidden_states = 0;   // bf16 [T, H] (expert_major_masked: [L, max_m, H])
  // expert_major_masked: int32 [L] on the device, the valid rows of each expert's slot
  // (clamped to 0..max_m on the device). 0 in the token-major layout.
  CUdeviceptr masked_counts = 0;
  // Routed on the device from logits [T, E] (logits_format), with an optional fp32
  // bias [E] (deepseek_v3); or pre-routed: router_logits 0 and topk_ids int32 [T, k] +
  // topk_weights fp32 [T, k] given. Ids outside 0..E-1 are dropped (never read or
  // written; MoeLayerOutputs::dropped counts them).
  CUdeviceptr router_logits = 0;
  CUdeviceptr routing_bias = 0;
  CUdeviceptr topk_ids = 0;
  CUdeviceptr topk_weights = 0;
  // Weights of the local experts: w1 [L, N1, H], w2 [L, H, I] (the weight format), and
  // GEMM1's per-expert alpha/beta/limit [L] fp32 (0: the activation's defaults).
  CUdeviceptr w1 = 0, w2 = 0;
  // The weights' scales, as the moe_gemm kernels take them (kernels/moe_gemm_abi.h):
  // block scales (fp8-block [L, ceil(N/128), ceil(K/128)] fp32; mxfp4 [L, N, K/32] ue8m0;
  // nvfp4 [L, N, K/16] e4m3) and per-expert global scales [L] fp32 (fp8, nvfp4).
  CUdeviceptr w1_scale = 0, w2_scale = 0;
  CUdeviceptr w1_global_scale = 0, w2_global_scale = 0;
  // The activations' per-tensor scales, fp32 [1] on the device, for fp8 and nvfp4
  // activations: GEMM1's input (input_scale) and GEMM2's input (intermediate_scale).
  // fp8: the dequantization scale s (x ~ q x s). nvfp4: the global quantization scale g
  // in FlashInfer's convention (g = 448 x 6 / amax; fp4_quantize's global_scale).
  CUdeviceptr input_scale = 0, intermediate_scale = 0;
  // The experts' biases, fp32, or 0: w1_bias [L, N1] (GEMM1's rows, in w1's row order)
  // added before the activation, w2_bias [L, H] added to GEMM2's output before the
  // weighted sum (gpt-oss). Served by the generation-2 GEMMs (parameter struct version 3).
  CUdeviceptr w1_bias = 0, w2_bias = 0;
  CUdeviceptr alpha = 0, beta = 0, limit = 0;
  CUdeviceptr out = 0;     // bf16 [T, H] (expert_major_masked: [L, max_m, H])
  bool accumulate = false;  // add into out (a shared expert's output computed beside)
  CUdeviceptr workspace = 0;  // WorkspaceSize bytes, 256-byte aligned, owned by the caller
  size_t workspace_bytes = 0;
};

// Where the intermediate arrays lie in the workspace (for the no-finalize mode, tests and
// debugging): byte offsets from the workspace's start, sized for `chunk_tokens` tokens.
// expert_major_masked: chunk_tokens = row_capacity = L x max_m; offsets holds the
// compacted experts' offsets, permuted_to_expanded the row map (row r of the compacted
// rows is row e x max_m + i of hidden_states), and the routing arrays (topk_ids,
// topk_weights, dropped, expanded_to_permuted, chunk_counts) are unused.
struct MoeLayerWorkspace {
  int64_t chunk_tokens = 0;  // tokens per pass
  int64_t row_capacity = 0;  // chunk_tokens x k
  size_t topk_ids = 0;       // int32 [chunk, k] (routed on the device)
  size_t topk_weights = 0;   // fp32 [chunk, k]
  size_t offsets = 0;        // int32 [L + 1]
  size_t dropped = 0;        // int32 [1]
  size_t expanded_to_permuted = 0;  // int32 [chunk x k]
  size_t permuted_to_expanded = 0;  // int32 [chunk x k]
  size_t chunk_counts = 0;   // int32 [sort chunks, L + 1]
  size_t gathered = 0;       // GEMM1's input [chunk x k, H], the activation format
  size_t gathered_scale = 0;  // its block scales (quantized formats)
  size_t activated = 0;      // bf16 [chunk x k, I]: GEMM1's output (unused when GEMM1
                             // writes fp8 into `quantized` itself: fused quantization)
  size_t quantized = 0;      // GEMM2's input [chunk x k, I] (quantized formats; else
                             // GEMM2 reads `activated`)
  size_t quantized_scale = 0;  // its block scales
  size_t global_scales = 0;  // fp32 [2]: nvfp4's rcp(g) of GEMM1's and GEMM2's input
  size_t rows = 0;           // bf16 [chunk x k, H]: GEMM2's output
  size_t bytes = 0;          // total
};

class MoeLayer {
 public:
  // Errors: InvalidArgument naming the option (top_k > E, E % n_group, topk_group >
  // n_group, k over the kernels' limit, an unknown routing method or finalize mode, ...),
  // Unimplemented for a format pair the layer does not serve yet.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MoeLayer>> Create(
      Runtime& runtime, const MoeLayerOptions& options);
  ~MoeLayer();

  // The layout of the workspace Run needs for batches of up to max_tokens tokens.
  [[nodiscard]] static absl::StatusOr<MoeLayerWorkspace> WorkspaceLayout(
      const MoeLayerOptions& options, int64_t max_tokens);
  [[nodiscard]] static absl::StatusOr<size_t> WorkspaceSize(const MoeLayerOptions& options,
                                                            int64_t max_tokens);

  // Checks the arguments (pointers, alignment, the workspace's size) for every T up to
  // max_tokens, and selects, fetches and loads every kernel those batches need.
  [[nodiscard]] absl::Status CanImplement(const MoeLayerArgs& args, int64_t max_tokens);
  // Launches the layer on `stream`. T = 0 is a successful no-op.
  [[nodiscard]] absl::Status Run(const MoeLayerArgs& args, CUstream stream);

  const MoeLayerOptions& options() const { return options_; }
  // Whether GEMM1 writes GEMM2's fp8 input itself (fuse_intermediate_quantization, as
  // Create resolved "auto"), so that no quantize kernel runs between the GEMMs.
  bool fuses_intermediate_quantization() const { return fuse_; }
  // Whether GEMM1 reads the token rows through the row map itself (fuse_gather, as
  // Create resolved "auto"), so that no gather kernel runs.
  bool fuses_gather() const { return gather_fused_; }
  // Whether batches of up to `tokens` tokens run the nvfp4 pair's GEMMs on decoded bf16
  // inputs (nvfp4_gemm_inputs, "auto" resolved for their row bucket). Host only.
  bool DecodesNvfp4Inputs(int64_t tokens);
  moe::MoeRoutingMethod routing_method() const { return method_; }

 private:
  struct Kernel {
    const KernelEntry* entry = nullptr;
    CUfunction function = nullptr;
  };
  struct Pass;  // one pass over a chunk of tokens (moe_layer.cc)
  MoeLayer(Runtime& runtime, const MoeLayerOptions& options);
  SelectOptions GemmSelectOptions() const;
  // fuse_intermediate_quantization resolved against the manifest ("auto").
  bool ResolveFusion() const;
  // fuse_gather resolved against the manifest ("auto").
  bool ResolveGatherFusion() const;
  bool Gemm1Serves(const MoeGemmArgs& gemm1) const;
  absl::Status LoadGlue();
  absl::Status RaiseSharedLimits();
  absl::Status ValidateArgs(const MoeLayerArgs& args, int64_t max_tokens) const;
  // The steps of one pass, in launch order.
  absl::Status RunChunk(const MoeLayerArgs& args, int64_t first_token, int64_t tokens,
                        CUstream stream);
  // Route (with logits) and Sort: one launch of cubist_moe_route_sort where it serves the
  // pass (decode) and the manifest has it, else the route kernel and the sort kernels.
  absl::Status RouteAndSort(const MoeLayerArgs& args, const Pass& pass, CUstream stream);
  moe::MoeRouteParams RouteParams(const MoeLayerArgs& args, const Pass& pass) const;
  moe::MoeSortParams SortParams(const Pass& pass) const;
  absl::Status Sort(moe::MoeSortParams params, int64_t slots, CUstream stream);
  absl::Status RunExperts(const MoeLayerArgs& args, const Pass& pass, CUstream stream);
  absl::Status GatherInput(const MoeLayerArgs& args, const Pass& pass, bool decoded,
                           CUstream stream);
  absl::Status QuantizeIntermediate(const MoeLayerArgs& args, const Pass& pass, bool decoded,
                                    CUstream stream);
  absl::Status Finalize(const MoeLayerArgs& args, const Pass& pass, CUstream stream);
  // The expert-major masked layout: compaction, both GEMMs, the scatter back.
  absl::Status RunMasked(const MoeLayerArgs& args, CUstream stream);
  absl::Status MaskedStep(const Kernel& k, const MoeLayerArgs& args, const Pass& pass,
                          CUstream stream);
  absl::Status Launch(const Kernel& k, unsigned grid, unsigned block, unsigned shared,
                      void* params, CUstream stream);
  // GEMM `gemm` (1 or 2) of a pass whose workspace starts at `ws`, laid out as `w`;
  // `decoded`: its input is nvfp4's decoded bf16 values (nvfp4_gemm_inputs).
  MoeGemmArgs GemmArgs(const MoeLayerArgs& args, int gemm, CUdeviceptr ws,
                       const MoeLayerWorkspace& w, bool decoded = false) const;
  // nvfp4_gemm_inputs for a pass laid out as `w` ("auto": the cost model's choice for its
  // row bucket, made once per bucket).
  bool Decoded(const MoeLayerWorkspace& w);
  bool DecodedIsFaster(const MoeLayerWorkspace& w) const;
  // A quantize or gather kernel's grid: one CTA per row, at most 8 per SM (they loop).
  unsigned RowCtas(int64_t rows) const;
  // A quantize kernel's grid for `slots` rows of q->cols columns, with q->col_parts set
  // (moe::MoeQuantizeParts: at decode a row's passes are spread over several CTAs).
  unsigned QuantizeCtas(int64_t slots, moe::MoeQuantizeParams* q) const;

  Runtime* runtime_;
  MoeLayerOptions options_;
  moe::MoeRoutingMethod method_ = moe::kRouteRenormalize;
  bool fuse_ = false;    // GEMM1 writes fp8 (fuse_intermediate_quantization resolved)
  bool gather_fused_ = false;  // GEMM1 reads rows through the row map (fuse_gather)
  bool masked_ = false;  // input_layout "expert_major_masked"
  bool logits_bf16_ = false;
  int64_t local_experts_ = 0;  // L
  // The glue kernels, resolved once (LoadGlue) and read without a lock afterwards.
  absl::Mutex glue_mu_;
  std::atomic<bool> glue_loaded_{false};
  Kernel route_, sort_fused_, sort_count_, sort_scan_, sort_scatter_, gather_, finalize_;
  Kernel route_sort_;  // optional: null when the manifest predates it
  Kernel sort_masked_, finalize_masked_;  // expert_major_masked only
  Kernel quantize_;  // for the activation format (quantized formats only)
  // nvfp4 x nvfp4 with nvfp4_gemm_inputs "auto" (optional: a manifest may predate it) or
  // "decoded": cubist_moe_quantize_nvfp4_decoded.
  Kernel quantize_decoded_;
  // "auto"'s choice per row bucket (MoeLayerWorkspace::row_capacity).
  absl::Mutex decoded_mu_;
  absl::flat_hash_map<int64_t, bool> decoded_ ABSL_GUARDED_BY(decoded_mu_);
  std::unique_ptr<MoeGemm> gemm1_, gemm2_;
};

// "renormalize" -> kRouteRenormalize; InvalidArgument listing the names otherwise.
[[nodiscard]] absl::StatusOr<moe::MoeRoutingMethod> ParseRoutingMethod(std::string_view name);
// "default, renormalize, renormalize_naive, deepseek_v3, llama4, topk, sigmoid, sigmoid_renorm"
std::string AllRoutingMethodNames();

}  // namespace cubist

#endif  // CUBIST_DISPATCH_MOE_LAYER_H_
