#include "artifacts/fetch_policy.h"

#include <algorithm>

namespace cubist {
namespace {

// One row per event. `restart_once`: when the bytes were partly resumed from an
// earlier attempt and this is the first such failure, the old bytes may be the stale
// ones, so the source gets one clean try before it is blamed.
struct Row {
  FetchEvent event;
  FetchAction action;
  absl::StatusCode code;
  bool restart_once;
};

constexpr Row kTable[] = {
    {FetchEvent::kBodyComplete, FetchAction::kVerify, absl::StatusCode::kOk, false},
    {FetchEvent::kNotFound, FetchAction::kNextSource, absl::StatusCode::kNotFound, false},
    {FetchEvent::kServerBusy, FetchAction::kRetry, absl::StatusCode::kUnavailable, false},
    {FetchEvent::kRangeRefused, FetchAction::kRestartRetry, absl::StatusCode::kUnavailable,
     false},
    {FetchEvent::kTransient, FetchAction::kRetry, absl::StatusCode::kUnavailable, false},
    {FetchEvent::kOtherStatus, FetchAction::kNextSource, absl::StatusCode::kUnavailable,
     false},
    {FetchEvent::kFatalTransport, FetchAction::kNextSource, absl::StatusCode::kUnavailable,
     false},
    {FetchEvent::kUntrusted, FetchAction::kNextSource, absl::StatusCode::kPermissionDenied,
     false},
    {FetchEvent::kOversize, FetchAction::kDropNextSource, absl::StatusCode::kDataLoss, false},
    {FetchEvent::kSizeMismatch, FetchAction::kDropNextSource, absl::StatusCode::kDataLoss,
     true},
    {FetchEvent::kHashMismatch, FetchAction::kDropNextSource, absl::StatusCode::kDataLoss,
     true},
    {FetchEvent::kVerified, FetchAction::kPublish, absl::StatusCode::kOk, false},
};

const Row& RowFor(FetchEvent event) {
  for (const Row& r : kTable) {
    if (r.event == event) return r;
  }
  return kTable[0];  // unreachable: every event has a row (fetch_policy_test checks)
}

}  // namespace

std::string_view FetchEventName(FetchEvent event) {
  switch (event) {
    case FetchEvent::kBodyComplete: return "body complete";
    case FetchEvent::kNotFound: return "not found";
    case FetchEvent::kServerBusy: return "server busy";
    case FetchEvent::kRangeRefused: return "range refused";
    case FetchEvent::kTransient: return "transient";
    case FetchEvent::kOtherStatus: return "other status";
    case FetchEvent::kFatalTransport: return "fatal transport";
    case FetchEvent::kUntrusted: return "untrusted";
    case FetchEvent::kOversize: return "oversize";
    case FetchEvent::kSizeMismatch: return "size mismatch";
    case FetchEvent::kHashMismatch: return "hash mismatch";
    case FetchEvent::kVerified: return "verified";
  }
  return "?";
}

std::string_view FetchActionName(FetchAction action) {
  switch (action) {
    case FetchAction::kVerify: return "verify";
    case FetchAction::kRetry: return "retry";
    case FetchAction::kRestartRetry: return "restart and retry";
    case FetchAction::kRestartNow: return "restart now";
    case FetchAction::kNextSource: return "next source";
    case FetchAction::kDropNextSource: return "drop and next source";
    case FetchAction::kPublish: return "publish";
  }
  return "?";
}

FetchEvent ClassifyTransfer(const TransferFacts& f) {
  if (f.oversize) return FetchEvent::kOversize;
  if (f.bad_range) return FetchEvent::kRangeRefused;
  const bool http_error = !f.is_file && (f.http_status < 200 || f.http_status >= 300);
  switch (f.result) {
    case TransportResult::kOk: break;
    case TransportResult::kFileMissing: return FetchEvent::kNotFound;
    case TransportResult::kRangeError:
      // libcurl calls any answer to a resumed request without Content-Range a range
      // error, a 502 from a proxy whose origin is restarting included. That is the
      // HTTP error, not a server without ranges: classify by the status instead.
      if (http_error) break;
      return FetchEvent::kRangeRefused;
    case TransportResult::kTransient: return FetchEvent::kTransient;
    case TransportResult::kFatal: return FetchEvent::kFatalTransport;
    case TransportResult::kUntrusted: return FetchEvent::kUntrusted;
  }
  if (!http_error) return FetchEvent::kBodyComplete;
  const long code = f.http_status;
  if (code == 404 || code == 410) return FetchEvent::kNotFound;
  if (code == 408 || code == 429 || code >= 500) return FetchEvent::kServerBusy;
  if (code == 416) return FetchEvent::kRangeRefused;
  return FetchEvent::kOtherStatus;
}

absl::Duration BackoffDelay(int failed_attempts, const RetryPolicy& policy,
                            std::optional<absl::Duration> retry_after, double jitter) {
  if (retry_after.has_value()) return std::min(*retry_after, policy.retry_after_max);
  const absl::Duration cap =
      std::min(policy.backoff_base * (1 << std::clamp(failed_attempts - 1, 0, 16)),
               policy.backoff_max);
  return cap * (0.5 + 0.5 * std::clamp(jitter, 0.0, 1.0));
}

FetchDecision Decide(FetchEvent event, const AttemptState& state, const RetryPolicy& policy,
                     std::optional<absl::Duration> retry_after, double jitter) {
  const Row& row = RowFor(event);
  FetchDecision d;
  d.action = row.action;
  d.code = row.code;
  if (row.restart_once && state.resumed && !state.restarted) {
    d.action = FetchAction::kRestartNow;
    d.restart_once = true;
    return d;
  }
  if (d.action == FetchAction::kRetry || d.action == FetchAction::kRestartRetry) {
    const int failed = state.failed_attempts + 1;
    if (failed >= policy.attempts_per_source) {
      // A refused range still drops the bytes: the next source starts from byte 0.
      d.action = row.action == FetchAction::kRestartRetry ? FetchAction::kDropNextSource
                                                          : FetchAction::kNextSource;
      d.attempts_exhausted = true;
      return d;
    }
    // A range refusal is not the server being busy: its Retry-After does not apply.
    d.delay = BackoffDelay(failed, policy,
                           event == FetchEvent::kServerBusy ? retry_after : std::nullopt,
                           jitter);
  }
  return d;
}

}  // namespace cubist
