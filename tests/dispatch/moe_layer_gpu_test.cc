// GPU tests of the routed MoE layer (dispatch/moe_layer.h) on a published artifact set:
// the manifest's routing, sort, gather and finalize kernels and its GEMMs, loaded through
// the Runtime (store, loader, registry) exactly as an engine does, against the CPU
// reference (dispatch/moe_layer_reference.h): routing ids exactly and weights to fp32
// rounding, the sort's offsets and permutation exactly, the layer's output within the
// bf16 GEMM tolerance; plus determinism (two runs, the same bits), expert parallelism
// with pre-routed ids out of range (dropped and counted), accumulation into out, chunked
// prefill and T = 0.
//
// The artifact directory is $CUBIST_MOE_ARTIFACTS, else <build>/moe-artifacts-small
// (scripts/build-artifacts DIR --small builds it: the moe_artifacts_test does). Without a
// GPU, a driver or the directory, every test skips, saying why.
#include <cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "dispatch/moe_layer.h"
#include "dispatch/moe_layer_reference.h"
#include "dispatch/moe_quantize_reference.h"
#include "dispatch/reference.h"
#include "dispatch/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loader/device_memory.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::BinaryDir;
using ::cubist::testing::FileExists;
using ::cubist::testing::TempDir;
using ::testing::HasSubstr;
namespace ref = ::cubist::reference;

std::string ArtifactDir() {
  const char* env = std::getenv("CUBIST_MOE_ARTIFACTS");
  return env && *env ? std::string(env) : BinaryDir() + "/moe-artifacts-small";
}

struct LayerEnv {
  TempDir dir;
  std::unique_ptr<Runtime> runtime;
  Stream stream;
  std::string skip_reason;
};

LayerEnv& Env() {
  static LayerEnv* env = [] {
    auto* e = new LayerEnv;
    const std::string manifest = ArtifactDir() + "/manifest.json";
    if (!FileExists(manifest)) {
      e->skip_reason = "no artifact set " + manifest +
                       " (scripts/build-artifacts DIR; set CUBIST_MOE_ARTIFACTS=DIR)";
      return e;
    }
    RuntimeOptions o;
    o.manifest = manifest;
    o.cache_dir = e->dir.Join("cache");
    o.tuning_file = "none";
    absl::StatusOr<std::unique_ptr<Runtime>> rt = Runtime::Open(o);
    if (!rt.ok()) {
      e->skip_reason = absl::StrCat("no runtime (no GPU or driver?): ", rt.status().message());
      return e;
    }
    if ((*rt)->sm().major != 9) {
      e->skip_reason = "the layer's kernels are sm_90a; this GPU is another architecture";
      return e;
    }
    e->runtime = std::move(*rt);
    if (absl::Status s = e->runtime->MakeCurrent(); !s.ok()) {
      e->skip_reason = absl::StrCat("context: ", s.message());
      return e;
    }
    absl::StatusOr<Stream> s = Stream::Create(e->runtime->driver());
    if (!s.ok()) {
      e->skip_reason = absl::StrCat("stream: ", s.status().message());
      return e;
    }
    e->stream = std::move(*s);
    return e;
  }();
  return *env;
}

#define CUBIST_REQUIRE_GPU()                                            \
  do {                                                                  \
    if (!Env().skip_reason.empty()) GTEST_SKIP() << Env().skip_reason;  \
    ASSERT_TRUE(Env().runtime->MakeCurrent().ok());                     \
  } while (0)

template <typename T>
DeviceBuffer Upload(const std::vector<T>& v) {
  DriverApi& d = Env().runtime->driver();
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(d, std::max<size_t>(v.size(), 1) * sizeof(T));
  EXPECT_TRUE(b.ok()) << b.status();
  if (!v.empty()) EXPECT_TRUE(b->CopyFromHost(v.data(), v.size() * sizeof(T)).ok());
  return std::move(*b);
}

template <typename T>
std::vector<T> Download(const DeviceBuffer& b, size_t count, size_t offset = 0) {
  std::vector<T> v(count);
  if (count > 0) EXPECT_TRUE(b.CopyToHost(v.data(), count * sizeof(T), offset).ok());
  return v;
}

float MaxAbsBf16(const std::vector<uint16_t>& v) {
  float m = 0;
  for (uint16_t b : v) m = std::max(m, std::fabs(ref::Bf16ToFloat(b)));
  return m;
}

std::vector<uint16_t> RandomBf16(size_t n, double scale, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = ref::FloatToBf16(static_cast<float>(nd(rng) * scale));
  return v;
}

struct Case {
  MoeLayerOptions options;
  int tokens = 0;
  bool pre_routed = false;
  bool bf16_logits = false;
  bool with_bias = false;
  bool nan_logits = false;
  bool tied_logits = false;  // whole numbers (-0 among them): many equal logits
  bool accumulate = false;
  bool biases = false;       // per-expert biases after both GEMMs, gpt-oss's SwiGLU
  std::vector<int32_t> ids;  // pre-routed (else random)
};

struct Result {
  ref::Routing routing;  // what the layer used (device routing, or the given ids)
  std::vector<uint16_t> out;
  int32_t dropped = 0;
  bool fused = false;  // GEMM1 wrote GEMM2's fp8 input itself (no quantize kernel)
  bool decoded = false;  // the nvfp4 pair's GEMMs read decoded bf16 inputs
  bool gather_fused = false;  // GEMM1 read the token rows through the row map itself
  std::vector<uint8_t> gemm2_input;  // quantized activations: GEMM2's input, its rows
};

// The quantize kernels' bytes, bit for bit: GEMM1's input (the gathered rows quantized on
// the way) against the reference quantizer of the same rows, and GEMM2's input against
// the reference quantizer of the kernels' own bf16 GEMM1 output - unless GEMM1 wrote that
// input itself (`fused`: no bf16 output to quantize; FusedIntermediateQuantization-
// IsBitIdentical compares it with the unfused layer's, and moe_gemm_gpu_test the fused
// kernels with their bf16 twins).
// nvfp4_gemm_inputs "decoded": the bf16 values value(q) x sf of nvfp4 rows (exact).
std::vector<uint16_t> DecodedNvfp4(const ref::QuantizedRows& q, int rows, int cols) {
  std::vector<uint16_t> out(static_cast<size_t>(rows) * cols);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint8_t byte = q.data[i / 2];
    const float v = ref::E2m1ToFloat(i % 2 == 0 ? byte & 0xF : byte >> 4) *
                    ref::E4m3ToFloat(q.scale[i / 16]);
    out[i] = ref::FloatToBf16(v);
  }
  return out;
}

// With `decoded` (nvfp4_gemm_inputs), GEMM2's input is checked as its bf16 values; GEMM1's
// decoded input shares `rows` with GEMM2's output, so only the layer's output covers it.
void CheckQuantized(const ref::MoeLayerData& d, const ref::Routing& routing,
                    const ref::SlotSort& sort, const DeviceBuffer& ws,
                    const MoeLayerWorkspace& w, bool fused, bool decoded = false) {
  const int rows = sort.offsets.back(), h = d.hidden, k = routing.top_k;
  std::vector<uint16_t> gathered(static_cast<size_t>(rows) * h);
  for (int r = 0; r < rows; ++r) {
    const int slot = sort.permuted_to_expanded[r];
    for (int i = 0; i < h; ++i) {
      const uint16_t x = d.x[static_cast<size_t>(slot / k) * h + i];
      gathered[static_cast<size_t>(r) * h + i] =
          d.apply_weight_on_input ? ref::FloatToBf16(ref::Bf16ToFloat(x) * routing.weights[slot])
                                  : x;
    }
  }
  const moe::MoeFormat f = d.activation_format;
  const char* name = moe::FormatName(f);
  const ref::QuantizedRows q1 = ref::QuantizeActivations(f, gathered, rows, h, d.input_scale);
  if (!decoded) {
    EXPECT_TRUE(Download<uint8_t>(ws, q1.data.size(), w.gathered) == q1.data)
        << name << ": GEMM1's input differs from the reference quantizer";
    EXPECT_TRUE(Download<uint8_t>(ws, q1.scale.size(), w.gathered_scale) == q1.scale)
        << name << ": GEMM1's input scales differ from the reference quantizer";
  }
  if (fused) return;
  const std::vector<uint16_t> act =
      Download<uint16_t>(ws, static_cast<size_t>(rows) * d.intermediate, w.activated);
  const ref::QuantizedRows q2 =
      ref::QuantizeActivations(f, act, rows, d.intermediate, d.intermediate_scale);
  if (decoded) {
    EXPECT_TRUE(Download<uint16_t>(ws, static_cast<size_t>(rows) * d.intermediate,
                                   w.quantized) == DecodedNvfp4(q2, rows, d.intermediate))
        << name << ": GEMM2's decoded input differs from the reference quantizer's values";
  } else {
    EXPECT_TRUE(Download<uint8_t>(ws, q2.data.size(), w.quantized) == q2.data)
        << name << ": GEMM2's input differs from the reference quantizer";
    EXPECT_TRUE(Download<uint8_t>(ws, q2.scale.size(), w.quantized_scale) == q2.scale)
        << name << ": GEMM2's input scales differ from the reference quantizer";
  }
  if (f == moe::kNvfp4) {
    const std::vector<float> g = Download<float>(ws, 2, w.global_scales);
    EXPECT_EQ(g[0], q1.global);
    EXPECT_EQ(g[1], q2.global);
  }
}

// The layer's data for `o`: `rows` random input rows, the local experts' weights
// (quantized into the weight format), and, with `biases`, gpt-oss's biases and SwiGLU
// parameters; the activations' per-tensor scales calibrated as an engine would.
ref::MoeLayerData LayerData(const MoeLayerOptions& o, int rows, bool biases,
                            std::mt19937_64& rng) {
  const int e = static_cast<int>(o.num_experts);
  const int h = static_cast<int>(o.hidden), inter = static_cast<int>(o.intermediate);
  const int l = static_cast<int>(o.num_local_experts > 0 ? o.num_local_experts : e);
  const int n1 = IsGated(o.activation) ? 2 * inter : inter;
  ref::MoeLayerData d;
  d.tokens = rows;
  d.hidden = h;
  d.intermediate = inter;
  d.num_experts = e;
  d.local_expert_offset = static_cast<int>(o.local_expert_offset);
  d.num_local_experts = l;
  d.activation = o.activation;
  d.apply_weight_on_input = o.apply_weight_on_input;
  d.x = RandomBf16(static_cast<size_t>(rows) * h, 1.0, rng);
  d.w1 = RandomBf16(static_cast<size_t>(l) * n1 * h, 1.0 / std::sqrt(h), rng);
  d.w2 = RandomBf16(static_cast<size_t>(l) * h * inter, 1.0 / std::sqrt(inter), rng);
  d.weight_format = o.weight_format;
  d.activation_format = o.activation_format;
  ref::QuantizeLayerWeights(&d);
  if (biases) {  // gpt-oss: biases after both GEMMs, SwiGLU alpha 1.702, beta 1, limit 7
    std::uniform_real_distribution<float> ub(-0.5f, 0.5f);
    for (int i = 0; i < l * n1; ++i) d.w1_bias.push_back(ub(rng));
    for (int i = 0; i < l * h; ++i) d.w2_bias.push_back(ub(rng));
    d.alpha.assign(l, 1.702f);
    d.beta.assign(l, 1.0f);
    d.limit.assign(l, 7.0f);
  }
  // Per-tensor activation scales as an engine calibrates them: from the input's amax, and
  // a fixed bound for GEMM1's output (O(1) here; saturating beyond it is the same in the
  // kernels and the reference).
  d.input_scale = ref::ActivationScaleFor(o.activation_format, MaxAbsBf16(d.x));
  d.intermediate_scale = ref::ActivationScaleFor(o.activation_format, 4.0f);
  return d;
}

// The layer's input and weights on the device, and the arguments that point at them.
struct DeviceLayer {
  explicit DeviceLayer(const ref::MoeLayerData& d) {
    const bool quantized_weights = d.weight_format != moe::kBf16;
    x = Upload(d.x);
    w1 = quantized_weights ? Upload(d.w1q) : Upload(d.w1);
    w2 = quantized_weights ? Upload(d.w2q) : Upload(d.w2);
    w1s = Upload(d.w1_scale);
    w2s = Upload(d.w2_scale);
    w1g = Upload(d.w1_global);
    w2g = Upload(d.w2_global);
    s1 = Upload(std::vector<float>{d.input_scale});
    s2 = Upload(std::vector<float>{d.intermediate_scale});
    b1 = Upload(d.w1_bias);
    b2 = Upload(d.w2_bias);
    alpha = Upload(d.alpha);
    beta = Upload(d.beta);
    limit = Upload(d.limit);
  }
  // hidden_states, the weights with their scales, the activation scales and the biases.
  void Fill(const ref::MoeLayerData& d, bool biases, MoeLayerArgs* a) const {
    a->hidden_states = x.get();
    a->w1 = w1.get();
    a->w2 = w2.get();
    if (!d.w1_scale.empty()) {
      a->w1_scale = w1s.get();
      a->w2_scale = w2s.get();
    }
    if (!d.w1_global.empty()) {
      a->w1_global_scale = w1g.get();
      a->w2_global_scale = w2g.get();
    }
    if (moe::FormatHasGlobalScale(d.activation_format)) {
      a->input_scale = s1.get();
      a->intermediate_scale = s2.get();
    }
    if (biases) {
      a->w1_bias = b1.get();
      a->w2_bias = b2.get();
      a->alpha = alpha.get();
      a->beta = beta.get();
      a->limit = limit.get();
    }
  }
  DeviceBuffer x, w1, w2, w1s, w2s, w1g, w2g, s1, s2, b1, b2, alpha, beta, limit;
};

// Runs the layer once on inputs drawn from `seed` and checks routing, sort and output
// against the reference; returns what it ran.
Result RunAndCheck(const Case& c, uint64_t seed) {
  LayerEnv& env = Env();
  const MoeLayerOptions& o = c.options;
  const int t = c.tokens, e = static_cast<int>(o.num_experts), k = static_cast<int>(o.top_k);
  const int h = static_cast<int>(o.hidden);
  const int l = static_cast<int>(o.num_local_experts > 0 ? o.num_local_experts : e);
  std::mt19937_64 rng(seed);
  const ref::MoeLayerData d = LayerData(o, t, c.biases, rng);
  const bool quantized_acts = o.activation_format != moe::kBf16;

  // Logits as the device sees them: bf16 logits are rounded first, and the reference
  // routes on the same (widened) values.
  std::vector<float> logits(static_cast<size_t>(t) * e);
  std::vector<uint16_t> logits_bf16(logits.size());
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = nd(rng);
    if (c.tied_logits) logits[i] = std::round(logits[i]);
    if (c.nan_logits && i % 7 == 3) logits[i] = std::nanf("");
    if (c.bf16_logits) {
      logits_bf16[i] = ref::FloatToBf16(logits[i]);
      logits[i] = ref::Bf16ToFloat(logits_bf16[i]);
    }
  }
  std::vector<float> bias;
  if (c.with_bias) {
    std::uniform_real_distribution<float> ud(-0.2f, 0.2f);
    for (int i = 0; i < e; ++i) bias.push_back(ud(rng));
  }
  ref::RoutingConfig rc;
  rc.method = *ParseRoutingMethod(o.routing_method);
  rc.num_experts = e;
  rc.top_k = k;
  rc.n_group = static_cast<int>(o.n_group);
  rc.topk_group = static_cast<int>(o.topk_group);
  rc.routed_scaling_factor = o.routed_scaling_factor;
  ref::Routing want_routing;
  if (c.pre_routed) {
    want_routing.tokens = t;
    want_routing.top_k = k;
    want_routing.ids = c.ids;
    std::uniform_real_distribution<float> ud(0.0f, 1.0f);
    for (size_t i = 0; i < c.ids.size(); ++i) want_routing.weights.push_back(ud(rng));
  } else {
    want_routing = ref::Route(rc, logits, bias, t);
  }
  std::vector<uint16_t> prior;
  if (c.accumulate) prior = RandomBf16(static_cast<size_t>(t) * h, 0.5, rng);

  absl::StatusOr<std::unique_ptr<MoeLayer>> layer = MoeLayer::Create(*env.runtime, o);
  EXPECT_TRUE(layer.ok()) << layer.status();
  if (!layer.ok()) return {};
  absl::StatusOr<MoeLayerWorkspace> layout = MoeLayer::WorkspaceLayout(o, t);
  EXPECT_TRUE(layout.ok()) << layout.status();

  const DeviceLayer dev(d);
  DeviceBuffer lg = c.bf16_logits ? Upload(logits_bf16) : Upload(logits);
  DeviceBuffer bias_d = Upload(bias);
  DeviceBuffer ids = Upload(want_routing.ids), wts = Upload(want_routing.weights);
  DeviceBuffer out = Upload(c.accumulate ? prior : std::vector<uint16_t>(size_t(t) * h, 0x7FC1));
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(env.runtime->driver(), layout->bytes);
  EXPECT_TRUE(ws.ok());
  EXPECT_TRUE(ws->Fill(0xAB).ok());  // poisoned: nothing may rely on a zeroed workspace

  MoeLayerArgs a;
  a.tokens = t;
  dev.Fill(d, c.biases, &a);
  if (c.pre_routed) {
    a.topk_ids = ids.get();
    a.topk_weights = wts.get();
  } else {
    a.router_logits = lg.get();
    if (c.with_bias) a.routing_bias = bias_d.get();
  }
  a.out = out.get();
  a.accumulate = c.accumulate;
  a.workspace = ws->get();
  a.workspace_bytes = ws->size();
  absl::Status s = (*layer)->CanImplement(a, t);
  EXPECT_TRUE(s.ok()) << s;
  s = (*layer)->Run(a, env.stream.get());
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(env.stream.Synchronize().ok());

  Result r;
  const int64_t chunk = layout->chunk_tokens;
  r.routing = want_routing;
  if (!c.pre_routed && chunk >= t) {
    r.routing.ids = Download<int32_t>(*ws, size_t(t) * k, layout->topk_ids);
    r.routing.weights = Download<float>(*ws, size_t(t) * k, layout->topk_weights);
    EXPECT_EQ(r.routing.ids, want_routing.ids) << o.routing_method;
    int bad = 0;
    for (size_t i = 0; i < r.routing.weights.size() && bad < 5; ++i) {
      const float got = r.routing.weights[i], want = want_routing.weights[i];
      const bool same = std::isnan(want) ? std::isnan(got)
                                         : std::fabs(got - want) <= 2e-6f * std::max(1.0f, std::fabs(want));
      if (!same) ++bad;
      EXPECT_TRUE(same) << o.routing_method << " slot " << i << ": " << got << " vs " << want;
    }
  }
  if (chunk >= t) {
    const ref::SlotSort sort = ref::SortSlots(r.routing.ids, e, d.local_expert_offset, l);
    EXPECT_EQ(Download<int32_t>(*ws, l + 1, layout->offsets), sort.offsets);
    EXPECT_EQ(Download<int32_t>(*ws, size_t(t) * k, layout->expanded_to_permuted),
              sort.expanded_to_permuted);
    EXPECT_EQ(Download<int32_t>(*ws, sort.offsets[l], layout->permuted_to_expanded),
              sort.permuted_to_expanded);
    r.dropped = Download<int32_t>(*ws, 1, layout->dropped)[0];
    EXPECT_EQ(r.dropped, sort.dropped);
    r.fused = (*layer)->fuses_intermediate_quantization();
    r.decoded = (*layer)->DecodesNvfp4Inputs(t);
    r.gather_fused = (*layer)->fuses_gather();
    if (quantized_acts) {
      CheckQuantized(d, r.routing, sort, *ws, *layout, r.fused, r.decoded);
      r.gemm2_input = Download<uint8_t>(
          *ws, moe::MoeElementBytes(d.activation_format, int64_t{sort.offsets[l]} * d.intermediate),
          layout->quantized);
    }
  }
  r.out = Download<uint16_t>(out, size_t(t) * h);
  const std::vector<double> want = ref::MoeLayerReference(d, r.routing, prior);
  const ref::Tolerance tol = ref::MoeLayerTolerance(o.activation_format);
  const ref::Comparison cmp = ref::CompareBf16(r.out, want, tol);
  EXPECT_TRUE(cmp.ok) << o.routing_method << " " << moe::FormatName(o.weight_format) << " x "
                      << moe::FormatName(o.activation_format) << " T=" << t << ": "
                      << cmp.summary;
  std::printf("[ layer    ] %s x %s T=%d %s: %s\n", moe::FormatName(o.weight_format),
              moe::FormatName(o.activation_format), t, ActivationName(o.activation),
              cmp.summary.c_str());
  return r;
}

MoeLayerOptions Small() {
  MoeLayerOptions o;
  o.num_experts = 16;
  o.top_k = 4;
  o.hidden = 256;
  o.intermediate = 128;
  o.activation = Activation::kSwiglu;
  return o;
}

TEST(MoeLayerGpuTest, MatchesTheReferenceFromDecodeToPrefill) {
  CUBIST_REQUIRE_GPU();
  // 1 and 5 tokens: the one-CTA sort; 1500 tokens x 4 = 6000 slots: count, scan, scatter.
  for (int t : {1, 5, 64, 1500}) {
    Case c;
    c.options = Small();
    c.tokens = t;
    RunAndCheck(c, 100 + t);
  }
}

// Every weight x activation pair of the family, decode and a multi-CTA sort, with the
// quantize kernels' bytes checked bit for bit (CheckQuantized).
TEST(MoeLayerGpuTest, EveryFormatPair) {
  CUBIST_REQUIRE_GPU();
  const std::pair<DataFormat, DataFormat> pairs[] = {
      {DataFormat::kFp8, DataFormat::kFp8},     {DataFormat::kFp8Block, DataFormat::kFp8Block},
      {DataFormat::kMxfp4, DataFormat::kBf16},  {DataFormat::kMxfp4, DataFormat::kMxfp8},
      {DataFormat::kNvfp4, DataFormat::kBf16},  {DataFormat::kNvfp4, DataFormat::kNvfp4},
  };
  for (const auto& [wf, af] : pairs) {
    for (int t : {3, 1500}) {
      Case c;
      c.options = Small();
      c.options.weight_format = wf;
      c.options.activation_format = af;
      c.tokens = t;
      SCOPED_TRACE(absl::StrCat(moe::FormatName(wf), " x ", moe::FormatName(af), " T=", t));
      RunAndCheck(c, 800 + t);
    }
  }
}

// Runs `c` twice on the same data, each run checked against the reference: with
// set(options, false), then with set(options, true).
template <typename Set>
std::pair<Result, Result> RunBothWays(Case c, int seed, Set set) {
  set(c.options, false);
  Result first = RunAndCheck(c, seed);
  set(c.options, true);
  return {std::move(first), RunAndCheck(c, seed)};
}

// The nvfp4 pair's GEMMs on decoded bf16 inputs (nvfp4 x bf16 kernels, the quantize
// kernels writing e2m1 x e4m3 values) against the same layer on nvfp4's bytes: both
// within the reference's tolerance, GEMM2's decoded input bit for bit the reference
// quantizer's values (CheckQuantized), and the same outputs bit for bit (the same exact
// products; wgmma's sums come out the same for either k order within a 32-element block).
// Decode, a multi-CTA sort, gpt-oss's biases and clamp.
TEST(MoeLayerGpuTest, DecodedNvfp4InputsMatchPackedOnes) {
  CUBIST_REQUIRE_GPU();
  for (int t : {3, 1500}) {
    for (bool biases : {false, true}) {
      Case c;
      c.options = Small();
      c.options.weight_format = c.options.activation_format = DataFormat::kNvfp4;
      c.tokens = t;
      c.biases = biases;
      SCOPED_TRACE(absl::StrCat("T=", t, biases ? " with biases" : ""));
      const auto [packed, decoded] = RunBothWays(c, 1700 + t, [](MoeLayerOptions& o, bool on) {
        o.nvfp4_gemm_inputs = on ? "decoded" : "packed";
      });
      EXPECT_FALSE(packed.decoded);
      EXPECT_TRUE(decoded.decoded);
      EXPECT_FALSE(packed.out.empty());
      EXPECT_TRUE(packed.out == decoded.out) << "the layer's outputs differ in some bits";
    }
  }
}

// Calls check(c) for `probe`'s layer with SwiGLU, with and without gpt-oss's biases and
// clamp, and with ReLU^2, at each of `tokens`: the cases of the fusion tests below.
template <typename Check>
void ForEachFusionCase(const MoeLayerOptions& probe, std::initializer_list<int> tokens,
                       Check check) {
  for (Activation act : {Activation::kSwiglu, Activation::kRelu2}) {
    for (bool biases : {false, true}) {
      if (biases && act != Activation::kSwiglu) continue;
      for (int t : tokens) {
        Case c;
        c.options = probe;
        c.options.activation = act;
        c.biases = biases;
        c.tokens = t;
        SCOPED_TRACE(absl::StrCat(ActivationName(act), biases ? " biases" : "", " T=", t));
        check(c);
      }
    }
  }
}

// The fp8 pair with GEMM1's output quantized in GEMM1's epilogue (the _ofp8 kernels,
// fuse_intermediate_quantization "on") and by the separate quantize kernel ("off"): the
// same GEMM2 input bytes and the same layer output, bit for bit - decode, a multi-CTA
// sort, gated and element-wise activations, gpt-oss's biases and clamp.
TEST(MoeLayerGpuTest, FusedIntermediateQuantizationIsBitIdentical) {
  CUBIST_REQUIRE_GPU();
  MoeLayerOptions probe = Small();
  probe.weight_format = probe.activation_format = DataFormat::kFp8;
  auto layer = MoeLayer::Create(*Env().runtime, probe);
  ASSERT_TRUE(layer.ok()) << layer.status();
  if (!(*layer)->fuses_intermediate_quantization()) {
    GTEST_SKIP() << "the manifest has no fp8-output GEMM1 kernel (scripts/build-artifacts "
                    "builds the _ofp8 kernels with the fp8 pair)";
  }
  ForEachFusionCase(probe, {3, 64, 1500}, [](const Case& c) {
    const auto [off, on] = RunBothWays(c, 1700 + c.tokens, [](MoeLayerOptions& o, bool fused) {
      o.fuse_intermediate_quantization = fused ? "on" : "off";
    });
    EXPECT_FALSE(off.fused);
    EXPECT_TRUE(on.fused);
    EXPECT_FALSE(on.gemm2_input.empty());
    EXPECT_TRUE(on.gemm2_input == off.gemm2_input) << "GEMM2's input bytes differ";
    EXPECT_TRUE(on.out == off.out) << "the layer's outputs differ in some bits";
  });
}

// The bf16 pair with GEMM1 reading the token rows through the sort's row map itself (the
// _gather kernels, fuse_gather "on") and from the gather kernel's copy ("off"): the same
// layer output, bit for bit - decode, 64 tokens, a multi-CTA sort, gated and element-wise
// activations, gpt-oss's biases and clamp.
TEST(MoeLayerGpuTest, FusedGatherIsBitIdentical) {
  CUBIST_REQUIRE_GPU();
  MoeLayerOptions probe = Small();
  auto layer = MoeLayer::Create(*Env().runtime, probe);
  ASSERT_TRUE(layer.ok()) << layer.status();
  if (!(*layer)->fuses_gather()) {
    GTEST_SKIP() << "the manifest has no gathering GEMM1 kernel (scripts/build-artifacts "
                    "builds the _gather kernels with the bf16 pair)";
  }
  ForEachFusionCase(probe, {1, 3, 64, 1500}, [](const Case& c) {
    const auto [off, on] = RunBothWays(c, 1900 + c.tokens, [](MoeLayerOptions& o, bool fused) {
      o.fuse_gather = fused ? "on" : "off";
    });
    EXPECT_FALSE(off.gather_fused);
    EXPECT_TRUE(on.gather_fused);
    EXPECT_FALSE(on.out.empty());
    EXPECT_TRUE(on.out == off.out) << "the layer's outputs differ in some bits";
  });
}

// llama4's weight on input, quantized on the way (fp8 per tensor).
TEST(MoeLayerGpuTest, QuantizedGatherAppliesTheWeightOnInput) {
  CUBIST_REQUIRE_GPU();
  Case c;
  c.options = Small();
  c.options.weight_format = c.options.activation_format = DataFormat::kFp8;
  c.options.routing_method = "llama4";
  c.options.top_k = 1;
  c.options.apply_weight_on_input = true;
  c.tokens = 50;
  RunAndCheck(c, 900);
}

// gpt-oss's experts: biases after both GEMMs and its clamped SwiGLU, on its two weight
// pairs (bf16 and mxfp4 x bf16).
TEST(MoeLayerGpuTest, GptOssBiasesAndSwiglu) {
  CUBIST_REQUIRE_GPU();
  for (DataFormat wf : {DataFormat::kBf16, DataFormat::kMxfp4}) {
    Case c;
    c.options = Small();
    c.options.weight_format = wf;
    c.biases = true;
    for (int t : {2, 700}) {
      c.tokens = t;
      SCOPED_TRACE(absl::StrCat(moe::FormatName(wf), " T=", t));
      RunAndCheck(c, 980 + t);
    }
  }
}

// gpt-oss-120b's hidden size: K = 2880 is 22.5 blocks of 128, the last one partial.
TEST(MoeLayerGpuTest, Fp8BlockWithAPartialLastBlock) {
  CUBIST_REQUIRE_GPU();
  Case c;
  c.options = Small();
  c.options.weight_format = c.options.activation_format = DataFormat::kFp8Block;
  c.options.hidden = 2880;
  c.options.intermediate = 320;
  c.tokens = 20;
  RunAndCheck(c, 950);
}

// Rows of several 1,024-column passes, which the quantize kernels split over CTAs at decode
// (MoeQuantizeParts): GEMM1's input is 3 passes (3,040 columns: the last one partial, and
// fp8-block's last 128-block too), GEMM2's 2 (1,280). At 1 and 7 tokens every pass has a
// CTA of its own; at 300 a CTA quantizes whole rows. The quantized bytes are checked bit
// for bit (CheckQuantized), every pair.
TEST(MoeLayerGpuTest, QuantizeSplitsLongRowsAtDecode) {
  CUBIST_REQUIRE_GPU();
  const std::pair<DataFormat, DataFormat> pairs[] = {
      {DataFormat::kFp8, DataFormat::kFp8},     {DataFormat::kFp8Block, DataFormat::kFp8Block},
      {DataFormat::kMxfp4, DataFormat::kMxfp8}, {DataFormat::kNvfp4, DataFormat::kNvfp4},
  };
  for (const auto& [wf, af] : pairs) {
    for (int t : {1, 7, 300}) {
      Case c;
      c.options = Small();
      c.options.num_experts = 8;
      c.options.top_k = 2;
      c.options.hidden = 3040;
      c.options.intermediate = 1280;
      c.options.weight_format = wf;
      c.options.activation_format = af;
      c.tokens = t;
      SCOPED_TRACE(absl::StrCat(moe::FormatName(wf), " x ", moe::FormatName(af), " T=", t));
      RunAndCheck(c, 1100 + t);
    }
  }
}

// Every method at 1, 3 and 20 tokens (decode's route_sort kernel) and 77 (the route
// kernel, then the sort), with tied logits (default, deepseek_v3) and NaN logits.
TEST(MoeLayerGpuTest, EveryRoutingMethod) {
  CUBIST_REQUIRE_GPU();
  for (int m = 0; m < moe::kMoeRoutingMethods; ++m) {
    for (int t : {1, 3, 20, 77}) {
      Case c;
      c.options = Small();
      c.options.num_experts = 64;
      c.options.routing_method = moe::MoeRoutingMethodName(static_cast<moe::MoeRoutingMethod>(m));
      c.tokens = t;
      if (m == moe::kRouteDeepSeekV3) {
        c.options.n_group = 8;
        c.options.topk_group = 4;
        c.options.routed_scaling_factor = 2.5f;
        c.with_bias = true;
      }
      if (m == moe::kRouteLlama4) {
        c.options.top_k = 1;
        c.options.apply_weight_on_input = true;
      }
      c.bf16_logits = m % 2 == 1;
      if (c.bf16_logits) c.options.logits_format = "bf16";
      c.nan_logits = m == moe::kRouteRenormalize || m == moe::kRouteTopK;
      c.tied_logits = m == moe::kRouteDefault || m == moe::kRouteDeepSeekV3;
      SCOPED_TRACE(absl::StrCat(c.options.routing_method, " T=", t));
      RunAndCheck(c, 200 + 10 * m + t);
    }
  }
}

// Decode's routing (route_sort) at the models' widths: DeepSeek-V3's 256 experts in 8
// groups, Qwen3's 128 and 1,024, with whole-number logits (many ties, -0 among them) and
// with NaN logits, at 1 to 9 tokens.
TEST(MoeLayerGpuTest, DecodeRoutingAtModelWidthsMatchesTheReference) {
  CUBIST_REQUIRE_GPU();
  struct Width {
    int experts, top_k;
    const char* method;
    std::vector<int> tokens;
  };
  const Width widths[] = {{256, 8, "deepseek_v3", {1, 2, 4, 5}},
                          {128, 8, "renormalize", {1, 8, 9}},
                          {1024, 16, "default", {1, 2}}};
  for (const Width& w : widths) {
    for (int t : w.tokens) {
      for (int variant = 0; variant < 2; ++variant) {
        Case c;
        c.options = Small();
        c.options.num_experts = w.experts;
        c.options.top_k = w.top_k;
        c.options.routing_method = w.method;
        if (std::string_view(w.method) == "deepseek_v3") {
          c.options.n_group = 8;
          c.options.topk_group = 4;
          c.options.routed_scaling_factor = 2.5f;
          c.with_bias = true;
        }
        c.tokens = t;
        c.tied_logits = variant == 0;
        c.nan_logits = variant == 1;
        SCOPED_TRACE(absl::StrCat(w.method, " E=", w.experts, " T=", t,
                                  variant == 0 ? " tied" : " NaN"));
        RunAndCheck(c, 3000 + w.experts + 10 * t + variant);
      }
    }
  }
}

TEST(MoeLayerGpuTest, WideRouterAndManySlots) {
  CUBIST_REQUIRE_GPU();
  Case c;
  c.options = Small();
  c.options.num_experts = 1024;
  c.options.top_k = 16;
  c.options.routing_method = "default";
  c.tokens = 300;  // 4800 slots over 1024 experts: the multi-CTA sort, most experts tiny
  RunAndCheck(c, 300);
}

TEST(MoeLayerGpuTest, IsDeterministic) {
  CUBIST_REQUIRE_GPU();
  Case c;
  c.options = Small();
  c.tokens = 1500;
  const Result a = RunAndCheck(c, 400), b = RunAndCheck(c, 400);
  EXPECT_TRUE(a.out == b.out) << "two runs of the same inputs differ in some bits";
}

TEST(MoeLayerGpuTest, ExpertParallelPreRoutedWithDroppedIds) {
  CUBIST_REQUIRE_GPU();
  Case c;
  c.options = Small();
  c.options.local_expert_offset = 4;
  c.options.num_local_experts = 8;  // experts 4..11 live here
  c.tokens = 40;
  c.pre_routed = true;
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int> id(-3, 19);  // some ids are no expert at all
  for (int i = 0; i < c.tokens * 4; ++i) c.ids.push_back(id(rng));
  c.ids[0] = c.ids[1] = c.ids[2] = c.ids[3] = 0;  // token 0: no local expert -> zeros
  const Result r = RunAndCheck(c, 500);
  EXPECT_GT(r.dropped, 0);
  ASSERT_FALSE(r.out.empty());
  for (int i = 0; i < 256; ++i) ASSERT_EQ(r.out[i], 0) << "token 0, column " << i;
}

// Decode-sized expert parallelism: up to 32 slots are sorted by one warp (WarpSort),
// reached through the route-and-sort kernel (routing from logits: experts of other ranks)
// and through the fused sort (pre-routed ids, some of no expert at all).
TEST(MoeLayerGpuTest, ExpertParallelAtDecode) {
  CUBIST_REQUIRE_GPU();
  for (int t : {1, 3, 8}) {
    for (bool pre_routed : {false, true}) {
      Case c;
      c.options = Small();
      c.options.local_expert_offset = 4;
      c.options.num_local_experts = 8;  // experts 4..11 live here
      c.tokens = t;
      c.pre_routed = pre_routed;
      if (pre_routed) {
        std::mt19937_64 rng(40 + t);
        std::uniform_int_distribution<int> id(-3, 19);
        for (int i = 0; i < t * 4; ++i) c.ids.push_back(id(rng));
        c.ids[1] = -1;  // dropped
        c.ids[2] = 16;  // past the last expert: dropped
        c.ids[3] = 2;   // another rank's
      }
      SCOPED_TRACE(absl::StrCat("T=", t, pre_routed ? " pre-routed" : " routed"));
      const Result r = RunAndCheck(c, 600 + t + (pre_routed ? 50 : 0));
      if (pre_routed) EXPECT_GE(r.dropped, 2);
    }
  }
}

TEST(MoeLayerGpuTest, AccumulatesIntoOut) {
  CUBIST_REQUIRE_GPU();
  Case c;
  c.options = Small();
  c.tokens = 33;
  c.accumulate = true;
  RunAndCheck(c, 600);
}

// Rows wide enough that the finalize sums each token with several CTAs
// (MoeFinalizeCtas): 129 vectors in two uneven parts at 1 and 9 tokens, one CTA per token
// again at 300; adding into out too.
TEST(MoeLayerGpuTest, FinalizeSplitsWideRowsAtDecode) {
  CUBIST_REQUIRE_GPU();
  for (int t : {1, 9, 300}) {
    for (bool accumulate : {false, true}) {
      Case c;
      c.options = Small();
      c.options.hidden = 1032;
      c.tokens = t;
      c.accumulate = accumulate;
      SCOPED_TRACE(absl::StrCat("T=", t, accumulate ? " accumulating" : ""));
      RunAndCheck(c, 1000 + 2 * t + accumulate);
    }
  }
}

TEST(MoeLayerGpuTest, ChunkedPrefillMatchesTheReference) {
  CUBIST_REQUIRE_GPU();
  Case c;
  c.options = Small();
  c.options.max_chunk_tokens = 96;
  c.tokens = 250;  // three passes, the last one short
  RunAndCheck(c, 700);
}

TEST(MoeLayerGpuTest, NoTokensIsANoOp) {
  CUBIST_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<MoeLayer>> layer = MoeLayer::Create(*Env().runtime, Small());
  ASSERT_TRUE(layer.ok()) << layer.status();
  MoeLayerArgs a;  // every pointer null
  EXPECT_TRUE((*layer)->Run(a, Env().stream.get()).ok());
}

TEST(MoeLayerGpuTest, RefusesASmallWorkspaceAndMissingRouting) {
  CUBIST_REQUIRE_GPU();
  absl::StatusOr<std::unique_ptr<MoeLayer>> layer = MoeLayer::Create(*Env().runtime, Small());
  ASSERT_TRUE(layer.ok()) << layer.status();
  MoeLayerArgs a;
  a.tokens = 8;
  a.hidden_states = a.w1 = a.w2 = a.out = a.workspace = 1 << 20;
  a.workspace_bytes = 100;
  absl::Status s = (*layer)->Run(a, Env().stream.get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("topk_ids: is null: give router_logits, or pre-routed"));
  a.router_logits = 1 << 20;
  s = (*layer)->Run(a, Env().stream.get());
  EXPECT_THAT(s.message(), HasSubstr("workspace: 100 bytes, "));
  EXPECT_THAT(s.message(), HasSubstr("size it with WorkspaceSize"));
  a.workspace_bytes = 1 << 30;
  a.w1 = (1 << 20) + 8;
  s = (*layer)->Run(a, Env().stream.get());
  EXPECT_THAT(s.message(), HasSubstr("w1: address 0x100008 is not 16-byte aligned"));
}

// ---- The expert-major masked layout (input_layout "expert_major_masked") ----

constexpr uint16_t kSentinel = 0x7FC1;  // a bf16 NaN no kernel writes

// Runs the masked layer on [L, max_m, H] inputs drawn from `seed` with `counts` and checks
// the compaction (offsets and row map) exactly, every valid row of out against the
// reference, and every padded row's bytes: still the sentinel out was filled with.
void RunMaskedAndCheck(const MoeLayerOptions& o, const std::vector<int32_t>& counts,
                       uint64_t seed) {
  LayerEnv& env = Env();
  const int l = static_cast<int>(o.num_local_experts > 0 ? o.num_local_experts : o.num_experts);
  const int max_m = static_cast<int>(o.max_m), h = static_cast<int>(o.hidden);
  const size_t rows = static_cast<size_t>(l) * max_m;
  std::mt19937_64 rng(seed);
  const ref::MoeLayerData d = LayerData(o, static_cast<int>(rows), /*biases=*/false, rng);
  absl::StatusOr<std::unique_ptr<MoeLayer>> layer = MoeLayer::Create(*env.runtime, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  absl::StatusOr<MoeLayerWorkspace> layout = MoeLayer::WorkspaceLayout(o, 0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const DeviceLayer dev(d);
  DeviceBuffer counts_d = Upload(counts);
  DeviceBuffer out = Upload(std::vector<uint16_t>(rows * h, kSentinel));
  absl::StatusOr<DeviceBuffer> ws = DeviceBuffer::Allocate(env.runtime->driver(), layout->bytes);
  ASSERT_TRUE(ws.ok());
  ASSERT_TRUE(ws->Fill(0xAB).ok());  // poisoned: nothing may rely on a zeroed workspace

  MoeLayerArgs a;
  a.tokens = static_cast<int64_t>(rows);
  dev.Fill(d, /*biases=*/false, &a);
  a.masked_counts = counts_d.get();
  a.out = out.get();
  a.workspace = ws->get();
  a.workspace_bytes = ws->size();
  CUBIST_ASSERT_OK((*layer)->CanImplement(a, 0));
  CUBIST_ASSERT_OK((*layer)->Run(a, env.stream.get()));
  ASSERT_TRUE(env.stream.Synchronize().ok());

  std::vector<int32_t> offsets(1, 0), row_map;
  for (int e = 0; e < l; ++e) {
    const int c = std::clamp(counts[e], 0, max_m);
    for (int i = 0; i < c; ++i) row_map.push_back(e * max_m + i);
    offsets.push_back(offsets.back() + c);
  }
  EXPECT_EQ(Download<int32_t>(*ws, l + 1, layout->offsets), offsets);
  EXPECT_EQ(Download<int32_t>(*ws, row_map.size(), layout->permuted_to_expanded), row_map);

  const std::vector<uint16_t> got = Download<uint16_t>(out, rows * h);
  const std::vector<double> want = ref::MaskedMoeLayerReference(d, counts, max_m);
  std::vector<uint16_t> valid;
  std::vector<double> valid_want;
  int untouched = 0, padded = 0;
  for (size_t r = 0; r < rows; ++r) {
    const auto row = got.begin() + static_cast<ptrdiff_t>(r * h);
    if (std::isnan(want[r * h])) {  // past its expert's count
      ++padded;
      untouched += std::all_of(row, row + h, [](uint16_t v) { return v == kSentinel; });
      continue;
    }
    valid.insert(valid.end(), row, row + h);
    valid_want.insert(valid_want.end(), want.begin() + r * h, want.begin() + (r + 1) * h);
  }
  EXPECT_EQ(untouched, padded) << "padded rows of out were written";
  const ref::Comparison cmp =
      ref::CompareBf16(valid, valid_want, ref::MoeLayerTolerance(o.activation_format));
  EXPECT_TRUE(cmp.ok) << moe::FormatName(o.weight_format) << " x "
                      << moe::FormatName(o.activation_format) << ": " << cmp.summary;
  std::printf("[ masked   ] %s x %s L=%d max_m=%d rows=%d: %s\n",
              moe::FormatName(o.weight_format), moe::FormatName(o.activation_format), l, max_m,
              offsets.back(), cmp.summary.c_str());
}

MoeLayerOptions Masked(DataFormat weights, DataFormat activations) {
  MoeLayerOptions o;
  o.weight_format = weights;
  o.activation_format = activations;
  o.num_experts = 8;
  o.hidden = 256;
  o.intermediate = 128;
  o.activation = Activation::kSwiglu;
  o.input_layout = "expert_major_masked";
  o.max_m = 64;
  return o;
}

// Uneven counts: empty slots, full ones, and counts outside 0..max_m (clamped).
TEST(MoeLayerGpuTest, MaskedMatchesTheReferenceAndLeavesPaddingUntouched) {
  CUBIST_REQUIRE_GPU();
  const std::vector<int32_t> counts = {0, 64, 1, 37, 0, 200, -5, 63};
  const std::pair<DataFormat, DataFormat> pairs[] = {
      {DataFormat::kBf16, DataFormat::kBf16},   {DataFormat::kFp8, DataFormat::kFp8},
      {DataFormat::kFp8Block, DataFormat::kFp8Block}, {DataFormat::kMxfp4, DataFormat::kMxfp8},
      {DataFormat::kNvfp4, DataFormat::kNvfp4},
  };
  uint64_t seed = 900;
  for (const auto& [wf, af] : pairs) {
    SCOPED_TRACE(absl::StrCat(Sv(DataFormatName(wf)), " x ", Sv(DataFormatName(af))));
    RunMaskedAndCheck(Masked(wf, af), counts, seed++);
  }
}

// Expert parallelism (the local experts' weights only) and every count zero: out keeps
// every byte.
TEST(MoeLayerGpuTest, MaskedLocalExpertsAndAllEmpty) {
  CUBIST_REQUIRE_GPU();
  MoeLayerOptions o = Masked(DataFormat::kBf16, DataFormat::kBf16);
  o.num_experts = 32;
  o.local_expert_offset = 8;
  o.num_local_experts = 4;
  o.max_m = 16;
  RunMaskedAndCheck(o, {16, 3, 0, 9}, 950);
  RunMaskedAndCheck(o, {0, 0, 0, 0}, 951);
}

}  // namespace
}  // namespace cubist
