// The fetch policy: what to do after each transfer of an artifact, as one table.
//
// The fetch core has three parts (docs/architecture.md, "The fetch core"):
//   - a Transport moves bytes (curl_transport.h; the fetcher's event loop drives
//     libcurl's multi interface with the same option builder);
//   - a Clock says what time it is and sleeps (clock.h), so that backoff is testable;
//   - this policy, a pure function from events to actions. It knows nothing of sockets,
//     files or time sources: the caller classifies what happened (ClassifyTransfer),
//     asks Decide, and carries the action out. Every retry, resume and backoff rule of
//     the fetcher and of manifest reads is here, and tests/artifacts/fetch_policy_test.cc checks
//     them in microseconds.
//
// Thread safety: everything here is a pure function of its arguments.
#ifndef CUBIST_ARTIFACTS_FETCH_POLICY_H_
#define CUBIST_ARTIFACTS_FETCH_POLICY_H_

#include <optional>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace cubist {

// How a transfer ended at the transport level, before any HTTP status is looked at.
enum class TransportResult {
  kOk,           // the transfer completed (any HTTP status)
  kFileMissing,  // a file:// source that does not exist
  kRangeError,   // the server would not resume where we asked
  kTransient,    // connect failure, timeout, reset, short body: may work if tried again
  kUntrusted,    // TLS: the server's certificate is not trusted (unknown CA, wrong host)
  kFatal,        // anything else (unsupported protocol, malformed URL, ...)
};

// What one finished transfer of an artifact was, for the policy.
struct TransferFacts {
  TransportResult result = TransportResult::kOk;
  bool is_file = false;       // a file:// source: no HTTP status
  long http_status = 0;
  bool oversize = false;      // more bytes than the declared size arrived
  bool bad_range = false;     // a 206 for another range than the one asked for
};

// The events the policy reacts to, one per table row.
enum class FetchEvent {
  kBodyComplete,    // a whole 2xx (or file) body: check size and hash next
  kNotFound,        // 404, 410, or a missing file
  kServerBusy,      // 408, 429, 5xx
  kRangeRefused,    // 416, a wrong Content-Range, or the transport's range error
  kTransient,       // TransportResult::kTransient
  kOtherStatus,     // any other HTTP status
  kFatalTransport,  // TransportResult::kFatal
  kUntrusted,       // TransportResult::kUntrusted: no retry fixes it (PermissionDenied)
  kOversize,        // more bytes than declared
  kSizeMismatch,    // complete, but not the declared size
  kHashMismatch,    // complete and the right size, but another SHA-256
  kVerified,        // size and SHA-256 match
};
std::string_view FetchEventName(FetchEvent event);

// What a TLS trust failure adds to its message: the fix, since no retry can make it.
inline constexpr char kUntrustedServerFix[] =
    "the server's certificate is not trusted (issued by a CA this machine does not know, "
    "or for another host name); add the CA that issued it with SSL_CERT_FILE, SSL_CERT_DIR "
    "or CURL_CA_BUNDLE, or use the host name its certificate names";

// Maps one transfer's facts to its event. Size and hash events come from the caller's
// verification after kBodyComplete.
FetchEvent ClassifyTransfer(const TransferFacts& facts);

enum class FetchAction {
  kVerify,         // a whole body: check its size and SHA-256, then ask again
  kRetry,          // the same source again after `delay`, keeping the bytes so far
  kRestartRetry,   // drop the bytes so far, then as kRetry
  kRestartNow,     // drop the bytes so far and try the same source again at once
  kNextSource,     // give this source up (its error is kept) and try the next one
  kDropNextSource, // drop the bytes so far, then as kNextSource
  kPublish,        // verified: hand the file to the store
};
std::string_view FetchActionName(FetchAction action);

struct RetryPolicy {
  int attempts_per_source = 4;
  absl::Duration backoff_base = absl::Milliseconds(250);
  absl::Duration backoff_max = absl::Seconds(8);
  absl::Duration retry_after_max = absl::Seconds(30);
};

// What the policy remembers of one artifact's attempts on its current source.
struct AttemptState {
  int failed_attempts = 0;  // on the current source, before this event
  bool resumed = false;     // some of the bytes came from an earlier attempt
  bool restarted = false;   // a "restart once" after a resumed mismatch was used
};

struct FetchDecision {
  FetchAction action = FetchAction::kNextSource;
  absl::StatusCode code = absl::StatusCode::kOk;  // the source's error, when it failed
  absl::Duration delay = absl::ZeroDuration();    // before the next attempt
  bool attempts_exhausted = false;  // a retry turned into kNextSource: say how many
  bool restart_once = false;        // this decision used up AttemptState::restarted
};

// The table. `retry_after` is the server's Retry-After, if any; `jitter` is a number in
// [0, 1) drawn by the caller (the policy stays deterministic; see BackoffDelay).
FetchDecision Decide(FetchEvent event, const AttemptState& state, const RetryPolicy& policy,
                     std::optional<absl::Duration> retry_after, double jitter);

// The wait before retry number `failed_attempts` (1 for the first retry): the server's
// Retry-After capped at retry_after_max, else full jitter over an exponential schedule
// (between half and all of min(base * 2^(n-1), max)), so that many ranks that failed
// together do not retry together.
absl::Duration BackoffDelay(int failed_attempts, const RetryPolicy& policy,
                            std::optional<absl::Duration> retry_after, double jitter);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_FETCH_POLICY_H_
