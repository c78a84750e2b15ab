// ReadLocation (artifacts/manifest_source.h) over a scripted Transport and a Clock that
// only pretends to sleep: the retry, backoff and Retry-After cases of manifest reads,
// in microseconds and without a server. (fault_http_test covers the same code against
// real sockets.)
#include <deque>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "artifacts/manifest_source.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

class ScriptedTransport : public Transport {
 public:
  TransportResponse Get(const TransportRequest& request) override {
    requests.push_back(request);
    if (script.empty()) return Status(500);
    TransportResponse r = script.front();
    script.pop_front();
    return r;
  }
  static TransportResponse Status(long code, std::string body = "") {
    TransportResponse r;
    r.facts.http_status = code;
    r.body = std::move(body);
    return r;
  }
  static TransportResponse Failed(TransportResult result, std::string error) {
    TransportResponse r;
    r.facts.result = result;
    r.error = std::move(error);
    return r;
  }
  std::deque<TransportResponse> script;
  std::vector<TransportRequest> requests;
};

class FakeClock : public Clock {
 public:
  absl::Time Now() override { return now; }
  void SleepFor(absl::Duration d) override {
    sleeps.push_back(d);
    now += d;
  }
  absl::Time now = absl::UnixEpoch();
  std::vector<absl::Duration> sleeps;
};

class ManifestReadTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::string> Read(int attempts = 4) {
    ReadSeams seams;
    seams.transport = &transport_;
    seams.clock = &clock_;
    seams.seed = 1;
    return ReadLocation("https://example.invalid/set/manifest.json", 1 << 20,
                        absl::Seconds(60), attempts, seams);
  }
  ScriptedTransport transport_;
  FakeClock clock_;
};

TEST_F(ManifestReadTest, RetriesBusyServersWithGrowingBackoffThenSucceeds) {
  transport_.script = {ScriptedTransport::Status(503), ScriptedTransport::Status(502),
                       ScriptedTransport::Status(200, "{}")};
  const absl::Time wall = absl::Now();
  auto body = Read();
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_EQ(*body, "{}");
  EXPECT_EQ(transport_.requests.size(), 3u);
  ASSERT_EQ(clock_.sleeps.size(), 2u);
  // Full jitter over 250 ms, 500 ms (RetryPolicy's defaults).
  EXPECT_GE(clock_.sleeps[0], absl::Milliseconds(125));
  EXPECT_LE(clock_.sleeps[0], absl::Milliseconds(250));
  EXPECT_GE(clock_.sleeps[1], absl::Milliseconds(250));
  EXPECT_LE(clock_.sleeps[1], absl::Milliseconds(500));
  EXPECT_LT(absl::Now() - wall, absl::Seconds(1));  // nobody really slept
}

TEST_F(ManifestReadTest, GivesUpAfterTheAttemptsAndSaysHowMany) {
  transport_.script = {ScriptedTransport::Status(503), ScriptedTransport::Status(503),
                       ScriptedTransport::Status(503), ScriptedTransport::Status(503)};
  EXPECT_THAT(Read(4), StatusIs(absl::StatusCode::kUnavailable,
                                HasSubstr("manifest.json: HTTP 503 (4 attempts)")));
  EXPECT_EQ(transport_.requests.size(), 4u);
  EXPECT_EQ(clock_.sleeps.size(), 3u);
}

// A read asks the transport to cut a stall (the fetcher's floor, for the window given;
// 20 s, fetch's default, when none is), and a stall cut that way is retried.
TEST_F(ManifestReadTest, AsksForTheStallLimitAndRetriesAStall) {
  transport_.script = {
      ScriptedTransport::Failed(TransportResult::kTransient,
                                "Operation too slow. Less than 1024 bytes/sec transferred "
                                "the last 2 seconds"),
      ScriptedTransport::Status(200, "{}")};
  ReadSeams seams;
  seams.transport = &transport_;
  seams.clock = &clock_;
  seams.seed = 1;
  auto read = ReadLocationIfChanged("https://example.invalid/m.json", "", 1 << 20,
                                    absl::Seconds(60), 4, seams, absl::Seconds(2));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->bytes, "{}");
  ASSERT_EQ(transport_.requests.size(), 2u);
  for (const TransportRequest& r : transport_.requests) {
    EXPECT_EQ(r.low_speed_bytes, 1024);
    EXPECT_EQ(r.low_speed_time, absl::Seconds(2));
  }
  transport_.requests.clear();
  transport_.script = {ScriptedTransport::Status(200, "{}")};
  ASSERT_TRUE(Read().ok());
  ASSERT_EQ(transport_.requests.size(), 1u);
  EXPECT_EQ(transport_.requests[0].low_speed_bytes, 1024);
  EXPECT_EQ(transport_.requests[0].low_speed_time, absl::Seconds(20));
}

TEST_F(ManifestReadTest, NotFoundIsFinalAtOnce) {
  transport_.script = {ScriptedTransport::Status(404)};
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("HTTP 404 (not found)")));
  EXPECT_EQ(transport_.requests.size(), 1u);
  EXPECT_TRUE(clock_.sleeps.empty());
}

TEST_F(ManifestReadTest, HonoursRetryAfter) {
  TransportResponse busy = ScriptedTransport::Status(429);
  busy.retry_after = absl::Seconds(7);
  transport_.script = {busy, ScriptedTransport::Status(200, "ok")};
  ASSERT_TRUE(Read().ok());
  ASSERT_EQ(clock_.sleeps.size(), 1u);
  EXPECT_EQ(clock_.sleeps[0], absl::Seconds(7));
}

TEST_F(ManifestReadTest, RetriesResetsButNotFatalTransportErrors) {
  transport_.script = {
      ScriptedTransport::Failed(TransportResult::kTransient, "Connection reset by peer"),
      ScriptedTransport::Status(200, "ok")};
  ASSERT_TRUE(Read().ok());
  EXPECT_EQ(transport_.requests.size(), 2u);

  transport_.requests.clear();
  transport_.script = {
      ScriptedTransport::Failed(TransportResult::kFatal, "Unsupported protocol")};
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kUnavailable,
                               HasSubstr("manifest.json: Unsupported protocol")));
  EXPECT_EQ(transport_.requests.size(), 1u);
}

TEST_F(ManifestReadTest, TooLargeIsInvalidArgument) {
  TransportResponse big = ScriptedTransport::Status(200);
  big.too_large = true;
  transport_.script = {big};
  EXPECT_THAT(Read(), StatusIs(absl::StatusCode::kInvalidArgument,
                               HasSubstr("larger than the limit of 1048576 bytes")));
  EXPECT_EQ(transport_.requests[0].max_bytes, 1u << 20);
}

}  // namespace
}  // namespace cubist
