// Random MoE GEMM problems for tests: operands drawn from a seed and quantized with the
// product's quantizers (dispatch/reference.h), in exactly the bytes a kernel reads.
#ifndef CUBIST_TESTS_TESTLIB_RANDOM_PROBLEM_H_
#define CUBIST_TESTS_TESTLIB_RANDOM_PROBLEM_H_

#include <cstdint>
#include <vector>

#include "dispatch/reference.h"

namespace cubist::testing {

struct MoeProblemShape {
  moe::MoeFormat weight_format = moe::kBf16;
  moe::MoeFormat activation_format = moe::kBf16;
  int n = 0;
  int k = 0;
  std::vector<int> tokens_per_expert;  // E entries; zeros allowed
  bool with_alpha = false, with_beta = false, with_limit = false;
};

// Draws A and B from N(0, 1) (B scaled by 1/sqrt(K) so C stays O(1)), with a different
// magnitude per row and per 32-column band so that block scales differ, and quantizes
// them. alpha/beta/limit, when asked for, are drawn per expert in ranges where every
// activation stays finite (alpha, beta in [0.5, 2], limit in [0.5, 3]).
reference::MoeProblemData MakeRandomProblem(const MoeProblemShape& shape, uint64_t seed);

// Deterministic tokens-per-expert list for E experts, cycling (from an offset chosen by
// `seed`) through 0, 1, 65, 0, 128, 7, 200, 63, 129, 64, 3, 127: empty experts, counts
// just under, at and over multiples of 64 and 128.
std::vector<int> RaggedCounts(int num_experts, uint64_t seed);

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_RANDOM_PROBLEM_H_
