#include "dispatch/routed_load.h"

#include <algorithm>
#include <cmath>

namespace cubist {
namespace {

// Terms of the binomial below this fraction of its largest one are left out: beyond
// about 9 standard deviations either side, where they add nothing a double keeps.
constexpr double kNegligible = 1e-18;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// splitmix64: a fixed, portable sequence (std::mt19937 is too, but the std::
// distributions on top of it differ between standard libraries).
uint64_t Next(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

double RoutedLoad::TouchedChance() const {
  if (tokens <= 0) return 0.0;
  const double p = PerExpertChance();
  if (p >= 1.0) return 1.0;
  return -std::expm1(static_cast<double>(tokens) * std::log1p(-p));
}

double RoutedLoad::ExpectedTilesPerExpert(int64_t tile_m) const {
  if (tokens <= 0 || tile_m <= 0) return 0.0;
  const double p = PerExpertChance();
  if (p >= 1.0) return static_cast<double>(CeilDiv(tokens, tile_m));
  const double n = static_cast<double>(tokens);
  // The mode, and its probability in logs (the probabilities themselves underflow for
  // large n: (1 - p)^n with n = 65,536 and p = 1/16 is e^-4230).
  const int64_t mode = std::clamp<int64_t>(static_cast<int64_t>((n + 1) * p), 0, tokens);
  const double md = static_cast<double>(mode);
  const double log_mode = std::lgamma(n + 1) - std::lgamma(md + 1) - std::lgamma(n - md + 1) +
                          md * std::log(p) + (n - md) * std::log1p(-p);
  const double ratio = p / (1 - p);
  // Sums of pmf(x) x ceil(x / tile_m) and of pmf(x) outward from the mode; the second
  // divides the first, absorbing lgamma's rounding of pmf(mode).
  double tiles = 0, mass = 0;
  const double top = std::exp(log_mode);
  double term = top;
  for (int64_t x = mode;;) {  // pmf(x + 1) = pmf(x) (n - x) / (x + 1) p/(1-p)
    tiles += term * static_cast<double>(CeilDiv(x, tile_m));
    mass += term;
    if (x == tokens) break;
    term *= (n - static_cast<double>(x)) / static_cast<double>(x + 1) * ratio;
    ++x;
    if (term < kNegligible * top) break;
  }
  term = top;
  for (int64_t x = mode; x > 0;) {  // pmf(x - 1) = pmf(x) x / (n - x + 1) (1-p)/p
    term *= static_cast<double>(x) / (n - static_cast<double>(x) + 1) / ratio;
    --x;
    if (term < kNegligible * top) break;
    tiles += term * static_cast<double>(CeilDiv(x, tile_m));
    mass += term;
  }
  return mass > 0 ? tiles / mass : 0.0;
}

std::vector<int32_t> SampleRoutedOffsets(const RoutedLoad& load, int64_t experts,
                                         uint64_t seed) {
  const int64_t r = std::max<int64_t>(load.routed_experts, 1);
  const int64_t k = std::clamp<int64_t>(load.top_k, 1, r);
  experts = std::clamp<int64_t>(experts, 0, r);
  std::vector<int64_t> counts(static_cast<size_t>(experts), 0);
  // Floyd's sampling of k distinct experts per token; chosen[e] == t + 1 marks expert e
  // as taken by token t, so no per-token clearing is needed.
  std::vector<int64_t> chosen(static_cast<size_t>(r), 0);
  uint64_t state = seed;
  for (int64_t t = 0; t < load.tokens; ++t) {
    for (int64_t j = r - k; j < r; ++j) {
      int64_t e = static_cast<int64_t>(Next(state) % static_cast<uint64_t>(j + 1));
      if (chosen[e] == t + 1) e = j;
      chosen[e] = t + 1;
      if (e < experts) ++counts[e];
    }
  }
  std::vector<int32_t> offsets(static_cast<size_t>(experts) + 1, 0);
  for (int64_t e = 0; e < experts; ++e) {
    offsets[e + 1] = static_cast<int32_t>(offsets[e] + counts[e]);
  }
  return offsets;
}

}  // namespace cubist
