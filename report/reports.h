// The reports behind `cubist fetch|verify|select --json`, shared by the command and the
// Python package (python/), so that both hand out the same data for the same call.
//
// Each Run*Report performs the command's work through the library and returns its
// report as JSON plus the status the command turns into its exit code. Errors that stop
// the work before a report exists (no cache, an unreadable or untrusted manifest, a
// --filter matching nothing, a bad problem) are returned as the StatusOr's error.
#ifndef CUBIST_REPORT_REPORTS_H_
#define CUBIST_REPORT_REPORTS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "artifacts/fetcher.h"
#include "artifacts/store.h"
#include "artifacts/verify.h"
#include "dispatch/problem.h"
#include "dispatch/registry.h"
#include "dispatch/selector.h"
#include "report/trust_spec.h"

namespace cubist::report {

struct CommandReport {
  nlohmann::json json;
  absl::Status status;                // the worst failure inside the report, or OK
  std::vector<std::string> notices;   // for stderr ("the tag moved ...")
};

struct FetchRequest {
  std::string manifest;
  std::string cache;
  int jobs = 16;
  bool offline = false;
  std::vector<std::string> mirrors;
  std::vector<std::string> filters;
  int retries = 4;
  // A transfer under 1 KiB/s for this many seconds is a stall (retried, then the next
  // source).
  int stall_seconds = 20;
  bool no_fsync = false;
  TrustSpec trust;
  // The report's "artifacts" array, one entry per artifact. The command's text output
  // does not use it, and for a set of 13,000 files building and freeing it is a
  // quarter of a warm fetch, so `cubist fetch` without --json leaves it out.
  bool artifact_entries = true;
};

// Called once the work is known, before anything is downloaded (the command starts its
// progress bar there when an artifact is not cached yet). `items` is empty when every
// artifact was found cached: the warm path plans nothing.
using FetchStartHook =
    std::function<void(const Store& store, const std::vector<FetchItem>& items)>;

// `report` (optional) receives the raw report, for the command's text summary. Its
// `results` are left empty when everything was cached and `artifact_entries` is false;
// its counts are always complete.
[[nodiscard]] absl::StatusOr<CommandReport> RunFetchReport(
    const FetchRequest& request, FetchProgress* progress = nullptr,
    const FetchStartHook& on_start = nullptr, FetchReport* report = nullptr);

struct VerifyRequest {
  std::string manifest;
  std::string cache;
  bool deep = false;
  bool offline = false;
  int threads = 0;
  TrustSpec trust;
};

[[nodiscard]] absl::StatusOr<CommandReport> RunVerifyReport(const VerifyRequest& request,
                                                           VerifyReport* report = nullptr);

struct SelectRequest {
  std::string manifest;
  std::string cache;
  MoeProblem problem;
  std::string pin;
  bool explain = false;
  bool offline = false;
  bool allow_inexact = false;
  TrustSpec trust;
};

// A selection made: the registry its candidates point into, the ranking (or why there
// is none) and, with `explain`, every kernel's verdict.
struct Selection {
  explicit Selection(Registry r) : registry(std::move(r)) {}
  Registry registry;
  MoeProblem problem;
  absl::StatusOr<std::vector<Candidate>> ranked;
  std::vector<Verdict> verdicts;
};

[[nodiscard]] absl::StatusOr<std::unique_ptr<Selection>> Select(const SelectRequest& request);

// The report has "kernel": null and "error" when no kernel serves the problem; the
// report's status is then the ranking's error.
CommandReport SelectReport(const Selection& selection, bool explain);

}  // namespace cubist::report

#endif  // CUBIST_REPORT_REPORTS_H_
