#include "dispatch/moe_layer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "dispatch/selector.h"
#include "loader/driver_api.h"

namespace cubist {
namespace {

constexpr size_t kAlign = 256;  // every workspace array starts on a 256-byte boundary
constexpr int64_t kInt32Max = 0x7FFFFFFF;
// fuse_gather "auto" keeps the gather kernel from this GEMM1 width (N) on
// (ResolveGatherFusion).
constexpr int64_t kGatherKernelFromGemm1N = 8192;

size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

absl::Status Bad(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("moe layer: ", Sv(field), ": ", Sv(what)));
}

int64_t LocalExperts(const MoeLayerOptions& o) {
  return o.num_local_experts > 0 ? o.num_local_experts : o.num_experts;
}

int64_t ChunkTokens(const MoeLayerOptions& o, int64_t tokens) {
  return o.max_chunk_tokens > 0 ? std::min(tokens, o.max_chunk_tokens) : tokens;
}

// Rows the GEMMs are sized for: a power of two >= T x k, so that the kernels chosen for a
// bucket serve every batch in it and CanImplement(max_tokens) has log2(max_tokens x k)
// GEMM problems to prepare, not max_tokens. The buckets start at one row: a decode step
// of Mixtral-8x7B is 2 rows over 8 experts, and sized as 64 rows its GEMMs were chosen
// for a grid of every expert's tiles (GEMM2's 64 CTAs left half the SMs idle).
int64_t RowBucketFor(int64_t tokens, int64_t top_k) {
  int64_t rows = 1;
  while (rows < tokens * top_k) rows *= 2;
  return rows;
}

// The format pairs the layer serves (weights x activations) and the quantize kernel of
// each quantized activation format.
struct LayerPair {
  DataFormat weights, activations;
};
constexpr LayerPair kLayerPairs[] = {
    {DataFormat::kBf16, DataFormat::kBf16},       {DataFormat::kFp8, DataFormat::kFp8},
    {DataFormat::kFp8Block, DataFormat::kFp8Block}, {DataFormat::kMxfp4, DataFormat::kBf16},
    {DataFormat::kMxfp4, DataFormat::kMxfp8},     {DataFormat::kNvfp4, DataFormat::kBf16},
    {DataFormat::kNvfp4, DataFormat::kNvfp4},
};

const char* QuantizeFunction(DataFormat f) {
  switch (f) {
    case DataFormat::kFp8: return "cubist_moe_quantize_fp8";
    case DataFormat::kFp8Block: return "cubist_moe_quantize_fp8_block";
    case DataFormat::kMxfp8: return "cubist_moe_quantize_mxfp8";
    case DataFormat::kNvfp4: return "cubist_moe_quantize_nvfp4";
    default: return nullptr;
  }
}

bool Quantized(DataFormat activations) { return activations != DataFormat::kBf16; }

// Columns of a quantized row must hold whole scale blocks (fp8-block: a partial last
// block is allowed) and whole 16-byte loads of bf16.
int64_t ColsMultiple(DataFormat activations) {
  const int64_t block =
      activations == DataFormat::kFp8Block ? 0 : moe::FormatScaleBlock(activations);
  return std::max<int64_t>(8, block);
}

absl::Status ValidatePair(const MoeLayerOptions& o) {
  bool served = false;
  std::string names;
  for (const LayerPair& p : kLayerPairs) {
    served = served || (p.weights == o.weight_format && p.activations == o.activation_format);
    absl::StrAppend(&names, names.empty() ? "" : ", ", Sv(DataFormatName(p.weights)), " x ",
                    Sv(DataFormatName(p.activations)));
  }
  if (!served) {
    return absl::UnimplementedError(absl::StrCat(
        "moe layer: the ", Sv(DataFormatName(o.weight_format)), " x ",
        Sv(DataFormatName(o.activation_format)), " pair is not served by the layer (", names,
        " are); run the GEMMs with MoeGemm"));
  }
  const int64_t m = ColsMultiple(o.activation_format);
  if (o.hidden % m != 0 || o.intermediate % m != 0) {
    return Bad(o.hidden % m != 0 ? "hidden" : "intermediate",
               absl::StrCat(o.hidden % m != 0 ? o.hidden : o.intermediate,
                            " is not a multiple of ", m, ", which ",
                            Sv(DataFormatName(o.activation_format)),
                            " activations need (whole scale blocks)"));
  }
  return absl::OkStatus();
}

bool Masked(const MoeLayerOptions& o) { return o.input_layout == "expert_major_masked"; }

// The expert-major masked layout: its row count, and no option of the token-major
// layer's routing or finalize (a caller setting one expects it to be used).
absl::Status ValidateMaskedOptions(const MoeLayerOptions& o) {
  const int64_t l = LocalExperts(o);
  if (o.max_m < 1 || o.max_m > kInt32Max / l) {
    return Bad("max_m", absl::StrCat(o.max_m, " is outside 1..", kInt32Max / l,
                                     " (L x max_m rows must fit the kernels' int32 rows)"));
  }
  const MoeLayerOptions defaults;
  const struct {
    const char* field;
    bool set;
  } routing[] = {
      {"top_k", o.top_k != 0},
      {"routing_method", o.routing_method != defaults.routing_method},
      {"n_group", o.n_group != 0},
      {"topk_group", o.topk_group != 0},
      {"routed_scaling_factor", o.routed_scaling_factor != 1.0f},
      {"apply_weight_on_input", o.apply_weight_on_input},
      {"logits_format", o.logits_format != defaults.logits_format},
  };
  for (const auto& r : routing) {
    if (r.set) {
      return Bad(r.field, "is a routing option; expert_major_masked input is routed already "
                          "(by the all-to-all): leave it unset");
    }
  }
  if (o.finalize != "sum") {
    return Bad("finalize", "expert_major_masked input has no finalize (the all-to-all "
                           "combines): leave it 'sum', the rows go to out");
  }
  if (o.max_chunk_tokens != 0) {
    return Bad("max_chunk_tokens", "expert_major_masked input runs in one pass (its workspace "
                                   "holds L x max_m rows); set 0");
  }
  return absl::OkStatus();
}

// The shapes and the format pair, common to both input layouts.
absl::Status ValidateShapes(const MoeLayerOptions& o) {
  if (!OpSupports(Op::kMoeGemm, o.activation) || !moe::MoeGemmEncodes(o.activation)) {
    return Bad("activation", "not a moe_gemm activation");
  }
  if (o.num_experts < 1 || o.num_experts > moe::kMoeRouteMaxExperts) {
    return Bad("num_experts", absl::StrCat(o.num_experts, " is outside 1..",
                                           moe::kMoeRouteMaxExperts));
  }
  const int64_t l = LocalExperts(o);
  if (o.local_expert_offset < 0 || l < 1 || l > moe::kMoeSortMaxExperts ||
      o.local_expert_offset + l > o.num_experts) {
    return Bad("local experts",
               absl::StrCat("experts ", o.local_expert_offset, "..", o.local_expert_offset + l - 1,
                            " are not within the ", o.num_experts,
                            " experts; set local_expert_offset and num_local_experts so "
                            "that offset + count <= num_experts"));
  }
  if (o.hidden < 8 || o.hidden % 8 != 0) {
    return Bad("hidden", absl::StrCat(o.hidden, " is not a positive multiple of 8"));
  }
  if (o.intermediate < 8 || o.intermediate % 8 != 0) {
    return Bad("intermediate", absl::StrCat(o.intermediate, " is not a positive multiple of 8"));
  }
  return ValidatePair(o);
}

// A fusion option's mode: auto, on or off, and "on" only for the w x a pair (`pair` as
// users name it); other pairs are told `why` they have nothing to fuse.
absl::Status ValidateFusionMode(std::string_view field, const std::string& mode,
                                const MoeLayerOptions& o, DataFormat w, DataFormat a,
                                std::string_view pair, std::string_view why) {
  if (mode != "auto" && mode != "on" && mode != "off") {
    return Bad(field, absl::StrCat("'", mode, "' is not auto, on or off"));
  }
  if (mode == "on" && !(o.weight_format == w && o.activation_format == a)) {
    return Bad(field, absl::StrCat("'on' needs the ", Sv(pair), " pair; the ",
                                   Sv(DataFormatName(o.weight_format)), " x ",
                                   Sv(DataFormatName(o.activation_format)), " pair", Sv(why),
                                   ": use auto or off"));
  }
  return absl::OkStatus();
}

// fuse_intermediate_quantization: "on" only where a GEMM1 can write GEMM2's input
// (per-tensor fp8; block scales span tiles).
absl::Status ValidateFusion(const MoeLayerOptions& o) {
  return ValidateFusionMode("fuse_intermediate_quantization", o.fuse_intermediate_quantization,
                            o, DataFormat::kFp8, DataFormat::kFp8, "fp8 x fp8 (per-tensor)",
                            "'s intermediate is quantized by a kernel of its own");
}

// fuse_gather: "on" only where GEMM1 reads the token rows as they are (bf16 x bf16, no
// routing weight applied on input).
absl::Status ValidateGatherFusion(const MoeLayerOptions& o) {
  CUBIST_RETURN_IF_ERROR(ValidateFusionMode("fuse_gather", o.fuse_gather, o, DataFormat::kBf16,
                                            DataFormat::kBf16, "bf16 x bf16",
                                            " gathers the rows inside its quantize kernel"));
  if (o.fuse_gather == "on" && o.apply_weight_on_input) {
    return Bad("fuse_gather", "'on' reads the rows as they are, but apply_weight_on_input "
                              "scales them before GEMM1 (the gather kernel does): use auto "
                              "or off");
  }
  return absl::OkStatus();
}

bool Nvfp4Pair(const MoeLayerOptions& o) {
  return o.weight_format == DataFormat::kNvfp4 && o.activation_format == DataFormat::kNvfp4;
}

// nvfp4_gemm_inputs: a known mode, and "decoded" only for the nvfp4 x nvfp4 pair.
absl::Status ValidateNvfp4Inputs(const MoeLayerOptions& o) {
  const std::string& m = o.nvfp4_gemm_inputs;
  if (m != "auto" && m != "packed" && m != "decoded") {
    return Bad("nvfp4_gemm_inputs", absl::StrCat("'", m, "' is not auto, packed or decoded"));
  }
  if (m == "decoded" && !Nvfp4Pair(o)) {
    return Bad("nvfp4_gemm_inputs",
               absl::StrCat("'decoded' needs the nvfp4 x nvfp4 pair; the ",
                            Sv(DataFormatName(o.weight_format)), " x ",
                            Sv(DataFormatName(o.activation_format)),
                            " pair has no nvfp4 inputs to decode: use auto or packed"));
  }
  return absl::OkStatus();
}

// Whether the workspace holds room for decoded nvfp4 inputs.
bool MayDecode(const MoeLayerOptions& o) {
  return Nvfp4Pair(o) && o.nvfp4_gemm_inputs != "packed";
}

absl::Status ValidateOptions(const MoeLayerOptions& o) {
  CUBIST_RETURN_IF_ERROR(ValidateShapes(o));
  CUBIST_RETURN_IF_ERROR(ValidateFusion(o));
  CUBIST_RETURN_IF_ERROR(ValidateNvfp4Inputs(o));
  CUBIST_RETURN_IF_ERROR(ValidateGatherFusion(o));
  if (Masked(o)) return ValidateMaskedOptions(o);
  if (o.input_layout != "token_major") {
    return Bad("input_layout", absl::StrCat("'", o.input_layout,
                                            "' is not token_major or expert_major_masked"));
  }
  if (o.max_m != 0) return Bad("max_m", "is for expert_major_masked input only; set 0");
  if (o.top_k < 1 || o.top_k > o.num_experts) {
    return Bad("top_k", absl::StrCat(o.top_k, " is outside 1..num_experts (", o.num_experts, ")"));
  }
  if (o.top_k > moe::kMoeRouteMaxTopK) {
    return Bad("top_k", absl::StrCat(o.top_k, " exceeds the kernels' limit of ",
                                     moe::kMoeRouteMaxTopK));
  }
  CUBIST_ASSIGN_OR_RETURN(moe::MoeRoutingMethod m, ParseRoutingMethod(o.routing_method));
  if (m == moe::kRouteDeepSeekV3) {
    if (o.n_group < 1 || o.num_experts % o.n_group != 0) {
      return Bad("n_group", absl::StrCat(o.n_group, " does not divide num_experts (",
                                         o.num_experts, ")"));
    }
    if (o.num_experts / o.n_group < 2) {
      return Bad("n_group", "each group needs at least two experts (a group scores its top 2)");
    }
    if (o.topk_group < 1 || o.topk_group > o.n_group) {
      return Bad("topk_group", absl::StrCat(o.topk_group, " is outside 1..n_group (", o.n_group, ")"));
    }
    if (o.top_k > o.topk_group * (o.num_experts / o.n_group)) {
      return Bad("top_k", absl::StrCat(o.top_k, " exceeds the experts of the kept groups (",
                                       o.topk_group * (o.num_experts / o.n_group), ")"));
    }
  }
  if (m == moe::kRouteLlama4 && o.top_k != 1) {
    return Bad("top_k", "llama4 routing chooses one expert per token; set top_k to 1");
  }
  if (o.apply_weight_on_input && o.top_k != 1) {
    return Bad("apply_weight_on_input",
               "weights applied on input need top_k 1 (a token's row would differ per slot)");
  }
  if (o.logits_format != "fp32" && o.logits_format != "bf16") {
    return Bad("logits_format", absl::StrCat("'", o.logits_format, "' is not fp32 or bf16"));
  }
  if (o.finalize != "sum" && o.finalize != "none") {
    return Bad("finalize", absl::StrCat("'", o.finalize, "' is not sum or none"));
  }
  if (o.max_chunk_tokens < 0) return Bad("max_chunk_tokens", "is negative");
  return absl::OkStatus();
}


// The workspace for passes of up to `rows` rows (a RowBucketFor value; the masked
// layout: L x max_m, with no routing slots and a row map of `rows` entries).
MoeLayerWorkspace LayoutForRows(const MoeLayerOptions& o, int64_t chunk_tokens, int64_t rows) {
  MoeLayerWorkspace w;
  w.chunk_tokens = chunk_tokens;
  w.row_capacity = rows;
  const int64_t l = LocalExperts(o);
  const bool masked = Masked(o);
  const size_t slots = masked ? 0 : static_cast<size_t>(chunk_tokens * o.top_k);
  const size_t map = masked ? static_cast<size_t>(rows) : slots;
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at = AlignUp(at + std::max<size_t>(bytes, 1));
    return here;
  };
  w.topk_ids = take(4 * slots);
  w.topk_weights = take(4 * slots);
  w.offsets = take(4 * static_cast<size_t>(l + 1));
  w.dropped = take(4);
  w.expanded_to_permuted = take(4 * slots);
  w.permuted_to_expanded = take(4 * map);
  w.chunk_counts =
      take(4 * static_cast<size_t>(moe::MoeSortChunks(static_cast<int64_t>(slots)) * (l + 1)));
  // GEMM1's output is I wide either way (gated: 2I rows make I columns).
  const DataFormat af = o.activation_format;
  w.gathered = take(static_cast<size_t>(moe::MoeElementBytes(af, rows * o.hidden)));
  w.gathered_scale = take(static_cast<size_t>(moe::MoeScaleBytes(af, rows, o.hidden)));
  w.activated = take(2 * static_cast<size_t>(rows * o.intermediate));
  const bool q = Quantized(af);
  // Decoded nvfp4 inputs: GEMM1's in `rows` (bf16 [rows, H], free until GEMM2 writes it),
  // GEMM2's in `quantized`, then bf16 [rows, I].
  const size_t quantized_bytes =
      std::max<size_t>(static_cast<size_t>(moe::MoeElementBytes(af, rows * o.intermediate)),
                       MayDecode(o) ? 2 * static_cast<size_t>(rows * o.intermediate) : 0);
  w.quantized = q ? take(quantized_bytes) : w.activated;
  w.quantized_scale = take(static_cast<size_t>(moe::MoeScaleBytes(af, rows, o.intermediate)));
  w.global_scales = take(8);
  w.rows = take(2 * static_cast<size_t>(rows * o.hidden));
  w.bytes = at;
  return w;
}

// The masked layout's one pass: every row of [L, max_m, H] may be valid.
MoeLayerWorkspace MaskedLayout(const MoeLayerOptions& o) {
  const int64_t rows = LocalExperts(o) * o.max_m;
  return LayoutForRows(o, rows, rows);
}

// The token-major layout every pass of a batch of `tokens` tokens uses: its chunk and
// that chunk's row bucket.
MoeLayerWorkspace BatchLayout(const MoeLayerOptions& o, int64_t tokens) {
  const int64_t chunk = ChunkTokens(o, std::max<int64_t>(tokens, 1));
  return LayoutForRows(o, chunk, RowBucketFor(chunk, o.top_k));
}

}  // namespace

absl::StatusOr<moe::MoeRoutingMethod> ParseRoutingMethod(std::string_view name) {
  for (int32_t i = 0; i < moe::kMoeRoutingMethods; ++i) {
    const auto m = static_cast<moe::MoeRoutingMethod>(i);
    if (name == moe::MoeRoutingMethodName(m)) return m;
  }
  return absl::InvalidArgumentError(absl::StrCat("moe layer: routing_method: unknown '",
                                                 Sv(name), "'; expected one of ",
                                                 AllRoutingMethodNames()));
}

std::string AllRoutingMethodNames() {
  std::string out;
  for (int32_t i = 0; i < moe::kMoeRoutingMethods; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ",
                    moe::MoeRoutingMethodName(static_cast<moe::MoeRoutingMethod>(i)));
  }
  return out;
}

absl::StatusOr<MoeLayerWorkspace> MoeLayer::WorkspaceLayout(const MoeLayerOptions& options,
                                                            int64_t max_tokens) {
  CUBIST_RETURN_IF_ERROR(ValidateOptions(options));
  if (max_tokens < 0) return Bad("max_tokens", "is negative");
  if (Masked(options)) return MaskedLayout(options);
  const int64_t chunk = ChunkTokens(options, std::max<int64_t>(max_tokens, 1));
  const int64_t rows = RowBucketFor(chunk, options.top_k);
  if (rows > kInt32Max) {
    return Bad("max_tokens", absl::StrCat(chunk, " tokens x top_k ", options.top_k,
                                          " exceed the kernels' int32 rows; set max_chunk_tokens"));
  }
  return LayoutForRows(options, chunk, rows);
}

absl::StatusOr<size_t> MoeLayer::WorkspaceSize(const MoeLayerOptions& options,
                                               int64_t max_tokens) {
  CUBIST_ASSIGN_OR_RETURN(MoeLayerWorkspace w, WorkspaceLayout(options, max_tokens));
  return w.bytes;
}

MoeLayer::MoeLayer(Runtime& runtime, const MoeLayerOptions& options)
    : runtime_(&runtime), options_(options) {}

MoeLayer::~MoeLayer() = default;

absl::StatusOr<std::unique_ptr<MoeLayer>> MoeLayer::Create(Runtime& runtime,
                                                           const MoeLayerOptions& options) {
  CUBIST_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<MoeLayer> layer(new MoeLayer(runtime, options));
  CUBIST_ASSIGN_OR_RETURN(layer->method_, ParseRoutingMethod(options.routing_method));
  layer->masked_ = Masked(options);
  layer->logits_bf16_ = options.logits_format == "bf16";
  layer->local_experts_ = LocalExperts(options);
  // Every kernel of the layer overlaps its prologue with the previous one's tail: the glue
  // kernels and the GEMM kernels whose entries say "pdl" wait for the previous grid before
  // reading; a GEMM entry without it (built before its kernels waited) is launched in
  // plain stream order by MoeGemm, since the glue kernels let their dependents launch early.
  MoeGemmOptions gemm_options = options.gemm;
  gemm_options.programmatic_dependent_launch = options.programmatic_dependent_launch;
  CUBIST_ASSIGN_OR_RETURN(layer->gemm1_, MoeGemm::Create(runtime, gemm_options));
  CUBIST_ASSIGN_OR_RETURN(layer->gemm2_, MoeGemm::Create(runtime, gemm_options));
  layer->fuse_ = layer->ResolveFusion();
  layer->gather_fused_ = layer->ResolveGatherFusion();
  return layer;
}

// How the layer's MoeGemms select (the kernels this build can launch, inexact ones only
// when allowed), for the choices the layer makes from the same selection.
SelectOptions MoeLayer::GemmSelectOptions() const {
  SelectOptions so;
  so.abi = moe::kMoeGemmAbi;
  so.allow_inexact = options_.gemm.allow_inexact;
  return so;
}

// Whether a manifest kernel the selector would accept serves GEMM1 posed as `g` (every
// row bucket poses the same problem but for its rows, which no kernel of the family
// limits): what "auto" of the fusion options resolves against.
bool MoeLayer::Gemm1Serves(const MoeGemmArgs& g) const {
  const MoeProblem problem = gemm1_->ProblemOf(g);
  const SelectOptions so = GemmSelectOptions();
  for (const KernelEntry& k : runtime_->registry().kernels()) {
    if (CheckKernel(k, problem, so).empty()) return true;
  }
  return false;
}

bool MoeLayer::ResolveFusion() const {
  const std::string& mode = options_.fuse_intermediate_quantization;
  const bool fp8_pair = options_.weight_format == DataFormat::kFp8 &&
                        options_.activation_format == DataFormat::kFp8;
  if (!fp8_pair || mode == "off") return false;
  if (mode == "on") return true;
  // auto: a GEMM1 writing fp8.
  MoeGemmArgs g = GemmArgs(MoeLayerArgs{}, 1, 0, LayoutForRows(options_, 1, 64));
  g.output_format = DataFormat::kFp8;
  return Gemm1Serves(g);
}

bool MoeLayer::ResolveGatherFusion() const {
  const std::string& mode = options_.fuse_gather;
  const bool bf16_pair = options_.weight_format == DataFormat::kBf16 &&
                         options_.activation_format == DataFormat::kBf16;
  if (!bf16_pair || options_.apply_weight_on_input || mode == "off") return false;
  if (mode == "on") return true;
  // auto: the gather kernel where GEMM1 is wide. The gathering GEMM1 loads A's rows one
  // by one for every N tile; from kGatherKernelFromGemm1N columns on that measured slower
  // than the gather kernel's single pass over the rows (the layer at 4,096 and 16,384
  // tokens, H100 and H200: 3-22% slower fused at 8,192 to 28,672 columns, Mixtral-8x7B's
  // 28,672 6-15%; one exception, 14,336 columns over 128 experts at 4,096 tokens, 9%
  // faster fused), and below it faster or even (gpt-oss-120b's 5,760: 3-11% faster fused;
  // Qwen3-30B-A3B, DeepSeek-V3: within 3% at 4,096 tokens, 2-5% faster at 16,384; docs/
  // benchmarks.md "Gather in GEMM1").
  MoeGemmArgs g = GemmArgs(MoeLayerArgs{}, 1, 0, LayoutForRows(options_, 1, 64));
  if (g.n >= kGatherKernelFromGemm1N) return false;
  // Otherwise fused where a GEMM1 gathering A serves the layer (any nonzero map makes the
  // problem one that gathers).
  g.a_row_map = 256;
  return Gemm1Serves(g);
}

// The glue kernels: for each op and function name, the first manifest kernel that runs on
// this device (Runtime::Function fetches and loads it).
absl::Status MoeLayer::LoadGlue() {
  if (glue_loaded_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&glue_mu_);
  if (glue_loaded_.load(std::memory_order_relaxed)) return absl::OkStatus();
  struct Want {
    Op op;
    const char* function;
    Kernel* slot;
    bool optional = false;  // a manifest published before the kernel existed lacks it
  };
  // Each layout loads only what it launches: a manifest published before the masked
  // kernels still serves the token-major layer.
  const char* quantize = QuantizeFunction(options_.activation_format);
  auto token = [&](const char* f) { return masked_ ? nullptr : f; };
  auto masked = [&](const char* f) { return masked_ ? f : nullptr; };
  const char* decoded = MayDecode(options_) ? "cubist_moe_quantize_nvfp4_decoded" : nullptr;
  const Want wants[] = {
      {Op::kMoeQuantize, quantize, &quantize_},
      // "auto" goes without it (a manifest from before it); "decoded" needs it.
      {Op::kMoeQuantize, decoded, &quantize_decoded_,
       /*optional=*/options_.nvfp4_gemm_inputs == "auto"},
      {Op::kMoeRoute, token("cubist_moe_route"), &route_},
      {Op::kMoeRoute, token("cubist_moe_route_sort"), &route_sort_, /*optional=*/true},
      {Op::kMoeSort, token("cubist_moe_sort_fused"), &sort_fused_},
      {Op::kMoeSort, token("cubist_moe_sort_count"), &sort_count_},
      {Op::kMoeSort, token("cubist_moe_sort_scan"), &sort_scan_},
      {Op::kMoeSort, token("cubist_moe_sort_scatter"), &sort_scatter_},
      {Op::kMoeSort, masked("cubist_moe_sort_masked"), &sort_masked_},
      {Op::kMoeGather, "cubist_moe_gather_bf16", &gather_},
      {Op::kMoeFinalize, token("cubist_moe_finalize"), &finalize_},
      {Op::kMoeFinalize, masked("cubist_moe_finalize_masked"), &finalize_masked_},
  };
  const Registry& reg = runtime_->registry();
  for (const Want& w : wants) {
    if (w.function == nullptr) continue;  // not this layout's, or bf16's quantizer
    std::string tried;
    for (const KernelEntry& k : reg.kernels()) {
      if (!k.op.has_value() || *k.op != w.op || k.spec.function != w.function) continue;
      if (k.spec.abi != moe::kMoeLayerAbi) {
        absl::StrAppend(&tried, " ", k.name(), " (abi ", k.spec.abi, ", this build fills ",
                        moe::kMoeLayerAbi, ")");
        continue;
      }
      absl::StatusOr<CUfunction> f = runtime_->Function(k);
      if (!f.ok()) {
        absl::StrAppend(&tried, " ", k.name(), " (", f.status().message(), ")");
        continue;
      }
      w.slot->entry = &k;
      w.slot->function = *f;
      break;
    }
    if (w.slot->function == nullptr && !(w.optional && tried.empty())) {
      return absl::NotFoundError(absl::StrCat(
          "moe layer: the manifest ", reg.manifest_source(), " has no ", Sv(OpName(w.op)),
          " kernel ", w.function, " for this GPU",
          tried.empty() ? "" : absl::StrCat("; tried:", tried),
          "; publish the layer's kernels (scripts/build-artifacts builds them)"));
    }
  }
  CUBIST_RETURN_IF_ERROR(RaiseSharedLimits());
  glue_loaded_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

// The route kernels keep tokens' logits in dynamic shared memory: past the driver's
// default (48 KiB with the static part) the function's limit must be raised first.
absl::Status MoeLayer::RaiseSharedLimits() {
  const int32_t e = static_cast<int32_t>(options_.num_experts);
  const struct {
    const Kernel& k;
    int bytes;
  } raises[] = {
      {route_, moe::MoeRouteSharedBytes(e) > 48 * 1024 ? moe::MoeRouteSharedBytes(e) : 0},
      {route_sort_, moe::kMoeRouteSortMaxSharedBytes},
  };
  DriverApi& driver = runtime_->driver();
  for (const auto& r : raises) {
    if (r.k.function == nullptr || r.bytes == 0) continue;  // not loaded (layout, manifest)
    CUBIST_RETURN_IF_ERROR(CuCheck(
        driver,
        driver.FuncSetAttribute(r.k.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                r.bytes),
        absl::StrCat("moe layer: raise ", r.k.entry->name(), "'s shared memory to ", r.bytes,
                     " bytes")));
  }
  return absl::OkStatus();
}

// The arguments the masked layout takes differently: its row count, its counts, and none
// of the routing's (the pointer table of ValidateArgs checks the rest).
absl::Status ValidateMaskedArgs(const MoeLayerOptions& o, const MoeLayerArgs& a) {
  const int64_t rows = LocalExperts(o) * o.max_m;
  if (!Masked(o)) {
    if (a.masked_counts != 0) {
      return Bad("masked_counts", "is for expert_major_masked input only; set input_layout");
    }
    return absl::OkStatus();
  }
  if (a.tokens != 0 && a.tokens != rows) {
    return Bad("tokens", absl::StrCat(a.tokens, ": expert_major_masked input holds L x max_m = ",
                                      rows, " rows; set tokens to ", rows, " (0: a no-op)"));
  }
  const struct {
    const char* field;
    bool set;
  } routing[] = {
      {"router_logits", a.router_logits != 0},
      {"routing_bias", a.routing_bias != 0},
      {"topk_ids", a.topk_ids != 0},
      {"topk_weights", a.topk_weights != 0},
      {"accumulate", a.accumulate},
  };
  for (const auto& r : routing) {
    if (r.set) {
      return Bad(r.field, "is given, but expert_major_masked input is routed already and "
                          "combined by the all-to-all; leave it unset");
    }
  }
  return absl::OkStatus();
}

absl::Status MoeLayer::ValidateArgs(const MoeLayerArgs& a, int64_t max_tokens) const {
  if (a.tokens < 0) return Bad("tokens", absl::StrCat(a.tokens, " is negative"));
  CUBIST_RETURN_IF_ERROR(ValidateMaskedArgs(options_, a));
  if (a.tokens == 0) return absl::OkStatus();
  // Each device pointer: whether it must be given, its alignment, and whether it is one of
  // the format pair's scales (refused when given to a pair that takes no such scale, since
  // a caller passing it expects it to be used).
  struct Ptr {
    const char* name;
    CUdeviceptr p;
    bool required;
    unsigned align;
    bool pair_scale = false;
  };
  const bool routed = a.router_logits != 0;
  const bool wblock = moe::FormatScaleBlock(options_.weight_format) != 0;
  const bool wglobal = moe::FormatHasGlobalScale(options_.weight_format);
  const bool aglobal = moe::FormatHasGlobalScale(options_.activation_format);
  const Ptr ptrs[] = {
      {"hidden_states", a.hidden_states, true, 16},
      {"router_logits", a.router_logits, false, logits_bf16_ ? 2u : 4u},
      {"routing_bias", a.routing_bias, false, 4},
      {"topk_ids", a.topk_ids, !routed && !masked_, 4},
      {"topk_weights", a.topk_weights, !routed && !masked_, 4},
      {"masked_counts", a.masked_counts, masked_, 4},
      {"w1", a.w1, true, 16},
      {"w2", a.w2, true, 16},
      {"w1_scale", a.w1_scale, wblock, 16, true},
      {"w2_scale", a.w2_scale, wblock, 16, true},
      {"w1_global_scale", a.w1_global_scale, wglobal, 4, true},
      {"w2_global_scale", a.w2_global_scale, wglobal, 4, true},
      {"input_scale", a.input_scale, aglobal, 4, true},
      {"intermediate_scale", a.intermediate_scale, aglobal, 4, true},
      {"w1_bias", a.w1_bias, false, 4},
      {"w2_bias", a.w2_bias, false, 4},
      {"alpha", a.alpha, false, 4},
      {"beta", a.beta, false, 4},
      {"limit", a.limit, false, 4},
      {"out", a.out, options_.finalize == "sum", 16},
      {"workspace", a.workspace, true, static_cast<unsigned>(kAlign)},
  };
  for (const Ptr& p : ptrs) {
    if (p.p != 0 && p.pair_scale && !p.required) {
      return Bad(p.name, absl::StrCat("is given, but ", Sv(DataFormatName(options_.weight_format)),
                                      " x ", Sv(DataFormatName(options_.activation_format)),
                                      " takes no such scale"));
    }
    if (p.p == 0) {
      if (!p.required) continue;
      const bool routing = p.name == std::string_view("topk_ids") ||
                           p.name == std::string_view("topk_weights");
      return Bad(p.name, routing ? "is null: give router_logits, or pre-routed topk_ids and "
                                   "topk_weights"
                                 : "is null");
    }
    if (p.p % p.align != 0) {
      return Bad(p.name, absl::StrCat("address 0x", absl::Hex(p.p), " is not ", p.align,
                                      "-byte aligned"));
    }
  }
  if (a.routing_bias != 0 && method_ != moe::kRouteDeepSeekV3) {
    return Bad("routing_bias", "only deepseek_v3 routing takes a bias");
  }
  const int64_t tokens = masked_ ? a.tokens : std::max(a.tokens, max_tokens);
  const int64_t chunk = ChunkTokens(options_, tokens);
  const size_t need = masked_ ? MaskedLayout(options_).bytes
                              : LayoutForRows(options_, chunk,
                                              RowBucketFor(chunk, options_.top_k)).bytes;
  if (a.workspace_bytes < need) {
    return Bad("workspace", absl::StrCat(a.workspace_bytes, " bytes, ", need, " needed for ",
                                         tokens, " tokens; size it with WorkspaceSize"));
  }
  if (!masked_ && RowBucketFor(chunk, options_.top_k) > kInt32Max) {
    return Bad("tokens", "too many rows for one pass; set max_chunk_tokens");
  }
  return absl::OkStatus();
}

// One pass of Run over tokens [first, first + tokens): where its routing lies (the
// workspace when the layer routes, the caller's arrays when pre-routed) and the workspace
// layout every pass shares.
struct MoeLayer::Pass {
  int64_t first = 0, tokens = 0;
  int64_t slots = 0;  // tokens x k (the masked layout: L x max_m rows)
  int64_t gather_k = 0;  // the gather's top_k: input row = permuted_to_expanded[r] / it
  MoeLayerWorkspace w;
  CUdeviceptr ws = 0;  // the workspace's base
  CUdeviceptr ids = 0, weights = 0;
  template <typename T>
  T* At(size_t offset) const {
    return reinterpret_cast<T*>(ws + offset);
  }
};

MoeGemmArgs MoeLayer::GemmArgs(const MoeLayerArgs& a, int gemm, CUdeviceptr ws,
                               const MoeLayerWorkspace& w, bool decoded) const {
  const DataFormat af = decoded ? DataFormat::kBf16 : options_.activation_format;
  const bool first = gemm == 1;
  MoeGemmArgs g;
  g.weight_format = options_.weight_format;
  g.activation_format = af;
  g.experts = local_experts_;
  g.tokens = w.row_capacity;
  g.offsets = ws + w.offsets;
  if (!masked_) {
    // The router's rows: each expert's count varies, and the cost model picks tiles for
    // that spread (an expert just past a tile's rows runs a second, nearly empty one)
    // rather than for rows split evenly. The masked layout's counts come from the
    // caller's all-to-all, whose spread nothing here knows.
    g.routed_top_k = options_.top_k;
    g.routed_experts = options_.num_experts;
  }
  g.b = first ? a.w1 : a.w2;
  g.b_scale = first ? a.w1_scale : a.w2_scale;
  g.b_global_scale = first ? a.w1_global_scale : a.w2_global_scale;
  g.bias = first ? a.w1_bias : a.w2_bias;
  g.a = ws + (first ? w.gathered : w.quantized);
  g.out = ws + (first ? w.activated : w.rows);
  if (first && fuse_) {  // GEMM1 writes GEMM2's e4m3 input with its per-tensor scale
    g.out = ws + w.quantized;
    g.output_format = DataFormat::kFp8;
    g.out_scale = a.intermediate_scale;
  }
  if (first) {  // H -> I with the activation and its per-expert parameters
    g.activation = options_.activation;
    g.n = IsGated(options_.activation) ? 2 * options_.intermediate : options_.intermediate;
    g.k = options_.hidden;
    g.alpha = a.alpha;
    g.beta = a.beta;
    g.limit = a.limit;
  } else {  // I -> H, identity
    g.activation = Activation::kIdentity;
    g.n = options_.hidden;
    g.k = options_.intermediate;
  }
  // The activations' dequantization scales: block scales beside the data, fp8's s as the
  // caller gave it, nvfp4's rcp(g) as the quantize kernel wrote it.
  if (moe::FormatScaleBlock(af) != 0) {
    g.a_scale = ws + (first ? w.gathered_scale : w.quantized_scale);
  }
  if (af == DataFormat::kFp8) g.a_global_scale = first ? a.input_scale : a.intermediate_scale;
  if (af == DataFormat::kNvfp4 || decoded) {
    g.a_global_scale = ws + w.global_scales + (first ? 0 : 4);
  }
  if (decoded) g.a = ws + (first ? w.rows : w.quantized);  // bf16 values, not nvfp4 bytes
  // The sort wrote the offsets two launches before GEMM1 (a gather or quantize kernel in
  // between, which waits for the sort before it lets GEMM1 launch) and before GEMM2; the
  // weights are the caller's, complete before the layer's first kernel waited. A GEMM1
  // that gathers itself follows the sort directly: its offsets are not settled.
  g.settled_inputs = !(first && gather_fused_);
  if (first && gather_fused_) {
    // GEMM1 reads hidden_states' rows through the sort's row map (a is the pass's
    // hidden states and a_rows its rows: RunExperts sets both; the layout's row capacity
    // bounds them for CanImplement).
    g.a_row_map = ws + w.permuted_to_expanded;
    g.a_row_divisor = masked_ ? 1 : options_.top_k;
    g.a_rows = std::max<int64_t>(1, w.row_capacity);
  }
  return g;
}

bool MoeLayer::DecodesNvfp4Inputs(int64_t tokens) {
  if (!MayDecode(options_) || !LoadGlue().ok()) return false;
  return Decoded(masked_ ? MaskedLayout(options_) : BatchLayout(options_, tokens));
}

bool MoeLayer::Decoded(const MoeLayerWorkspace& w) {
  if (!MayDecode(options_) || quantize_decoded_.function == nullptr) return false;
  if (options_.nvfp4_gemm_inputs == "decoded") return true;
  {
    absl::ReaderMutexLock lock(&decoded_mu_);
    auto it = decoded_.find(w.row_capacity);
    if (it != decoded_.end()) return it->second;
  }
  const bool faster = DecodedIsFaster(w);
  absl::MutexLock lock(&decoded_mu_);
  decoded_.emplace(w.row_capacity, faster);
  return faster;
}

// Both GEMMs' best estimated time (the cost model, as untuned selection ranks kernels)
// with decoded inputs against packed ones. The decoding quantize kernels write 3.6x the
// bytes; against GEMMs that decode nvfp4 activations in every weight-row tile this
// matters only where the estimates are close, hence the 5% margin.
bool MoeLayer::DecodedIsFaster(const MoeLayerWorkspace& w) const {
  const SelectOptions so = GemmSelectOptions();
  auto best_us = [&](bool decoded) {
    double us = 0;
    for (int gemm : {1, 2}) {
      const MoeGemmArgs g = GemmArgs(MoeLayerArgs{}, gemm, 0, w, decoded);
      absl::StatusOr<Candidate> c =
          SelectKernel(runtime_->registry(), (gemm == 1 ? gemm1_ : gemm2_)->ProblemOf(g), so);
      if (!c.ok()) return -1.0;
      us += c->cost.time_us;
    }
    return us;
  };
  const double decoded = best_us(true), packed = best_us(false);
  return decoded >= 0 && (packed < 0 || decoded < 0.95 * packed);
}

absl::Status MoeLayer::CanImplement(const MoeLayerArgs& args, int64_t max_tokens) {
  CUBIST_RETURN_IF_ERROR(ValidateArgs(args, max_tokens));
  CUBIST_RETURN_IF_ERROR(LoadGlue());
  // Every GEMM problem a batch of up to max_tokens tokens poses: one per row bucket (the
  // masked layout: its one pass of L x max_m rows).
  std::vector<MoeLayerWorkspace> layouts;
  if (masked_) {
    layouts.push_back(MaskedLayout(options_));
  } else {
    const int64_t chunk = ChunkTokens(options_, std::max<int64_t>(max_tokens, 1));
    const int64_t top = RowBucketFor(chunk, options_.top_k);
    for (int64_t rows = 1; rows <= top; rows *= 2) {
      layouts.push_back(LayoutForRows(options_, chunk, rows));
    }
  }
  // Aligned stand-ins for what may be null before the first batch: only shapes, formats
  // and which optional operands exist (a bias) are checked.
  const CUdeviceptr placeholder = 256;
  for (const MoeLayerWorkspace& w : layouts) {
    const bool decoded = Decoded(w);
    for (int gemm : {1, 2}) {
      MoeGemmArgs g = GemmArgs(args, gemm, placeholder, w, decoded);
      if (g.b == 0) g.b = placeholder;
      if (g.a_global_scale == 0 && moe::FormatHasGlobalScale(options_.activation_format)) {
        g.a_global_scale = placeholder;
      }
      if (g.out_scale == 0 && g.output_format == DataFormat::kFp8) g.out_scale = placeholder;
      CUBIST_RETURN_IF_ERROR((gemm == 1 ? gemm1_ : gemm2_)->CanImplement(g));
    }
  }
  return absl::OkStatus();
}

absl::Status MoeLayer::Launch(const Kernel& k, unsigned grid, unsigned block, unsigned shared,
                              void* params, CUstream stream) {
  CUlaunchConfig config = {};
  config.gridDimX = std::max(grid, 1u);
  config.gridDimY = 1;
  config.gridDimZ = 1;
  config.blockDimX = block;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = shared;
  config.hStream = stream;
  CUlaunchAttribute attr;
  if (options_.programmatic_dependent_launch) {
    attr.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attr;
    config.numAttrs = 1;
  }
  void* arg = params;
  DriverApi& driver = runtime_->driver();
  const CUresult r = driver.LaunchKernelEx(&config, k.function, &arg, nullptr);
  if (r != CUDA_SUCCESS) return CuCheck(driver, r, absl::StrCat("launch ", k.entry->name()));
  return absl::OkStatus();
}

unsigned MoeLayer::RowCtas(int64_t rows) const {
  return static_cast<unsigned>(
      std::min<int64_t>(rows, int64_t{8} * runtime_->device_info().sm_count));
}

unsigned MoeLayer::QuantizeCtas(int64_t slots, moe::MoeQuantizeParams* q) const {
  q->col_parts = moe::MoeQuantizeParts(slots, q->cols, runtime_->device_info().sm_count);
  return RowCtas(slots * q->col_parts);
}

moe::MoeRouteParams MoeLayer::RouteParams(const MoeLayerArgs& a, const Pass& pass) const {
  moe::MoeRouteParams p{};
  p.abi = moe::kMoeLayerAbi;
  p.method = method_;
  p.num_tokens = static_cast<int32_t>(pass.tokens);
  p.num_experts = static_cast<int32_t>(options_.num_experts);
  p.top_k = static_cast<int32_t>(options_.top_k);
  p.logits_bf16 = logits_bf16_ ? 1 : 0;
  p.n_group = static_cast<int32_t>(options_.n_group);
  p.topk_group = static_cast<int32_t>(options_.topk_group);
  p.routed_scaling_factor = options_.routed_scaling_factor;
  p.logits = reinterpret_cast<const void*>(
      a.router_logits + (logits_bf16_ ? 2 : 4) * pass.first * options_.num_experts);
  p.bias = reinterpret_cast<const float*>(a.routing_bias);
  p.topk_ids = reinterpret_cast<int32_t*>(pass.ids);
  p.topk_weights = reinterpret_cast<float*>(pass.weights);
  return p;
}

moe::MoeSortParams MoeLayer::SortParams(const Pass& pass) const {
  const MoeLayerWorkspace& w = pass.w;
  moe::MoeSortParams s{};
  s.abi = moe::kMoeLayerAbi;
  s.num_slots = static_cast<int32_t>(pass.slots);
  s.top_k = static_cast<int32_t>(options_.top_k);
  s.num_experts = static_cast<int32_t>(options_.num_experts);
  s.local_expert_offset = static_cast<int32_t>(options_.local_expert_offset);
  s.num_local_experts = static_cast<int32_t>(local_experts_);
  s.topk_ids = reinterpret_cast<const int32_t*>(pass.ids);
  s.offsets = pass.At<int32_t>(w.offsets);
  s.expanded_to_permuted = pass.At<int32_t>(w.expanded_to_permuted);
  s.permuted_to_expanded = pass.At<int32_t>(w.permuted_to_expanded);
  s.chunk_counts = pass.At<int32_t>(w.chunk_counts);
  s.dropped = pass.At<int32_t>(w.dropped);
  return s;
}

absl::Status MoeLayer::RouteAndSort(const MoeLayerArgs& a, const Pass& pass, CUstream stream) {
  moe::MoeSortParams sort = SortParams(pass);
  if (a.router_logits == 0) return Sort(sort, pass.slots, stream);  // pre-routed
  moe::MoeRouteParams route = RouteParams(a, pass);
  if (route_sort_.function != nullptr &&
      moe::MoeRouteSortServes(pass.tokens, route.top_k, route.num_experts)) {
    moe::MoeRouteSortParams both{route, sort};
    return Launch(route_sort_, 1, moe::kMoeSortThreads,
                  moe::MoeRouteSortSharedBytes(pass.tokens, route.num_experts), &both, stream);
  }
  const int64_t per_cta = moe::kMoeRouteThreads / 32;  // a warp per token
  CUBIST_RETURN_IF_ERROR(Launch(route_,
                                static_cast<unsigned>((pass.tokens + per_cta - 1) / per_cta),
                                moe::kMoeRouteThreads,
                                moe::MoeRouteSharedBytes(route.num_experts), &route, stream));
  return Sort(sort, pass.slots, stream);
}

absl::Status MoeLayer::Sort(moe::MoeSortParams s, int64_t slots, CUstream stream) {
  if (slots <= moe::kMoeSortChunk) {
    return Launch(sort_fused_, 1, moe::kMoeSortThreads, 0, &s, stream);
  }
  const unsigned chunks = static_cast<unsigned>(moe::MoeSortChunks(slots));
  CUBIST_RETURN_IF_ERROR(Launch(sort_count_, chunks, moe::kMoeSortThreads, 0, &s, stream));
  CUBIST_RETURN_IF_ERROR(Launch(sort_scan_, 1, moe::kMoeSortThreads, 0, &s, stream));
  return Launch(sort_scatter_, chunks, moe::kMoeSortThreads, 0, &s, stream);
}

// GEMM1's input: the token rows in expert order, read by index from hidden_states (and
// scaled by the routing weight when it applies on input). Quantized formats quantize on
// the way; bf16 is a plain gather.
absl::Status MoeLayer::GatherInput(const MoeLayerArgs& a, const Pass& pass, bool decoded,
                                   CUstream stream) {
  const MoeLayerWorkspace& w = pass.w;
  const int64_t h = options_.hidden;
  const void* input = reinterpret_cast<const void*>(a.hidden_states + 2 * pass.first * h);
  const float* weights =
      options_.apply_weight_on_input ? reinterpret_cast<const float*>(pass.weights) : nullptr;
  if (Quantized(options_.activation_format)) {
    moe::MoeQuantizeParams q{};
    q.abi = moe::kMoeLayerAbi;
    q.num_local_experts = static_cast<int32_t>(local_experts_);
    q.offsets = pass.At<int32_t>(w.offsets);
    q.cols = static_cast<int32_t>(h);
    q.top_k = static_cast<int32_t>(pass.gather_k);
    q.input = input;
    q.permuted_to_expanded = pass.At<int32_t>(w.permuted_to_expanded);
    q.weights = weights;
    q.scale = reinterpret_cast<const float*>(a.input_scale);
    q.out = pass.At<void>(decoded ? w.rows : w.gathered);
    q.out_scale = decoded ? nullptr : pass.At<void>(w.gathered_scale);
    q.global_out = options_.activation_format == DataFormat::kNvfp4
                       ? pass.At<float>(w.global_scales)
                       : nullptr;
    const unsigned ctas = QuantizeCtas(pass.slots, &q);
    return Launch(decoded ? quantize_decoded_ : quantize_, ctas, moe::kMoeQuantizeThreads, 0,
                  &q, stream);
  }
  moe::MoeGatherParams g{};
  g.abi = moe::kMoeLayerAbi;
  g.hidden = static_cast<int32_t>(h);
  g.top_k = static_cast<int32_t>(pass.gather_k);
  g.num_local_experts = static_cast<int32_t>(local_experts_);
  g.input = input;
  g.offsets = pass.At<int32_t>(w.offsets);
  g.permuted_to_expanded = pass.At<int32_t>(w.permuted_to_expanded);
  g.weights = weights;
  g.out = pass.At<void>(w.gathered);
  return Launch(gather_, RowCtas(pass.slots), moe::kMoeGatherThreads, 0, &g, stream);
}

// GEMM2's input: GEMM1's bf16 output quantized (quantized formats only; bf16 GEMM2 reads
// `activated` as it is).
absl::Status MoeLayer::QuantizeIntermediate(const MoeLayerArgs& a, const Pass& pass,
                                            bool decoded, CUstream stream) {
  const MoeLayerWorkspace& w = pass.w;
  moe::MoeQuantizeParams q{};
  q.abi = moe::kMoeLayerAbi;
  q.num_local_experts = static_cast<int32_t>(local_experts_);
  q.offsets = pass.At<int32_t>(w.offsets);
  q.cols = static_cast<int32_t>(options_.intermediate);
  q.top_k = 0;  // rows in place: no gather
  q.input = pass.At<const void>(w.activated);
  q.scale = reinterpret_cast<const float*>(a.intermediate_scale);
  q.out = pass.At<void>(w.quantized);
  q.out_scale = decoded ? nullptr : pass.At<void>(w.quantized_scale);
  q.global_out = options_.activation_format == DataFormat::kNvfp4
                     ? pass.At<float>(w.global_scales + 4)
                     : nullptr;
  const unsigned ctas = QuantizeCtas(pass.slots, &q);
  return Launch(decoded ? quantize_decoded_ : quantize_, ctas, moe::kMoeQuantizeThreads, 0, &q,
                stream);
}

absl::Status MoeLayer::Finalize(const MoeLayerArgs& a, const Pass& pass, CUstream stream) {
  moe::MoeFinalizeParams f{};
  f.abi = moe::kMoeLayerAbi;
  f.num_tokens = static_cast<int32_t>(pass.tokens);
  f.hidden = static_cast<int32_t>(options_.hidden);
  f.top_k = static_cast<int32_t>(options_.top_k);
  f.accumulate = a.accumulate ? 1 : 0;
  f.unit_weights = options_.apply_weight_on_input ? 1 : 0;
  f.rows = pass.At<const void>(pass.w.rows);
  f.topk_ids = reinterpret_cast<const int32_t*>(pass.ids);
  f.topk_weights = reinterpret_cast<const float*>(pass.weights);
  f.expanded_to_permuted = pass.At<const int32_t>(pass.w.expanded_to_permuted);
  f.out = reinterpret_cast<void*>(a.out + 2 * pass.first * options_.hidden);
  const int64_t ctas = moe::MoeFinalizeCtas(pass.tokens, f.hidden,
                                            runtime_->device_info().sm_count);
  return Launch(finalize_, static_cast<unsigned>(ctas), moe::kMoeFinalizeThreads, 0, &f, stream);
}

// The steps both layouts share once rows are in expert order (offsets and the row map in
// the workspace): the gather (quantizing for quantized pairs; none where GEMM1 gathers
// itself: gather_fused_), GEMM1 with the activation,
// the intermediate's quantization (unless GEMM1's epilogue did it: fuse_), GEMM2.
absl::Status MoeLayer::RunExperts(const MoeLayerArgs& a, const Pass& pass, CUstream stream) {
  const bool decoded = Decoded(pass.w);
  MoeGemmArgs g1 = GemmArgs(a, 1, pass.ws, pass.w, decoded);
  if (gather_fused_) {
    // No gather kernel: GEMM1 reads the pass's hidden states through the row map.
    g1.a = a.hidden_states + 2 * pass.first * options_.hidden;
    g1.a_rows = masked_ ? pass.w.row_capacity : pass.tokens;
  } else {
    CUBIST_RETURN_IF_ERROR(GatherInput(a, pass, decoded, stream));
  }
  // The row bucket picks the kernels; the pass's slots size their grids. (One token of
  // Qwen3's mxfp4 layer: 96 tiles on a 264-CTA grid ran GEMM1 in 21 us, on 96 CTAs in 16.)
  g1.routed_rows = pass.slots;
  CUBIST_RETURN_IF_ERROR(gemm1_->Run(g1, stream));
  const bool quantize = Quantized(options_.activation_format) && !fuse_;
  if (quantize) CUBIST_RETURN_IF_ERROR(QuantizeIntermediate(a, pass, decoded, stream));
  MoeGemmArgs g2 = GemmArgs(a, 2, pass.ws, pass.w, decoded);
  g2.routed_rows = pass.slots;
  if (options_.programmatic_dependent_launch && !quantize) {
    // Launched early, GEMM2's CTAs take the SMs GEMM1 frees first - and when GEMM1 has
    // more tiles than CTAs, some CTAs finish a tile sooner and free their SMs long before
    // the rest. A GEMM2 of fewer CTAs than SMs then runs crowded onto those (Mixtral's
    // one-token layer: GEMM2 153 us instead of 94 on an H100), so it waits for GEMM1 in
    // stream order, where its CTAs spread over every SM. (A quantize kernel in between
    // releases GEMM2 only once GEMM1 has ended: no such crowding.)
    CUBIST_ASSIGN_OR_RETURN(const MoeGemm::Grid grid1, gemm1_->GridOf(g1));
    CUBIST_ASSIGN_OR_RETURN(const MoeGemm::Grid grid2, gemm2_->GridOf(g2));
    g2.stream_order = grid1.tiles > grid1.ctas &&
                      std::min(grid2.ctas, grid2.tiles) < runtime_->device_info().sm_count;
  }
  return gemm2_->Run(g2, stream);
}

absl::Status MoeLayer::RunChunk(const MoeLayerArgs& a, int64_t first, int64_t tokens,
                                CUstream stream) {
  const int64_t k = options_.top_k;
  Pass pass;
  pass.first = first;
  pass.tokens = tokens;
  pass.slots = tokens * k;
  pass.gather_k = k;
  // Every pass uses the layout of the largest one, so passes share one workspace.
  pass.w = BatchLayout(options_, a.tokens);
  pass.ws = a.workspace;
  const bool routed = a.router_logits != 0;
  pass.ids = routed ? pass.ws + pass.w.topk_ids : a.topk_ids + 4 * first * k;
  pass.weights = routed ? pass.ws + pass.w.topk_weights : a.topk_weights + 4 * first * k;

  CUBIST_RETURN_IF_ERROR(RouteAndSort(a, pass, stream));
  CUBIST_RETURN_IF_ERROR(RunExperts(a, pass, stream));
  if (options_.finalize == "none") return absl::OkStatus();
  return Finalize(a, pass, stream);
}

// The masked layout's compaction (sort_masked_) and scatter back (finalize_masked_):
// one parameter struct, the grid of each as kernels/moe_layer_abi.h states it.
absl::Status MoeLayer::MaskedStep(const Kernel& k, const MoeLayerArgs& a, const Pass& pass,
                                  CUstream stream) {
  moe::MoeMaskedParams m{};
  m.abi = moe::kMoeLayerAbi;
  m.num_local_experts = static_cast<int32_t>(local_experts_);
  m.max_m = static_cast<int32_t>(options_.max_m);
  m.hidden = static_cast<int32_t>(options_.hidden);
  m.counts = reinterpret_cast<const int32_t*>(a.masked_counts);
  m.offsets = pass.At<int32_t>(pass.w.offsets);
  m.row_map = pass.At<int32_t>(pass.w.permuted_to_expanded);
  m.rows = pass.At<const void>(pass.w.rows);
  m.out = reinterpret_cast<void*>(a.out);
  const bool sort = &k == &sort_masked_;
  return Launch(k, RowCtas(sort ? local_experts_ : pass.slots), moe::kMoeMaskedThreads, 0, &m,
                stream);
}

// Compaction of the valid rows (offsets and the row map from the counts, then the usual
// gather or quantizing gather with top_k 1 reading hidden_states' row map[r]), the two
// GEMMs as in a token-major pass, and GEMM2's rows written back to out[e, i].
absl::Status MoeLayer::RunMasked(const MoeLayerArgs& a, CUstream stream) {
  Pass pass;
  pass.w = MaskedLayout(options_);
  pass.tokens = pass.w.row_capacity;
  pass.slots = pass.w.row_capacity;
  pass.gather_k = 1;
  pass.ws = a.workspace;
  CUBIST_RETURN_IF_ERROR(MaskedStep(sort_masked_, a, pass, stream));
  CUBIST_RETURN_IF_ERROR(RunExperts(a, pass, stream));
  return MaskedStep(finalize_masked_, a, pass, stream);
}

absl::Status MoeLayer::Run(const MoeLayerArgs& args, CUstream stream) {
  if (args.tokens == 0) return absl::OkStatus();
  CUBIST_RETURN_IF_ERROR(ValidateArgs(args, 0));
  CUBIST_RETURN_IF_ERROR(LoadGlue());
  if (masked_) return RunMasked(args, stream);
  if (options_.finalize == "none" && ChunkTokens(options_, args.tokens) < args.tokens) {
    return Bad("finalize", "'none' leaves one pass's rows in the workspace; a batch larger "
                           "than max_chunk_tokens needs finalize 'sum'");
  }
  const int64_t chunk = ChunkTokens(options_, args.tokens);
  for (int64_t first = 0; first < args.tokens; first += chunk) {
    CUBIST_RETURN_IF_ERROR(RunChunk(args, first, std::min(chunk, args.tokens - first), stream));
  }
  return absl::OkStatus();
}

}  // namespace cubist
