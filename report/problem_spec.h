// One MoE GEMM problem as a user writes it - format and activation names, counts - for
// `cubist select|run|tune` and the Python package's select, turned into a MoeProblem in
// one place so that both front ends accept and refuse the same things.
#ifndef CUBIST_REPORT_PROBLEM_SPEC_H_
#define CUBIST_REPORT_PROBLEM_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "dispatch/problem.h"

namespace cubist::report {

struct ProblemSpec {
  std::string op = "moe_gemm";  // --op, offered by select only (run and tune launch moe_gemm)
  std::string output_format;    // --output-format, select only; empty: any
  std::string weights;
  std::string activations;
  std::string activation = "identity";
  int64_t experts = 0;
  int64_t tokens_per_expert = -1;  // exactly one of this and `tokens` is given (>= 0)
  int64_t tokens = -1;
  int64_t n = 0;
  int64_t k = 0;
  std::string sm;  // empty: the device's (run, tune)
  int sm_count = 0;
  // --routed-top-k / --routed-experts: the rows come from a top-k router
  // (MoeProblem::routed_top_k); 0: spread evenly.
  int64_t routed_top_k = 0;
  int64_t routed_experts = 0;

  // Errors are InvalidArgument naming the flag (--weights, ...); a command exits with
  // its usage code on them.
  [[nodiscard]] absl::StatusOr<MoeProblem> ToProblem() const;
};

}  // namespace cubist::report

#endif  // CUBIST_REPORT_PROBLEM_SPEC_H_
