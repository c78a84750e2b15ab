// cubist run --op moe: runs the routed MoE layer (dispatch/moe_layer.h) on random hidden
// states, router logits and weights, checks a sample of tokens against the CPU reference
// (dispatch/moe_layer_reference.h: routing in fp32, the GEMMs in double) and prints the
// median time next to the floor: one read of the weights of the experts the batch
// touches, at the device's copy bandwidth. --input-layout expert_major_masked runs the
// masked layout instead: [E, max_m, H] rows, per-expert counts drawn from the seed, a
// sample of valid rows checked and the row after each partial expert checked untouched.
#include "cli/run_moe_layer.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "dispatch/moe_layer.h"
#include "dispatch/moe_layer_reference.h"
#include "dispatch/reference.h"
#include "loader/device_memory.h"

namespace cubist::cli {
namespace {

namespace ref = ::cubist::reference;

// Uniform values of standard deviation `scale` (a real model's weights run to billions of
// elements: one 64-bit draw gives four, at a few ns each, where a normal draw per element
// took minutes at gpt-oss-120b's size).
std::vector<uint16_t> RandomBf16(size_t n, double scale, std::mt19937_64& rng) {
  std::vector<uint16_t> v(n);
  const float step = static_cast<float>(scale * std::sqrt(12.0) / 65536.0);
  for (size_t i = 0; i < n; i += 4) {
    uint64_t bits = rng();
    for (size_t j = i; j < std::min(n, i + 4); ++j, bits >>= 16) {
      v[j] = ref::FloatToBf16((static_cast<float>(bits & 0xFFFF) - 32767.5f) * step);
    }
  }
  return v;
}

template <typename T>
absl::StatusOr<DeviceBuffer> Upload(DriverApi& d, const std::vector<T>& v) {
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer b,
                          DeviceBuffer::Allocate(d, std::max<size_t>(v.size(), 1) * sizeof(T)));
  if (!v.empty()) CUBIST_RETURN_IF_ERROR(b.CopyFromHost(v.data(), v.size() * sizeof(T)));
  return b;
}

struct LayerRun {
  std::string check_summary;
  bool ok = false;
  int checked_tokens = 0;
  double time_us = 0;
  double floor_us = 0;
  int experts_touched = 0;
};

// GEMM1's rows per expert: both halves of a gated activation.
int Gemm1Rows(const MoeLayerOptions& o) {
  const int inter = static_cast<int>(o.intermediate);
  return IsGated(o.activation) ? 2 * inter : inter;
}

// The layer's inputs, drawn from --seed: the reference's data (with the weights quantized
// as the kernels take them) and the router's logits and bias.
struct LayerInputs {
  ref::MoeLayerData data;
  std::vector<float> logits;  // [T, E]
  std::vector<float> bias;    // [E], deepseek_v3 routing only
};

LayerInputs RandomLayerInputs(const MoeLayerRunFlags& f, const MoeLayerOptions& o) {
  const int t = static_cast<int>(f.tokens), e = static_cast<int>(o.num_experts);
  const int h = static_cast<int>(o.hidden), inter = static_cast<int>(o.intermediate);
  std::mt19937_64 rng(f.seed);
  LayerInputs in;
  ref::MoeLayerData& data = in.data;
  data.tokens = t;
  data.hidden = h;
  data.intermediate = inter;
  data.num_experts = e;
  data.num_local_experts = e;
  data.activation = o.activation;
  data.apply_weight_on_input = o.apply_weight_on_input;
  data.x = RandomBf16(static_cast<size_t>(t) * h, 1.0, rng);
  data.w1 = RandomBf16(static_cast<size_t>(e) * Gemm1Rows(o) * h, 1.0 / std::sqrt(h), rng);
  data.w2 = RandomBf16(static_cast<size_t>(e) * h * inter, 1.0 / std::sqrt(inter), rng);
  data.weight_format = o.weight_format;
  data.activation_format = o.activation_format;
  ref::QuantizeLayerWeights(&data);
  // Activation scales as an engine calibrates them: inputs are N(0, 1), GEMM1's output O(1).
  data.input_scale = ref::ActivationScaleFor(o.activation_format, 5.0f);
  data.intermediate_scale = ref::ActivationScaleFor(o.activation_format, 4.0f);
  in.logits.resize(static_cast<size_t>(t) * e);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (float& x : in.logits) x = nd(rng);
  if (o.routing_method == "deepseek_v3") {
    for (int i = 0; i < e; ++i) in.bias.push_back(0.1f * nd(rng));
  }
  return in;
}

// The inputs on the device, with the output and the workspace.
struct LayerBuffers {
  DeviceBuffer x, w1, w2, w1_scale, w2_scale, w1_global, w2_global;
  DeviceBuffer input_scale, intermediate_scale, logits, bias, out, workspace;
};

absl::StatusOr<LayerBuffers> UploadLayer(DriverApi& d, const LayerInputs& in,
                                         const MoeLayerOptions& o, size_t workspace_bytes) {
  const ref::MoeLayerData& data = in.data;
  const bool quantized_weights = o.weight_format != DataFormat::kBf16;
  LayerBuffers b;
  CUBIST_ASSIGN_OR_RETURN(b.x, Upload(d, data.x));
  CUBIST_ASSIGN_OR_RETURN(b.w1, quantized_weights ? Upload(d, data.w1q) : Upload(d, data.w1));
  CUBIST_ASSIGN_OR_RETURN(b.w2, quantized_weights ? Upload(d, data.w2q) : Upload(d, data.w2));
  CUBIST_ASSIGN_OR_RETURN(b.w1_scale, Upload(d, data.w1_scale));
  CUBIST_ASSIGN_OR_RETURN(b.w2_scale, Upload(d, data.w2_scale));
  CUBIST_ASSIGN_OR_RETURN(b.w1_global, Upload(d, data.w1_global));
  CUBIST_ASSIGN_OR_RETURN(b.w2_global, Upload(d, data.w2_global));
  CUBIST_ASSIGN_OR_RETURN(b.input_scale, Upload(d, std::vector<float>{data.input_scale}));
  CUBIST_ASSIGN_OR_RETURN(b.intermediate_scale,
                          Upload(d, std::vector<float>{data.intermediate_scale}));
  CUBIST_ASSIGN_OR_RETURN(b.logits, Upload(d, in.logits));
  CUBIST_ASSIGN_OR_RETURN(b.bias, Upload(d, in.bias));
  CUBIST_ASSIGN_OR_RETURN(b.out, DeviceBuffer::Allocate(d, size_t(data.tokens) * data.hidden * 2));
  CUBIST_ASSIGN_OR_RETURN(b.workspace, DeviceBuffer::Allocate(d, workspace_bytes));
  return b;
}

// The layer's arguments: only the scales the formats have.
MoeLayerArgs LayerArgs(const LayerBuffers& b, const LayerInputs& in, const MoeLayerOptions& o) {
  MoeLayerArgs a;
  a.tokens = in.data.tokens;
  a.hidden_states = b.x.get();
  a.router_logits = b.logits.get();
  if (!in.bias.empty()) a.routing_bias = b.bias.get();
  a.w1 = b.w1.get();
  a.w2 = b.w2.get();
  if (!in.data.w1_scale.empty()) {
    a.w1_scale = b.w1_scale.get();
    a.w2_scale = b.w2_scale.get();
  }
  if (!in.data.w1_global.empty()) {
    a.w1_global_scale = b.w1_global.get();
    a.w2_global_scale = b.w2_global.get();
  }
  if (moe::FormatHasGlobalScale(o.activation_format)) {
    a.input_scale = b.input_scale.get();
    a.intermediate_scale = b.intermediate_scale.get();
  }
  a.out = b.out.get();
  a.workspace = b.workspace.get();
  a.workspace_bytes = b.workspace.size();
  return a;
}

// The reference's routing of every token (cheap next to the GEMMs).
absl::StatusOr<ref::Routing> RouteOnHost(const MoeLayerOptions& o, const LayerInputs& in) {
  ref::RoutingConfig rc;
  CUBIST_ASSIGN_OR_RETURN(rc.method, ParseRoutingMethod(o.routing_method));
  rc.num_experts = static_cast<int>(o.num_experts);
  rc.top_k = static_cast<int>(o.top_k);
  rc.n_group = static_cast<int>(o.n_group);
  rc.topk_group = static_cast<int>(o.topk_group);
  rc.routed_scaling_factor = o.routed_scaling_factor;
  return ref::Route(rc, in.logits, in.bias, in.data.tokens);
}

// Compares --check-tokens tokens, spread over the batch, of the layer's output with the
// reference's GEMMs over the same tokens and routing.
absl::StatusOr<ref::Comparison> CheckSample(const MoeLayerRunFlags& f, const MoeLayerOptions& o,
                                            const LayerInputs& in, const ref::Routing& routing,
                                            const DeviceBuffer& out, int* checked_tokens) {
  const ref::MoeLayerData& data = in.data;
  const int t = data.tokens, h = data.hidden, k = static_cast<int>(o.top_k);
  std::vector<int> sample;
  const int want = std::min(t, std::max(1, f.check_tokens));
  for (int i = 0; i < want; ++i) sample.push_back(static_cast<int>(int64_t{i} * t / want));
  ref::MoeLayerData sub = data;
  ref::Routing sub_routing;
  sub.tokens = static_cast<int>(sample.size());
  sub.x.clear();
  sub_routing.tokens = sub.tokens;
  sub_routing.top_k = k;
  std::vector<uint16_t> got;
  for (int tok : sample) {
    sub.x.insert(sub.x.end(), data.x.begin() + size_t(tok) * h, data.x.begin() + size_t(tok + 1) * h);
    sub_routing.ids.insert(sub_routing.ids.end(), routing.ids.begin() + size_t(tok) * k,
                           routing.ids.begin() + size_t(tok + 1) * k);
    sub_routing.weights.insert(sub_routing.weights.end(), routing.weights.begin() + size_t(tok) * k,
                               routing.weights.begin() + size_t(tok + 1) * k);
    std::vector<uint16_t> row(h);
    CUBIST_RETURN_IF_ERROR(out.CopyToHost(row.data(), size_t(h) * 2, size_t(tok) * h * 2));
    got.insert(got.end(), row.begin(), row.end());
  }
  *checked_tokens = static_cast<int>(sample.size());
  return ref::CompareBf16(got, ref::MoeLayerReference(sub, sub_routing),
                          ref::MoeLayerTolerance(o.activation_format));
}

// The median of CUDA events around each Run, after the warm-up runs.
absl::StatusOr<double> MedianRunUs(DriverApi& d, MoeLayer& layer, const MoeLayerArgs& a,
                                   const Stream& stream, int warmup, int iterations) {
  std::vector<float> ms;
  CUBIST_ASSIGN_OR_RETURN(Event start, Event::Create(d));
  CUBIST_ASSIGN_OR_RETURN(Event stop, Event::Create(d));
  for (int i = 0; i < warmup + iterations; ++i) {
    CUBIST_RETURN_IF_ERROR(start.Record(stream.get()));
    CUBIST_RETURN_IF_ERROR(layer.Run(a, stream.get()));
    CUBIST_RETURN_IF_ERROR(stop.Record(stream.get()));
    CUBIST_RETURN_IF_ERROR(stop.Synchronize());
    CUBIST_ASSIGN_OR_RETURN(float one, Event::ElapsedMs(start, stop));
    if (i >= warmup) ms.push_back(one);
  }
  std::sort(ms.begin(), ms.end());
  return ms.empty() ? 0 : 1000.0 * ms[ms.size() / 2];
}

// One read of the touched experts' weight bytes (elements, block and global scales) at
// the device's copy bandwidth.
double WeightFloorUs(const MoeLayerOptions& o, int experts_touched, double copy_tbps) {
  const int h = static_cast<int>(o.hidden), inter = static_cast<int>(o.intermediate);
  const moe::MoeGemmBytes b1 =
      moe::MoeGemmBytesFor(o.weight_format, o.activation_format, o.activation,
                           experts_touched, 0, Gemm1Rows(o), h);
  const moe::MoeGemmBytes b2 = moe::MoeGemmBytesFor(
      o.weight_format, o.activation_format, moe::kIdentity, experts_touched, 0, h, inter);
  const double weight_bytes = static_cast<double>(b1.b + b1.b_scale + b1.b_global_scale +
                                                  b2.b + b2.b_scale + b2.b_global_scale);
  return weight_bytes / (copy_tbps * 1e12) * 1e6;
}

absl::StatusOr<LayerRun> RunLayer(const MoeLayerRunFlags& f, Runtime& rt,
                                  const MoeLayerOptions& o) {
  DriverApi& d = rt.driver();
  const int t = static_cast<int>(f.tokens);
  const LayerInputs in = RandomLayerInputs(f, o);
  CUBIST_ASSIGN_OR_RETURN(std::unique_ptr<MoeLayer> layer, MoeLayer::Create(rt, o));
  CUBIST_ASSIGN_OR_RETURN(size_t ws_bytes, MoeLayer::WorkspaceSize(o, t));
  CUBIST_ASSIGN_OR_RETURN(const LayerBuffers buffers, UploadLayer(d, in, o, ws_bytes));
  CUBIST_ASSIGN_OR_RETURN(Stream stream, Stream::Create(d));
  const MoeLayerArgs a = LayerArgs(buffers, in, o);
  CUBIST_RETURN_IF_ERROR(layer->CanImplement(a, t));
  CUBIST_RETURN_IF_ERROR(layer->Run(a, stream.get()));
  CUBIST_RETURN_IF_ERROR(stream.Synchronize());

  CUBIST_ASSIGN_OR_RETURN(const ref::Routing routing, RouteOnHost(o, in));
  LayerRun r;
  CUBIST_ASSIGN_OR_RETURN(const ref::Comparison cmp,
                          CheckSample(f, o, in, routing, buffers.out, &r.checked_tokens));
  r.ok = cmp.ok;
  r.check_summary = cmp.summary;
  CUBIST_ASSIGN_OR_RETURN(r.time_us,
                          MedianRunUs(d, *layer, a, stream, f.warmup, f.iterations));
  const std::set<int32_t> touched(routing.ids.begin(), routing.ids.end());
  r.experts_touched = static_cast<int>(touched.size());
  r.floor_us = WeightFloorUs(o, r.experts_touched, f.copy_tbps);
  return r;
}

// The masked layout's counts: expert 0 full, expert 1 empty (when E > 1), the others
// uniform in 0..max_m.
std::vector<int32_t> MaskedCounts(uint64_t seed, int experts, int max_m) {
  std::mt19937_64 rng(seed ^ 0x6D61736B);
  std::uniform_int_distribution<int32_t> ud(0, max_m);
  std::vector<int32_t> counts(experts);
  for (int e = 0; e < experts; ++e) counts[e] = e == 0 ? max_m : e == 1 ? 0 : ud(rng);
  return counts;
}

// --check-tokens valid rows (e, i), spread over them, against the reference as one-slot
// tokens of weight 1 (the masked layer's row is that token's output); and the row after
// each partial expert's last must still hold the 0xFF bytes out was filled with.
absl::StatusOr<ref::Comparison> CheckMaskedSample(const MoeLayerRunFlags& f,
                                                  const LayerInputs& in,
                                                  const std::vector<int32_t>& counts,
                                                  const DeviceBuffer& out, int* checked) {
  const ref::MoeLayerData& data = in.data;
  const int h = data.hidden, max_m = static_cast<int>(f.max_m);
  std::vector<int> valid;  // row e x max_m + i of each valid row
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int i = 0; i < counts[e]; ++i) valid.push_back(static_cast<int>(e) * max_m + i);
  }
  const int n = std::min<int>(valid.size(), std::max(1, f.check_tokens));
  ref::MoeLayerData sub = data;
  ref::Routing routing;
  sub.tokens = routing.tokens = n;
  routing.top_k = 1;
  sub.x.clear();
  std::vector<uint16_t> got, row(h);
  for (int j = 0; j < n; ++j) {
    const int r = valid[size_t(j) * valid.size() / n];
    sub.x.insert(sub.x.end(), data.x.begin() + size_t(r) * h, data.x.begin() + size_t(r + 1) * h);
    routing.ids.push_back(r / max_m);
    routing.weights.push_back(1.0f);
    CUBIST_RETURN_IF_ERROR(out.CopyToHost(row.data(), size_t(h) * 2, size_t(r) * h * 2));
    got.insert(got.end(), row.begin(), row.end());
  }
  *checked = n;
  ref::Comparison cmp = ref::CompareBf16(got, ref::MoeLayerReference(sub, routing),
                                         ref::MoeLayerTolerance(data.activation_format));
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] >= max_m) continue;
    CUBIST_RETURN_IF_ERROR(out.CopyToHost(row.data(), size_t(h) * 2,
                                          (e * max_m + counts[e]) * size_t(h) * 2));
    if (std::any_of(row.begin(), row.end(), [](uint16_t v) { return v != 0xFFFF; })) {
      cmp.ok = false;
      cmp.summary += absl::StrCat("; expert ", e, "'s row ", counts[e], " (past its count) "
                                  "was written");
      break;
    }
  }
  return cmp;
}

absl::StatusOr<LayerRun> RunMaskedLayer(const MoeLayerRunFlags& f, Runtime& rt,
                                        const MoeLayerOptions& o) {
  DriverApi& d = rt.driver();
  MoeLayerRunFlags rows = f;
  rows.tokens = static_cast<int>(o.num_experts * o.max_m);
  const LayerInputs in = RandomLayerInputs(rows, o);
  const std::vector<int32_t> counts =
      MaskedCounts(f.seed, static_cast<int>(o.num_experts), static_cast<int>(o.max_m));
  CUBIST_ASSIGN_OR_RETURN(std::unique_ptr<MoeLayer> layer, MoeLayer::Create(rt, o));
  CUBIST_ASSIGN_OR_RETURN(size_t ws_bytes, MoeLayer::WorkspaceSize(o, 0));
  CUBIST_ASSIGN_OR_RETURN(LayerBuffers buffers, UploadLayer(d, in, o, ws_bytes));
  CUBIST_ASSIGN_OR_RETURN(const DeviceBuffer counts_d, Upload(d, counts));
  CUBIST_RETURN_IF_ERROR(buffers.out.Fill(0xFF));
  CUBIST_ASSIGN_OR_RETURN(Stream stream, Stream::Create(d));
  MoeLayerArgs a = LayerArgs(buffers, in, o);
  a.router_logits = a.routing_bias = 0;
  a.masked_counts = counts_d.get();
  CUBIST_RETURN_IF_ERROR(layer->CanImplement(a, 0));
  CUBIST_RETURN_IF_ERROR(layer->Run(a, stream.get()));
  CUBIST_RETURN_IF_ERROR(stream.Synchronize());

  LayerRun r;
  CUBIST_ASSIGN_OR_RETURN(const ref::Comparison cmp,
                          CheckMaskedSample(f, in, counts, buffers.out, &r.checked_tokens));
  r.ok = cmp.ok;
  r.check_summary = cmp.summary;
  CUBIST_ASSIGN_OR_RETURN(r.time_us,
                          MedianRunUs(d, *layer, a, stream, f.warmup, f.iterations));
  r.experts_touched = static_cast<int>(
      std::count_if(counts.begin(), counts.end(), [](int32_t c) { return c > 0; }));
  r.floor_us = WeightFloorUs(o, r.experts_touched, f.copy_tbps);
  return r;
}

}  // namespace

absl::StatusOr<MoeLayerOptions> MoeLayerOptionsFromFlags(const MoeLayerRunFlags& f) {
  MoeLayerOptions o;
  auto flag = [](const char* name, const absl::Status& s) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
  };
  auto w = ParseDataFormat(f.weights);
  if (!w.ok()) return flag("--weights", w.status());
  auto a = ParseDataFormat(f.activations);
  if (!a.ok()) return flag("--activations", a.status());
  auto act = ParseActivation(f.activation);
  if (!act.ok()) return flag("--activation", act.status());
  o.weight_format = *w;
  o.activation_format = *a;
  o.activation = *act;
  o.num_experts = f.experts;
  o.top_k = f.top_k;
  o.hidden = f.hidden;
  o.intermediate = f.intermediate;
  o.routing_method = f.routing;
  o.n_group = f.n_group;
  o.topk_group = f.topk_group;
  o.routed_scaling_factor = f.routed_scaling_factor;
  o.apply_weight_on_input = f.routing == "llama4";
  o.max_chunk_tokens = f.max_chunk_tokens;
  o.input_layout = f.input_layout;
  o.max_m = f.max_m;
  o.fuse_intermediate_quantization = f.fuse_intermediate_quantization;
  o.nvfp4_gemm_inputs = f.nvfp4_gemm_inputs;
  o.fuse_gather = f.fuse_gather;
  if (f.pdl != "on" && f.pdl != "off") {
    return absl::InvalidArgumentError(
        absl::StrCat("--pdl: '", f.pdl, "' is not on or off"));
  }
  o.programmatic_dependent_launch = f.pdl == "on";
  if (o.input_layout == "expert_major_masked") {
    if (f.tokens >= 0) {
      return absl::InvalidArgumentError(
          "--tokens: expert_major_masked input has E x max_m rows; give --max-m instead");
    }
    CUBIST_RETURN_IF_ERROR(MoeLayer::WorkspaceSize(o, 0).status());
    return o;
  }
  if (f.tokens < 0 && o.input_layout == "token_major") {
    return absl::InvalidArgumentError("--tokens: give the batch's token count (T)");
  }
  CUBIST_RETURN_IF_ERROR(MoeLayer::WorkspaceSize(o, std::max(f.tokens, 0)).status());
  return o;
}

int RunMoeLayer(const MoeLayerRunFlags& f, const MoeLayerOptions& o, Runtime& rt) {
  const bool masked = o.input_layout == "expert_major_masked";
  absl::StatusOr<LayerRun> r = masked ? RunMaskedLayer(f, rt, o) : RunLayer(f, rt, o);
  if (!r.ok()) return PrintError(r.status());
  const std::string problem =
      masked ? absl::StrFormat("moe layer %s x %s, expert_major_masked, E=%d max_m=%d, H=%d, "
                               "I=%d, %s",
                               f.weights, f.activations, f.experts, f.max_m, f.hidden,
                               f.intermediate, f.activation)
             : absl::StrFormat("moe layer %s x %s, %s routing, E=%d top-%d, H=%d, I=%d, %s, T=%d",
                               f.weights, f.activations, f.routing, f.experts, f.top_k,
                               f.hidden, f.intermediate, f.activation, f.tokens);
  if (f.json) {
    nlohmann::json j = {{"device", rt.device_name()},
                        {"problem", problem},
                        {"check", {{"ok", r->ok}, {"tokens", r->checked_tokens},
                                   {"summary", r->check_summary}}},
                        {"time_us", r->time_us},
                        {"experts_touched", r->experts_touched},
                        {"floor_us", r->floor_us}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << absl::StrFormat(
        "device: %s\nproblem: %s\ncheck: %d tokens vs CPU reference: %s: %s\n"
        "time: %.1f us (median of %d, eager); floor %.1f us (weights of %d experts read "
        "once at %.1f TB/s)\n",
        rt.device_name(), problem, r->checked_tokens, r->check_summary,
        r->ok ? "PASS" : "FAIL", r->time_us, f.iterations, r->floor_us, r->experts_touched,
        f.copy_tbps);
  }
  if (!r->ok) {
    PrintError(absl::InternalError(absl::StrCat(
        "run: the MoE layer disagrees with the CPU reference (", r->check_summary,
        "); report it with this command line")));
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace cubist::cli
