#include "dispatch/autotuner.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"

namespace cubist {

absl::StatusOr<AutotuneResult> Autotune(const Registry& registry, const MoeProblem& problem,
                                        CandidateTimer& timer,
                                        const AutotuneOptions& options,
                                        const SelectOptions& select) {
  CUBIST_ASSIGN_OR_RETURN(std::vector<Candidate> ranked,
                          RankCandidates(registry, problem, select));
  AutotuneResult result;
  const size_t n = std::min<size_t>(ranked.size(), std::max(1, options.top_k));
  for (size_t i = 0; i < n; ++i) {
    TimedCandidate t;
    t.kernel = ranked[i].kernel;
    t.model_rank = ranked[i].rank;
    t.model_us = ranked[i].cost.time_us;
    absl::StatusOr<double> us = timer.TimeUs(*t.kernel, problem);
    if (us.ok()) {
      t.measured_us = *us;
      // Strictly faster wins: on a tie the model's preference stands.
      if (result.winner == nullptr || *us < result.winner_us) {
        result.winner = t.kernel;
        result.winner_us = *us;
      }
    } else {
      t.error = Annotate(us.status(), absl::StrCat("time ", t.kernel->name()));
    }
    result.timings.push_back(std::move(t));
  }
  if (result.winner == nullptr) {
    return Annotate(result.timings.front().error,
                    absl::StrCat("autotune ", ToString(problem), ": no candidate could be "
                                 "timed"));
  }
  return result;
}

std::string FormatAutotune(const AutotuneResult& result) {
  std::string out;
  for (const TimedCandidate& t : result.timings) {
    if (t.error.ok()) {
      absl::StrAppendFormat(&out, "#%d %s: model %.1f us, measured %.1f us%s\n",
                            t.model_rank, t.kernel->name(), t.model_us, t.measured_us,
                            t.kernel == result.winner ? " (winner)" : "");
    } else {
      absl::StrAppendFormat(&out, "#%d %s: model %.1f us, failed: %s\n", t.model_rank,
                            t.kernel->name(), t.model_us, std::string(t.error.message()));
    }
  }
  return out;
}

}  // namespace cubist
