// Autotuning: time the cost model's top candidates for a problem on the device and
// keep the fastest. The timing itself is behind CandidateTimer, so the policy (which
// candidates, what counts as a failure, what is recorded) is tested without a GPU;
// runtime.h's device timer measures with CUDA events after warm-up launches, over
// rotating input buffers (so the L2 cache does not flatter small problems), and
// reports the median.
//
// Thread safety: Autotune is reentrant; the timer decides whether it may be shared.
#ifndef CUBIST_DISPATCH_AUTOTUNER_H_
#define CUBIST_DISPATCH_AUTOTUNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dispatch/problem.h"
#include "dispatch/registry.h"
#include "dispatch/selector.h"

namespace cubist {

class CandidateTimer {
 public:
  virtual ~CandidateTimer() = default;
  // The median time of one launch of `kernel` on `problem`, in microseconds.
  [[nodiscard]] virtual absl::StatusOr<double> TimeUs(const KernelEntry& kernel,
                                                      const MoeProblem& problem) = 0;
};

struct AutotuneOptions {
  // How many of the cost model's best candidates to time (all when fewer).
  int top_k = 4;
};

struct TimedCandidate {
  const KernelEntry* kernel = nullptr;
  int model_rank = 0;     // the cost model's rank (1 = best)
  double model_us = 0;    // the cost model's estimate
  double measured_us = 0; // the timer's median; only when `error` is OK
  absl::Status error;     // a candidate that failed to time is skipped, not fatal
};

struct AutotuneResult {
  const KernelEntry* winner = nullptr;
  double winner_us = 0;
  std::vector<TimedCandidate> timings;  // in model-rank order
};

// Times up to `options.top_k` candidates (RankCandidates order) and returns the
// fastest. Errors: RankCandidates' (NotFound, InvalidArgument), and the first
// candidate's error when every candidate failed to time.
[[nodiscard]] absl::StatusOr<AutotuneResult> Autotune(const Registry& registry,
                                                      const MoeProblem& problem,
                                                      CandidateTimer& timer,
                                                      const AutotuneOptions& options = {},
                                                      const SelectOptions& select = {});

// One line per timed candidate: "#2 name: model 12.3 us, measured 10.1 us (winner)".
std::string FormatAutotune(const AutotuneResult& result);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_AUTOTUNER_H_
