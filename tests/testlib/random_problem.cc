#include "tests/testlib/random_problem.h"

#include <cmath>
#include <random>

namespace cubist::testing {

using moe::kFp8;
using moe::kFp8Block;
using moe::kNvfp4;
using reference::Quantize;

std::vector<int> RaggedCounts(int num_experts, uint64_t seed) {
  static constexpr int kPattern[] = {0, 1, 65, 0, 128, 7, 200, 63, 129, 64, 3, 127};
  constexpr int kLen = sizeof(kPattern) / sizeof(kPattern[0]);
  std::vector<int> c(num_experts);
  for (int e = 0; e < num_experts; ++e) c[e] = kPattern[(e + seed) % kLen];
  return c;
}

reference::MoeProblemData MakeRandomProblem(const MoeProblemShape& shape, uint64_t seed) {
  reference::MoeProblemData p;
  p.weight_format = shape.weight_format;
  p.activation_format = shape.activation_format;
  p.num_experts = static_cast<int>(shape.tokens_per_expert.size());
  p.n = shape.n;
  p.k = shape.k;
  p.offsets.push_back(0);
  for (int c : shape.tokens_per_expert) p.offsets.push_back(p.offsets.back() + c);
  p.num_tokens = p.offsets.back();

  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(0.5f, 2.0f);
  // Magnitudes vary by row and by 32-column band so that block scales differ.
  auto make = [&](int64_t rows, int k, float base) {
    std::vector<float> band(k / 32 + 1), x(static_cast<size_t>(rows) * k);
    for (float& b : band) b = std::ldexp(uni(rng), static_cast<int>(rng() % 5) - 2);
    for (int64_t r = 0; r < rows; ++r) {
      const float rm = base * std::ldexp(uni(rng), static_cast<int>(rng() % 3) - 1);
      for (int c = 0; c < k; ++c) x[r * k + c] = normal(rng) * rm * band[c / 32];
    }
    return x;
  };
  float g = 1;
  Quantize(p.activation_format, make(p.num_tokens, p.k, 1.0f), p.num_tokens, p.k, false,
           &p.a, &p.a_scale, &g);
  if (p.activation_format == kFp8 || p.activation_format == kNvfp4) p.a_global_scale = {g};
  const float wbase = 1.0f / std::sqrt(static_cast<float>(p.k)) / 4.0f;
  const bool per_expert = p.weight_format == kFp8 || p.weight_format == kNvfp4 ||
                          p.weight_format == kFp8Block;
  if (per_expert) {
    for (int e = 0; e < p.num_experts; ++e) {
      std::vector<uint8_t> d, s;
      Quantize(p.weight_format, make(p.n, p.k, wbase), p.n, p.k, true, &d, &s, &g);
      p.b.insert(p.b.end(), d.begin(), d.end());
      p.b_scale.insert(p.b_scale.end(), s.begin(), s.end());
      if (p.weight_format != kFp8Block) p.b_global_scale.push_back(g);
    }
  } else {
    const int64_t rows = static_cast<int64_t>(p.num_experts) * p.n;
    Quantize(p.weight_format, make(rows, p.k, wbase), static_cast<int>(rows), p.k, false,
             &p.b, &p.b_scale, &g);
  }
  std::uniform_real_distribution<float> ab(0.5f, 2.0f), lim(0.5f, 3.0f);
  for (int e = 0; e < p.num_experts; ++e) {
    if (shape.with_alpha) p.alpha.push_back(ab(rng));
    if (shape.with_beta) p.beta.push_back(ab(rng));
    if (shape.with_limit) p.limit.push_back(lim(rng));
  }
  return p;
}

}  // namespace cubist::testing
