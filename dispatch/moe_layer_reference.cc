#include "dispatch/moe_layer_reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <thread>

#include "dispatch/moe_quantize_reference.h"
#include "dispatch/reference.h"

namespace cubist::reference {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Whether score a (expert i) ranks above score b (expert j): numbers above NaN, larger
// first, equal values to the lower index.
bool RanksAbove(float a, int i, float b, int j) {
  const bool an = std::isnan(a), bn = std::isnan(b);
  if (an != bn) return bn;
  if (!an && a != b) return a > b;
  return i < j;
}

// The k best of `score` among `allowed` (all when empty), best first.
std::vector<int> TopK(const float* score, int n, int k, const std::vector<bool>& allowed) {
  std::vector<int> cand;
  for (int i = 0; i < n; ++i) {
    if (allowed.empty() || allowed[i]) cand.push_back(i);
  }
  std::sort(cand.begin(), cand.end(),
            [&](int i, int j) { return RanksAbove(score[i], i, score[j], j); });
  cand.resize(std::min<size_t>(cand.size(), static_cast<size_t>(k)));
  return cand;
}

// A NaN logit counts as -inf in every sum, maximum and weight.
float Clean(float x) { return std::isnan(x) ? kNegInf : x; }
float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-Clean(x))); }

// exp(x_i - m) / sum over `set` of exp(x_j - m), for each i in `of`; all 0 when every
// term is 0 (every logit -inf or NaN).
std::vector<float> Softmax(const float* x, const std::vector<int>& set,
                           const std::vector<int>& of) {
  float m = kNegInf;
  for (int i : set) m = std::max(m, Clean(x[i]));
  std::vector<float> out(of.size(), 0.0f);
  if (m == kNegInf) return out;
  float sum = 0;
  for (int i : set) sum += std::exp(Clean(x[i]) - m);
  for (size_t s = 0; s < of.size(); ++s) out[s] = std::exp(Clean(x[of[s]]) - m) / sum;
  return out;
}

// w_i / sum of w over the set, or 0 when the sum is 0.
void Normalize(std::vector<float>* w, float epsilon = 0.0f) {
  float sum = 0;
  for (float v : *w) sum += v;
  sum += epsilon;
  for (float& v : *w) v = sum == 0 ? 0.0f : v / sum;
}

std::vector<int> DeepSeekV3Select(const RoutingConfig& c, const float* s) {
  const int groups = c.n_group, size = c.num_experts / c.n_group;
  std::vector<float> group_score(groups);
  for (int g = 0; g < groups; ++g) {
    const std::vector<int> best = TopK(s + g * size, size, 2, {});
    float sum = 0;
    for (int i : best) sum += s[g * size + i];
    group_score[g] = sum;
  }
  const std::vector<int> kept = TopK(group_score.data(), groups, c.topk_group, {});
  std::vector<bool> allowed(c.num_experts, false);
  for (int g : kept) {
    for (int i = 0; i < size; ++i) allowed[g * size + i] = true;
  }
  return TopK(s, c.num_experts, c.top_k, allowed);
}

// A bf16 x bf16 GEMM over `rows` rows grouped by `offsets`: weights copied in, the
// activations zeroed for the caller to fill.
// Bytes of one expert's [n, k] weights in `f`: elements, block scales.
size_t ExpertElementBytes(moe::MoeFormat f, int n, int k) {
  return static_cast<size_t>(moe::MoeElementBytes(f, int64_t{n} * k));
}
size_t ExpertScaleBytes(moe::MoeFormat f, int n, int k) {
  return static_cast<size_t>(
      moe::MoeScaleBytes(f, f == moe::kFp8Block ? (n + 127) / 128 : n, k));
}

// Appends expert e's slice of `all` (per-expert slices of `per` bytes) to `out`.
void AppendSlice(const uint8_t* all, size_t per, int e, std::vector<uint8_t>* out) {
  out->insert(out->end(), all + per * e, all + per * (e + 1));
}

// One of the layer's GEMMs on `rows` rows of bf16 input `a` (bit patterns, [rows, k]):
// the input quantized as the layer's kernels quantize it, the weights as given. Only the
// experts that own rows take part (`offsets` [L + 1]): a check of a few tokens at a real
// model's size reads a few experts' weights, not all of them.
MoeProblemData LayerGemm(const MoeLayerData& layer, const std::vector<int32_t>& offsets,
                         int rows, int n, int k, const std::vector<uint16_t>& a, bool second) {
  MoeProblemData g;
  g.weight_format = layer.weight_format;
  g.activation_format = layer.activation_format;
  g.num_tokens = rows;
  g.n = n;
  g.k = k;
  std::vector<int> used;
  g.offsets.push_back(0);
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    if (offsets[e + 1] == offsets[e]) continue;
    used.push_back(static_cast<int>(e));
    g.offsets.push_back(offsets[e + 1]);
  }
  g.num_experts = static_cast<int>(used.size());
  if (layer.activation_format == moe::kBf16) {
    g.a.resize(a.size() * 2);
    std::copy_n(reinterpret_cast<const uint8_t*>(a.data()), g.a.size(), g.a.data());
  } else {
    QuantizedRows q = QuantizeActivations(layer.activation_format, a, rows, k,
                                          second ? layer.intermediate_scale : layer.input_scale);
    g.a = std::move(q.data);
    g.a_scale = std::move(q.scale);
    if (moe::FormatHasGlobalScale(layer.activation_format)) g.a_global_scale = {q.global};
  }
  const moe::MoeFormat wf = layer.weight_format;
  const bool bf16 = wf == moe::kBf16;
  const uint8_t* w = bf16 ? reinterpret_cast<const uint8_t*>((second ? layer.w2 : layer.w1).data())
                          : (second ? layer.w2q : layer.w1q).data();
  const std::vector<uint8_t>& scale = second ? layer.w2_scale : layer.w1_scale;
  const std::vector<float>& global = second ? layer.w2_global : layer.w1_global;
  const std::vector<float>& bias = second ? layer.w2_bias : layer.w1_bias;
  for (int e : used) {
    if (!bias.empty()) {
      const auto row = bias.begin() + static_cast<ptrdiff_t>(e) * n;
      g.bias.insert(g.bias.end(), row, row + n);
    }
    AppendSlice(w, ExpertElementBytes(wf, n, k), e, &g.b);
    if (!scale.empty()) AppendSlice(scale.data(), ExpertScaleBytes(wf, n, k), e, &g.b_scale);
    if (!global.empty()) g.b_global_scale.push_back(global[e]);
  }
  return g;
}

// The per-expert activation parameters of the experts LayerGemm kept.
std::vector<float> CompactParams(const std::vector<float>& v, const std::vector<int32_t>& offsets) {
  if (v.empty()) return v;
  std::vector<float> out;
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    if (offsets[e + 1] != offsets[e]) out.push_back(v[e]);
  }
  return out;
}

}  // namespace

Routing Route(const RoutingConfig& c, const std::vector<float>& logits,
              const std::vector<float>& bias, int tokens) {
  Routing r;
  r.tokens = tokens;
  r.top_k = c.top_k;
  r.ids.assign(static_cast<size_t>(tokens) * c.top_k, 0);
  r.weights.assign(r.ids.size(), 0.0f);
  const int e = c.num_experts;
  std::vector<int> all(e);
  std::iota(all.begin(), all.end(), 0);
  for (int t = 0; t < tokens; ++t) {
    const float* x = logits.data() + static_cast<size_t>(t) * e;
    std::vector<int> ids;
    std::vector<float> w;
    if (c.method == moe::kRouteDeepSeekV3) {
      std::vector<float> s(e);
      for (int i = 0; i < e; ++i) s[i] = Sigmoid(x[i]) + (bias.empty() ? 0.0f : bias[i]);
      // A NaN logit's biased score stays NaN, so it ranks last as in every method.
      for (int i = 0; i < e; ++i) {
        if (std::isnan(x[i])) s[i] = std::numeric_limits<float>::quiet_NaN();
      }
      ids = DeepSeekV3Select(c, s.data());
      for (int i : ids) w.push_back(Sigmoid(x[i]));
      Normalize(&w, 1e-20f);
      for (float& v : w) v *= c.routed_scaling_factor;
    } else {
      ids = TopK(x, e, c.method == moe::kRouteLlama4 ? 1 : c.top_k, {});
      switch (c.method) {
        case moe::kRouteDefault: w = Softmax(x, all, ids); break;
        case moe::kRouteRenormalize: w = Softmax(x, ids, ids); break;
        case moe::kRouteRenormalizeNaive:
          w = Softmax(x, all, ids);
          Normalize(&w);
          break;
        case moe::kRouteTopK:
          for (int i : ids) w.push_back(std::isnan(x[i]) ? 0.0f : x[i]);
          break;
        case moe::kRouteLlama4:
        case moe::kRouteSigmoid:
          for (int i : ids) w.push_back(Sigmoid(x[i]));
          break;
        case moe::kRouteSigmoidRenorm:
          for (int i : ids) w.push_back(Sigmoid(x[i]));
          Normalize(&w);
          break;
        case moe::kRouteDeepSeekV3: break;  // above
      }
    }
    for (size_t j = 0; j < ids.size(); ++j) {
      r.ids[static_cast<size_t>(t) * c.top_k + j] = ids[j];
      r.weights[static_cast<size_t>(t) * c.top_k + j] = w[j];
    }
  }
  return r;
}

SlotSort SortSlots(const std::vector<int32_t>& ids, int num_experts, int local_expert_offset,
                   int num_local_experts) {
  SlotSort s;
  const int l = num_local_experts;
  std::vector<int32_t> count(l, 0);
  s.expanded_to_permuted.assign(ids.size(), -1);
  for (int32_t id : ids) {
    if (id < 0 || id >= num_experts) {
      ++s.dropped;
    } else if (id - local_expert_offset >= 0 && id - local_expert_offset < l) {
      ++count[id - local_expert_offset];
    }
  }
  s.offsets.assign(l + 1, 0);
  for (int e = 0; e < l; ++e) s.offsets[e + 1] = s.offsets[e] + count[e];
  s.permuted_to_expanded.assign(s.offsets[l], 0);
  std::vector<int32_t> next(s.offsets.begin(), s.offsets.end() - 1);
  for (size_t slot = 0; slot < ids.size(); ++slot) {
    const int64_t local = static_cast<int64_t>(ids[slot]) - local_expert_offset;
    if (ids[slot] < 0 || ids[slot] >= num_experts || local < 0 || local >= l) continue;
    const int32_t row = next[local]++;
    s.expanded_to_permuted[slot] = row;
    s.permuted_to_expanded[row] = static_cast<int32_t>(slot);
  }
  return s;
}

std::vector<int> SlotOrder(const Routing& routing, int token) {
  const int k = routing.top_k;
  std::vector<int> order(k);
  std::iota(order.begin(), order.end(), 0);
  const float* w = routing.weights.data() + static_cast<size_t>(token) * k;
  const int32_t* id = routing.ids.data() + static_cast<size_t>(token) * k;
  // NaN weights order below every number; -0 equals +0; equal weights by id, then slot.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const bool na = std::isnan(w[a]), nb = std::isnan(w[b]);
    if (na != nb) return nb;
    if (!na && w[a] != w[b]) return w[a] > w[b];
    return id[a] < id[b];
  });
  return order;
}

namespace {

// GEMM2's output in double (before its bf16 rounding) for the rows `a` [rows, H] (bf16)
// grouped by local expert as `offsets` [L + 1] says: Q(bf16(act(Q(a) W1^T))) W2^T (+ w2_bias).
std::vector<double> ExpertRows(const MoeLayerData& layer, const std::vector<int32_t>& offsets,
                               const std::vector<uint16_t>& a) {
  const int h = layer.hidden, inter = layer.intermediate;
  const int n1 = moe::IsGated(layer.activation) ? 2 * inter : inter;
  const int rows = offsets.back();
  MoeProblemData g1 = LayerGemm(layer, offsets, rows, n1, h, a, /*second=*/false);
  g1.alpha = CompactParams(layer.alpha, offsets);
  g1.beta = CompactParams(layer.beta, offsets);
  g1.limit = CompactParams(layer.limit, offsets);
  const std::vector<double> act =
      ApplyActivation(g1, ReferenceGemm(g1), layer.activation);  // [rows, I]

  std::vector<uint16_t> a2(act.size());
  for (size_t i = 0; i < act.size(); ++i) a2[i] = FloatToBf16(static_cast<float>(act[i]));
  const MoeProblemData g2 = LayerGemm(layer, offsets, rows, h, inter, a2, /*second=*/true);
  return ApplyActivation(g2, ReferenceGemm(g2), moe::kIdentity);  // [rows, H], + w2_bias
}

}  // namespace

std::vector<double> MoeLayerReference(const MoeLayerData& layer, const Routing& routing,
                                      const std::vector<uint16_t>& accumulate_into) {
  const int t_count = layer.tokens, h = layer.hidden, k = routing.top_k;
  const int l = layer.num_local_experts;
  const SlotSort sort = SortSlots(routing.ids, layer.num_experts, layer.local_expert_offset, l);
  const int rows = sort.offsets[l];

  // GEMM1 on the gathered rows, as the moe_gemm reference computes it.
  std::vector<uint16_t> a(static_cast<size_t>(rows) * h);
  for (int r = 0; r < rows; ++r) {
    const int slot = sort.permuted_to_expanded[r];
    const uint16_t* x = layer.x.data() + static_cast<size_t>(slot / k) * h;
    for (int i = 0; i < h; ++i) {
      a[static_cast<size_t>(r) * h + i] =
          layer.apply_weight_on_input
              ? FloatToBf16(Bf16ToFloat(x[i]) * routing.weights[slot])
              : x[i];
    }
  }
  const std::vector<double> y = ExpertRows(layer, sort.offsets, a);  // [rows, H]

  std::vector<double> out(static_cast<size_t>(t_count) * h, 0.0);
  for (int t = 0; t < t_count; ++t) {
    double* o = out.data() + static_cast<size_t>(t) * h;
    if (!accumulate_into.empty()) {
      for (int i = 0; i < h; ++i) o[i] = Bf16ToFloat(accumulate_into[static_cast<size_t>(t) * h + i]);
    }
    for (int j : SlotOrder(routing, t)) {
      const int slot = t * k + j;
      const int row = sort.expanded_to_permuted[slot];
      if (row < 0) continue;
      const double w = layer.apply_weight_on_input ? 1.0 : routing.weights[slot];
      for (int i = 0; i < h; ++i) {
        o[i] += w * Bf16ToFloat(FloatToBf16(static_cast<float>(y[static_cast<size_t>(row) * h + i])));
      }
    }
  }
  return out;
}

std::vector<double> MaskedMoeLayerReference(const MoeLayerData& layer,
                                            const std::vector<int32_t>& counts, int max_m) {
  const int h = layer.hidden, l = layer.num_local_experts;
  std::vector<int32_t> offsets(1, 0);
  std::vector<uint16_t> a;
  for (int e = 0; e < l; ++e) {
    const int c = std::clamp(counts[e], 0, max_m);
    const auto row0 = layer.x.begin() + static_cast<ptrdiff_t>(e) * max_m * h;
    a.insert(a.end(), row0, row0 + static_cast<ptrdiff_t>(c) * h);
    offsets.push_back(offsets.back() + c);
  }
  const std::vector<double> y =
      offsets.back() > 0 ? ExpertRows(layer, offsets, a) : std::vector<double>{};
  std::vector<double> out(static_cast<size_t>(l) * max_m * h,
                          std::numeric_limits<double>::quiet_NaN());
  for (int e = 0; e < l; ++e) {
    for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
      const size_t to = (static_cast<size_t>(e) * max_m + (r - offsets[e])) * h;
      for (int i = 0; i < h; ++i) out[to + i] = y[static_cast<size_t>(r) * h + i];
    }
  }
  return out;
}

namespace {

void QuantizePerExpert(moe::MoeFormat format, const std::vector<uint16_t>& w, int experts, int n,
                       int k, std::vector<uint8_t>* data, std::vector<uint8_t>* scale,
                       std::vector<float>* global) {
  // Experts are independent: quantized on all cores (a real model's experts take about a
  // second each on one), then concatenated in expert order.
  const size_t per = static_cast<size_t>(n) * k;
  std::vector<std::vector<uint8_t>> d(experts), sc(experts);
  std::vector<float> g(experts, 1.0f);
  std::atomic<int> next{0};
  auto work = [&] {
    std::vector<float> x(per);
    for (int e = next++; e < experts; e = next++) {
      for (size_t i = 0; i < per; ++i) x[i] = Bf16ToFloat(w[e * per + i]);
      Quantize(format, x, n, k, /*square_blocks=*/true, &d[e], &sc[e], &g[e]);
    }
  };
  const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1,
                                 std::min(experts, 64));
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  data->clear();
  scale->clear();
  for (int e = 0; e < experts; ++e) {
    data->insert(data->end(), d[e].begin(), d[e].end());
    scale->insert(scale->end(), sc[e].begin(), sc[e].end());
  }
  *global = moe::FormatHasGlobalScale(format) ? g : std::vector<float>{};
}

}  // namespace

void QuantizeLayerWeights(MoeLayerData* layer) {
  if (layer->weight_format == moe::kBf16) return;
  const int l = layer->num_local_experts, h = layer->hidden, inter = layer->intermediate;
  const int n1 = moe::IsGated(layer->activation) ? 2 * inter : inter;
  QuantizePerExpert(layer->weight_format, layer->w1, l, n1, h, &layer->w1q, &layer->w1_scale,
                    &layer->w1_global);
  QuantizePerExpert(layer->weight_format, layer->w2, l, h, inter, &layer->w2q, &layer->w2_scale,
                    &layer->w2_global);
}

Tolerance MoeLayerTolerance(moe::MoeFormat activation_format) {
  Tolerance t;
  const bool quantized = activation_format != moe::kBf16;
  t.rel_fro = quantized ? 1.5e-2 : 5e-3;  // measured on the H200: at most 7.8e-3 and 1.7e-3
  t.rtol = quantized ? 0.15 : 3e-2;
  t.atol_rel = quantized ? 4e-2 : 1e-2;
  return t;
}

float ActivationScaleFor(moe::MoeFormat format, float amax) {
  if (amax <= 0) amax = 1.0f;
  if (format == moe::kFp8) return amax / 448.0f;
  if (format == moe::kNvfp4) return 448.0f * 6.0f / amax;
  return 1.0f;
}

}  // namespace cubist::reference
