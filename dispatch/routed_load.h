// How a router's rows spread over the experts: the load the cost model prices a MoE
// layer's GEMMs for, and the offsets the timing harness times them on.
//
// Uniform top-k routing: each of n tokens picks k distinct experts of R uniformly at
// random, so each expert's row count is X ~ Binomial(n, k / R) (the experts' counts are
// dependent, each one's is exactly that). A kernel of tile_m rows runs ceil(X / tile_m)
// tiles for it: with balanced offsets (X = n k / R exactly) an expert of 128 rows fills
// one 128-row tile, but routed, about half the experts get 129 or more and run a second,
// nearly empty tile - 1.5x the tiles the balanced count says (gpt-oss-120b at 4,096
// tokens: 128 rows per expert on average, 11 of spread).
//
// E <= R: a rank of expert parallelism serves E of the R experts (each such expert's
// count has the same law); R = E without it.
//
// Pure functions; thread-safe.
#ifndef CUBIST_DISPATCH_ROUTED_LOAD_H_
#define CUBIST_DISPATCH_ROUTED_LOAD_H_

#include <cstdint>
#include <vector>

namespace cubist {

struct RoutedLoad {
  int64_t tokens = 0;          // n >= 0
  int64_t top_k = 1;           // k, 1 <= k <= R
  int64_t routed_experts = 1;  // R

  // k / R: the chance that a token picks a given expert.
  double PerExpertChance() const {
    return static_cast<double>(top_k) / static_cast<double>(routed_experts);
  }
  // E[X] = n k / R.
  double MeanRowsPerExpert() const { return static_cast<double>(tokens) * PerExpertChance(); }
  // P(X >= 1) = 1 - (1 - k/R)^n: the chance that an expert has rows at all.
  double TouchedChance() const;
  // E[ceil(X / tile_m)], tile_m >= 1: the tiles one expert runs, in expectation. Exact to
  // about 1e-12 relative (the binomial's terms are summed outward from its mode until
  // they vanish, so the work is about 40 standard deviations of X, not n).
  double ExpectedTilesPerExpert(int64_t tile_m) const;
};

// The offsets [experts + 1] of one draw of this routing, reproducible: the same
// arguments give the same offsets on every machine (a fixed generator, no std::
// distribution). Each token picks top_k distinct experts of routed_experts; the counts
// of experts 0..experts-1 (experts <= routed_experts) become the prefix sums, so
// offsets[experts] <= tokens x top_k (equal when experts == routed_experts).
std::vector<int32_t> SampleRoutedOffsets(const RoutedLoad& load, int64_t experts,
                                         uint64_t seed);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_ROUTED_LOAD_H_
