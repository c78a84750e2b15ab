// The fetch policy (artifacts/fetch_policy.h) on its own: every event's action, the
// retry, restart and backoff rules, without a server, a file or a clock.
#include "artifacts/fetch_policy.h"

#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cubist {
namespace {

constexpr FetchEvent kAllEvents[] = {
    FetchEvent::kBodyComplete, FetchEvent::kNotFound,       FetchEvent::kServerBusy,
    FetchEvent::kRangeRefused, FetchEvent::kTransient,      FetchEvent::kOtherStatus,
    FetchEvent::kFatalTransport, FetchEvent::kOversize,     FetchEvent::kSizeMismatch,
    FetchEvent::kHashMismatch, FetchEvent::kVerified,     FetchEvent::kUntrusted,
};

TransferFacts Http(long status) {
  TransferFacts f;
  f.http_status = status;
  return f;
}
TransferFacts Transport(TransportResult result, long status = 0) {
  TransferFacts f;
  f.result = result;
  f.http_status = status;
  return f;
}

FetchDecision DecideFresh(FetchEvent event, std::optional<absl::Duration> retry_after = {}) {
  return Decide(event, AttemptState{}, RetryPolicy{}, retry_after, 0.5);
}

TEST(FetchPolicyTest, EveryEventHasARowAndAName) {
  for (FetchEvent e : kAllEvents) {
    EXPECT_NE(FetchEventName(e), "?");
    EXPECT_NE(FetchActionName(DecideFresh(e).action), "?") << FetchEventName(e);
  }
}

TEST(FetchPolicyTest, ClassifiesHttpStatuses) {
  EXPECT_EQ(ClassifyTransfer(Http(200)), FetchEvent::kBodyComplete);
  EXPECT_EQ(ClassifyTransfer(Http(206)), FetchEvent::kBodyComplete);
  EXPECT_EQ(ClassifyTransfer(Http(404)), FetchEvent::kNotFound);
  EXPECT_EQ(ClassifyTransfer(Http(410)), FetchEvent::kNotFound);
  for (long busy : {408, 429, 500, 502, 503, 504}) {
    EXPECT_EQ(ClassifyTransfer(Http(busy)), FetchEvent::kServerBusy) << busy;
  }
  EXPECT_EQ(ClassifyTransfer(Http(416)), FetchEvent::kRangeRefused);
  EXPECT_EQ(ClassifyTransfer(Http(403)), FetchEvent::kOtherStatus);
  EXPECT_EQ(ClassifyTransfer(Http(301)), FetchEvent::kOtherStatus);
}

TEST(FetchPolicyTest, ClassifiesTransportResults) {
  EXPECT_EQ(ClassifyTransfer(Transport(TransportResult::kTransient)), FetchEvent::kTransient);
  EXPECT_EQ(ClassifyTransfer(Transport(TransportResult::kFatal)),
            FetchEvent::kFatalTransport);
  EXPECT_EQ(ClassifyTransfer(Transport(TransportResult::kUntrusted)), FetchEvent::kUntrusted);
  EXPECT_EQ(ClassifyTransfer(Transport(TransportResult::kFileMissing)),
            FetchEvent::kNotFound);
  // libcurl's range error on a 2xx is a server that would not resume...
  EXPECT_EQ(ClassifyTransfer(Transport(TransportResult::kRangeError, 200)),
            FetchEvent::kRangeRefused);
  // ...but on an HTTP error it is that error (a proxy's 502 while its origin restarts).
  EXPECT_EQ(ClassifyTransfer(Transport(TransportResult::kRangeError, 502)),
            FetchEvent::kServerBusy);
  TransferFacts file = Transport(TransportResult::kRangeError);
  file.is_file = true;
  EXPECT_EQ(ClassifyTransfer(file), FetchEvent::kRangeRefused);
  file.result = TransportResult::kOk;
  EXPECT_EQ(ClassifyTransfer(file), FetchEvent::kBodyComplete);  // no HTTP status
}

TEST(FetchPolicyTest, OversizeAndBadRangeWinOverTheStatus) {
  TransferFacts f = Http(200);
  f.oversize = true;
  EXPECT_EQ(ClassifyTransfer(f), FetchEvent::kOversize);
  f = Http(206);
  f.bad_range = true;
  EXPECT_EQ(ClassifyTransfer(f), FetchEvent::kRangeRefused);
}

TEST(FetchPolicyTest, TheTable) {
  struct Case {
    FetchEvent event;
    FetchAction action;
    absl::StatusCode code;
  };
  const Case cases[] = {
      {FetchEvent::kBodyComplete, FetchAction::kVerify, absl::StatusCode::kOk},
      {FetchEvent::kNotFound, FetchAction::kNextSource, absl::StatusCode::kNotFound},
      {FetchEvent::kServerBusy, FetchAction::kRetry, absl::StatusCode::kUnavailable},
      {FetchEvent::kRangeRefused, FetchAction::kRestartRetry, absl::StatusCode::kUnavailable},
      {FetchEvent::kTransient, FetchAction::kRetry, absl::StatusCode::kUnavailable},
      {FetchEvent::kOtherStatus, FetchAction::kNextSource, absl::StatusCode::kUnavailable},
      {FetchEvent::kFatalTransport, FetchAction::kNextSource, absl::StatusCode::kUnavailable},
      {FetchEvent::kUntrusted, FetchAction::kNextSource, absl::StatusCode::kPermissionDenied},
      {FetchEvent::kOversize, FetchAction::kDropNextSource, absl::StatusCode::kDataLoss},
      {FetchEvent::kSizeMismatch, FetchAction::kDropNextSource, absl::StatusCode::kDataLoss},
      {FetchEvent::kHashMismatch, FetchAction::kDropNextSource, absl::StatusCode::kDataLoss},
      {FetchEvent::kVerified, FetchAction::kPublish, absl::StatusCode::kOk},
  };
  for (const Case& c : cases) {
    FetchDecision d = DecideFresh(c.event);
    EXPECT_EQ(d.action, c.action) << FetchEventName(c.event);
    EXPECT_EQ(d.code, c.code) << FetchEventName(c.event);
    EXPECT_FALSE(d.attempts_exhausted);
  }
}

TEST(FetchPolicyTest, RetriesASourceThenGivesItUp) {
  RetryPolicy policy;
  policy.attempts_per_source = 4;
  AttemptState state;
  for (int failed = 0; failed < 3; ++failed) {
    state.failed_attempts = failed;
    FetchDecision d = Decide(FetchEvent::kServerBusy, state, policy, std::nullopt, 0.0);
    EXPECT_EQ(d.action, FetchAction::kRetry) << failed;
  }
  state.failed_attempts = 3;
  FetchDecision d = Decide(FetchEvent::kTransient, state, policy, std::nullopt, 0.0);
  EXPECT_EQ(d.action, FetchAction::kNextSource);
  EXPECT_TRUE(d.attempts_exhausted);
  EXPECT_EQ(d.code, absl::StatusCode::kUnavailable);
}

TEST(FetchPolicyTest, ARefusedRangeStillDropsTheBytesWhenTheSourceIsGivenUp) {
  RetryPolicy policy;
  policy.attempts_per_source = 2;
  AttemptState state;
  state.failed_attempts = 1;
  FetchDecision d = Decide(FetchEvent::kRangeRefused, state, policy, std::nullopt, 0.0);
  EXPECT_EQ(d.action, FetchAction::kDropNextSource);
  EXPECT_TRUE(d.attempts_exhausted);
}

TEST(FetchPolicyTest, BackoffDoublesWithFullJitterUpToTheCap) {
  RetryPolicy policy;
  policy.backoff_base = absl::Milliseconds(100);
  policy.backoff_max = absl::Milliseconds(700);
  // Jitter 1 is the top of the range, 0 the bottom (half).
  EXPECT_EQ(BackoffDelay(1, policy, std::nullopt, 1.0), absl::Milliseconds(100));
  EXPECT_EQ(BackoffDelay(1, policy, std::nullopt, 0.0), absl::Milliseconds(50));
  EXPECT_EQ(BackoffDelay(2, policy, std::nullopt, 1.0), absl::Milliseconds(200));
  EXPECT_EQ(BackoffDelay(3, policy, std::nullopt, 1.0), absl::Milliseconds(400));
  EXPECT_EQ(BackoffDelay(4, policy, std::nullopt, 1.0), absl::Milliseconds(700));
  EXPECT_EQ(BackoffDelay(40, policy, std::nullopt, 0.0), absl::Milliseconds(350));
  // The decision carries the delay of its retry number.
  AttemptState state;
  state.failed_attempts = 1;  // this is the second failure: retry number 2
  EXPECT_EQ(Decide(FetchEvent::kServerBusy, state, policy, std::nullopt, 1.0).delay,
            absl::Milliseconds(200));
}

TEST(FetchPolicyTest, RetryAfterIsHonouredForBusyServersOnlyAndCapped) {
  RetryPolicy policy;
  policy.retry_after_max = absl::Seconds(30);
  EXPECT_EQ(Decide(FetchEvent::kServerBusy, {}, policy, absl::Seconds(7), 0.0).delay,
            absl::Seconds(7));
  EXPECT_EQ(Decide(FetchEvent::kServerBusy, {}, policy, absl::Hours(1), 0.0).delay,
            absl::Seconds(30));
  // A reset connection's retry does not wait for a header of an earlier answer.
  EXPECT_LT(Decide(FetchEvent::kTransient, {}, policy, absl::Seconds(7), 0.0).delay,
            absl::Seconds(1));
  EXPECT_LT(Decide(FetchEvent::kRangeRefused, {}, policy, absl::Seconds(7), 0.0).delay,
            absl::Seconds(1));
}

TEST(FetchPolicyTest, AResumedMismatchRestartsOnceBeforeTheSourceIsBlamed) {
  for (FetchEvent e : {FetchEvent::kSizeMismatch, FetchEvent::kHashMismatch}) {
    AttemptState resumed;
    resumed.resumed = true;
    FetchDecision d = Decide(e, resumed, RetryPolicy{}, std::nullopt, 0.5);
    EXPECT_EQ(d.action, FetchAction::kRestartNow) << FetchEventName(e);
    EXPECT_TRUE(d.restart_once);
    EXPECT_EQ(d.delay, absl::ZeroDuration());

    resumed.restarted = true;  // the clean try failed too
    d = Decide(e, resumed, RetryPolicy{}, std::nullopt, 0.5);
    EXPECT_EQ(d.action, FetchAction::kDropNextSource);
    EXPECT_EQ(d.code, absl::StatusCode::kDataLoss);

    d = Decide(e, AttemptState{}, RetryPolicy{}, std::nullopt, 0.5);  // not resumed
    EXPECT_EQ(d.action, FetchAction::kDropNextSource);
  }
  // Oversize is never the resume's fault: the whole answer was too long.
  AttemptState resumed;
  resumed.resumed = true;
  EXPECT_EQ(Decide(FetchEvent::kOversize, resumed, RetryPolicy{}, std::nullopt, 0.5).action,
            FetchAction::kDropNextSource);
}

}  // namespace
}  // namespace cubist
