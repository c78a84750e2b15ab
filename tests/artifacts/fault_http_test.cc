// The fetcher against a misbehaving HTTP server (tests/testlib/fault_http_server.h):
// for each fault, the documented outcome (success after a retry, or the right error) in
// bounded time, and never a wrong file at a final path in the cache. The rows of the
// fault matrix in docs/reliability.md name these tests.
#include <dirent.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "artifacts/fetcher.h"
#include "artifacts/manifest_source.h"
#include "artifacts/store.h"
#include "base/sha256.h"
#include "manifest/signature.h"
#include "tests/testlib/fault_http_server.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::Fault;
using ::cubist::testing::FaultHttpServer;
using ::cubist::testing::FaultKind;
using ::cubist::testing::RandomBytes;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::StatusIs;
using ::cubist::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr size_t kSize = 300 * 1000;

// Every file under objects/ must hash to its name: "never a wrong file at a final path".
void ExpectCacheSound(const std::string& root) {
  std::error_code ec;
  std::filesystem::path objects = std::filesystem::path(root) / "objects";
  if (!std::filesystem::exists(objects, ec)) return;
  for (const auto& e : std::filesystem::recursive_directory_iterator(objects, ec)) {
    if (!e.is_regular_file()) continue;
    std::string name = e.path().filename().string();
    absl::StatusOr<std::string> got = Sha256File(e.path().string());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, name) << "wrong content at final path " << e.path();
  }
}

class FaultHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = FaultHttpServer::Start("127.0.0.1");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    auto store = Store::Open(dir_.Join("cache"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_.emplace(*std::move(store));
    data_ = RandomBytes(kSize, 42);
    server_->Serve("/k.cubin", data_);
    options_.backoff_base = absl::Milliseconds(10);
    options_.backoff_max = absl::Milliseconds(100);
    options_.low_speed_time = absl::Seconds(1);
    options_.connect_timeout = absl::Seconds(2);
    options_.attempts_per_source = 4;
    options_.jobs = 4;
  }
  void TearDown() override { ExpectCacheSound(store_->root()); }

  Artifact Art(std::optional<uint64_t> size = kSize) const {
    Artifact a;
    a.path = "cubins/k.cubin";
    a.sha256 = Sha256Hex(data_);
    a.size = size;
    return a;
  }
  FetchReport Fetch(std::vector<std::string> urls, std::optional<uint64_t> size = kSize) {
    FetchItem item{Art(size), std::move(urls)};
    absl::Time start = absl::Now();
    FetchReport r = FetchArtifacts(*store_, {item}, options_);
    elapsed_ = absl::Now() - start;
    return r;
  }
  bool Present() const {
    return store_->Probe(Sha256Hex(data_), kSize) == ObjectState::kPresent;
  }
  void ExpectFetchedRight(const FetchReport& r) {
    ASSERT_EQ(r.results.size(), 1u);
    EXPECT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.results[0].outcome, FetchOutcome::kDownloaded);
    EXPECT_EQ(ReadFileOrDie(store_->ObjectPath(Sha256Hex(data_))), data_);
  }
  void ExpectNothingCached() {
    EXPECT_FALSE(Present());
    EXPECT_FALSE(cubist::testing::FileExists(store_->TempPath(Sha256Hex(data_))))
        << "a failed artifact left its partial file";
  }

  TempDir dir_;
  std::unique_ptr<FaultHttpServer> server_;
  std::optional<Store> store_;
  std::string data_;
  FetchOptions options_;
  absl::Duration elapsed_;
};

TEST_F(FaultHttpTest, Baseline) {
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  EXPECT_EQ(server_->Count("/k.cubin"), 1);
  EXPECT_EQ(r.results[0].attempts, 1);
}

TEST_F(FaultHttpTest, ResetAfterNBytesResumesWithRange) {
  server_->PushFault("/k.cubin", {.kind = FaultKind::kResetAfter, .bytes = 100000});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  auto reqs = server_->Requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_FALSE(reqs[0].range.has_value());
  // The first 100000 bytes were kept: the retry asks only for the rest.
  ASSERT_TRUE(reqs[1].range.has_value());
  EXPECT_EQ(*reqs[1].range, "bytes=100000-");
  EXPECT_EQ(reqs[1].body_bytes_sent, kSize - 100000);
  EXPECT_LT(elapsed_, absl::Seconds(10));
}

TEST_F(FaultHttpTest, ShortBodyUnderCorrectContentLengthIsRetried) {
  server_->PushFault("/k.cubin", {.kind = FaultKind::kShortBody, .bytes = 50000});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  auto reqs = server_->Requests();
  ASSERT_EQ(reqs.size(), 2u);
  ASSERT_TRUE(reqs[1].range.has_value());
  EXPECT_EQ(*reqs[1].range, "bytes=50000-");
}

TEST_F(FaultHttpTest, WrongBytesAreNeverCached) {
  server_->SetFault("/k.cubin", {.kind = FaultKind::kWrongBytes, .bytes = 0});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("sha256 mismatch")));
  EXPECT_THAT(r.results[0].status,
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("expected " + Sha256Hex(data_))));
  EXPECT_EQ(r.results[0].outcome, FetchOutcome::kFailed);
  ExpectNothingCached();
  // A hash mismatch is not retried on the same source: the source serves another file.
  EXPECT_EQ(server_->Count("/k.cubin"), 1);
}

TEST_F(FaultHttpTest, WrongBytesOnOneMirrorTheNextMirrorServes) {
  auto second = FaultHttpServer::Start("127.0.0.2");
  ASSERT_TRUE(second.ok()) << second.status();
  (*second)->Serve("/k.cubin", data_);
  server_->SetFault("/k.cubin", {.kind = FaultKind::kWrongBytes, .bytes = 1000});
  FetchReport r = Fetch({server_->Url("/k.cubin"), (*second)->Url("/k.cubin")});
  ExpectFetchedRight(r);
  EXPECT_EQ(r.results[0].url, (*second)->Url("/k.cubin"));
}

TEST_F(FaultHttpTest, StallOnceIsCutByTheLowSpeedLimitAndRetried) {
  server_->PushFault("/k.cubin",
                     {.kind = FaultKind::kStall, .bytes = 1000, .stall = absl::Seconds(60)});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  EXPECT_EQ(server_->Count("/k.cubin"), 2);
  EXPECT_LT(elapsed_, absl::Seconds(10));  // low_speed_time 1 s, not the 60 s stall
}

TEST_F(FaultHttpTest, StallForeverFailsInBoundedTime) {
  server_->SetFault("/k.cubin",
                    {.kind = FaultKind::kStall, .bytes = 1000, .stall = absl::Seconds(60)});
  options_.attempts_per_source = 2;
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  EXPECT_EQ(r.status.code(), absl::StatusCode::kUnavailable) << r.status;
  EXPECT_THAT(r.results[0].status.message(), HasSubstr("2 attempts"));
  EXPECT_LT(elapsed_, absl::Seconds(15));
  ExpectNothingCached();
}

// Issue 28: a manifest or signature read from a server that stops sending is cut after
// the stall window (fetch --stall-seconds), retried, and fails as a network error in
// bounded time, never waiting out the 60 s the transfer may take in all.
TEST_F(FaultHttpTest, StalledManifestAndSignatureReadsEndAfterTheStallWindow) {
  const std::string manifest = absl::StrCat(
      R"({"schema": "cubist.manifest/1", "name": "stall", "version": 1, "artifacts": []})",
      std::string(4000, ' '));
  server_->Serve("/m.json", manifest);
  server_->Serve("/m.json.sig", std::string(200, 's'));
  OpenManifestOptions options;
  options.stall = absl::Seconds(1);
  options.attempts = 2;
  const Fault stall{.kind = FaultKind::kStall, .bytes = 100, .stall = absl::Seconds(60)};

  server_->SetFault("/m.json", stall);
  absl::Time start = absl::Now();
  EXPECT_THAT(OpenManifest(server_->Url("/m.json"), options),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("/m.json: Operation too slow")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_EQ(server_->Count("/m.json"), 2);

  server_->SetFault("/m.json", {});
  server_->SetFault("/m.json.sig", stall);
  options.trust.trusted_keys.push_back(PublicKey::FromRaw({}));  // signatures required
  start = absl::Now();
  EXPECT_THAT(OpenManifest(server_->Url("/m.json"), options),
              StatusIs(absl::StatusCode::kUnavailable,
                       AllOf(HasSubstr("read the manifest's signature"),
                             HasSubstr("/m.json.sig: Operation too slow"))));
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_EQ(server_->Count("/m.json.sig"), 2);
}

TEST_F(FaultHttpTest, ServerErrorsOnceAreRetried) {
  server_->PushFault("/k.cubin", {.kind = FaultKind::kStatus, .status = 500});
  server_->PushFault("/k.cubin", {.kind = FaultKind::kStatus, .status = 503});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  EXPECT_EQ(server_->Count("/k.cubin"), 3);
  EXPECT_EQ(r.results[0].attempts, 3);
}

TEST_F(FaultHttpTest, TooManyRequestsHonoursRetryAfter) {
  server_->PushFault("/k.cubin", {.kind = FaultKind::kStatus, .status = 429, .retry_after = 1});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  // The backoff alone would be 10 ms; the server asked for 1 s.
  EXPECT_GE(elapsed_, absl::Milliseconds(950));
  EXPECT_LT(elapsed_, absl::Seconds(10));
}

TEST_F(FaultHttpTest, RetryAfterIsCapped) {
  server_->PushFault("/k.cubin",
                     {.kind = FaultKind::kStatus, .status = 503, .retry_after = 3600});
  options_.retry_after_max = absl::Seconds(1);
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  EXPECT_LT(elapsed_, absl::Seconds(10));
}

TEST_F(FaultHttpTest, PersistentServerErrorIsUnavailableAfterTheAttempts) {
  server_->SetFault("/k.cubin", {.kind = FaultKind::kStatus, .status = 503});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  EXPECT_THAT(r.results[0].status,
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("HTTP 503")));
  EXPECT_EQ(server_->Count("/k.cubin"), options_.attempts_per_source);
  ExpectNothingCached();
}

TEST_F(FaultHttpTest, NotFoundMovesToTheNextMirrorAndIsNotFoundAtTheEnd) {
  auto second = FaultHttpServer::Start("127.0.0.1");
  ASSERT_TRUE(second.ok());
  (*second)->Serve("/k.cubin", data_);
  FetchReport ok = Fetch({server_->Url("/missing.cubin"), (*second)->Url("/k.cubin")});
  ExpectFetchedRight(ok);
  EXPECT_EQ(server_->Count("/missing.cubin"), 1);  // 404 is not retried

  TempDir other;
  auto store = Store::Open(other.Join("cache"));
  ASSERT_TRUE(store.ok());
  FetchItem item{Art(), {server_->Url("/missing.cubin")}};
  FetchReport r = FetchArtifacts(*store, {item}, options_);
  EXPECT_THAT(r.results[0].status, StatusIs(absl::StatusCode::kNotFound, HasSubstr("404")));
}

TEST_F(FaultHttpTest, IgnoredRangeRestartsFromZero) {
  server_->PushFault("/k.cubin", {.kind = FaultKind::kResetAfter, .bytes = 100000});
  server_->SetFault("/k.cubin", {.kind = FaultKind::kIgnoreRange});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  auto reqs = server_->Requests();
  // libcurl gives up on a 200 answer to a resume (CURLE_RANGE_ERROR), so the fetcher
  // restarts from byte 0 with one more request; the file is whole either way.
  ASSERT_GE(reqs.size(), 2u);
  ASSERT_LE(reqs.size(), 3u);
  ASSERT_TRUE(reqs[1].range.has_value());
  EXPECT_FALSE(reqs.back().range.has_value());
}

TEST_F(FaultHttpTest, WrongRangeAnswerIsDetectedAndRestarted) {
  server_->PushFault("/k.cubin", {.kind = FaultKind::kResetAfter, .bytes = 100000});
  server_->PushFault("/k.cubin", {.kind = FaultKind::kBadRange});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  EXPECT_GE(server_->Count("/k.cubin"), 3);
}

TEST_F(FaultHttpTest, LyingRangeAnswerIsCaughtByTheHashAndRestarted) {
  // The server claims the requested offset but sends bytes from 7 further on, padded to
  // the right length: only the hash can tell. The fetcher then tries once from byte 0.
  server_->PushFault("/k.cubin", {.kind = FaultKind::kResetAfter, .bytes = 100000});
  server_->SetFault("/k.cubin", {.kind = FaultKind::kLyingRange});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  auto reqs = server_->Requests();
  ASSERT_GE(reqs.size(), 3u);
  EXPECT_FALSE(reqs.back().range.has_value());
}

TEST_F(FaultHttpTest, WrongLengthRangeAnswerIsRetriedFromByteZero) {
  // A resumed answer of the wrong total length: the bytes before the resume point may be
  // what is wrong, so the fetcher tries once from byte 0 on the same source (as for a
  // resumed hash mismatch) and nothing wrong is cached.
  server_->PushFault("/k.cubin", {.kind = FaultKind::kResetAfter, .bytes = 100000});
  server_->SetFault("/k.cubin", {.kind = FaultKind::kLyingShortRange});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  auto reqs = server_->Requests();
  ASSERT_GE(reqs.size(), 3u);
  EXPECT_TRUE(reqs[1].range.has_value());
  EXPECT_FALSE(reqs.back().range.has_value());
}

TEST_F(FaultHttpTest, WrongLengthEvenFromByteZeroFailsThatSourceNotTheCache) {
  // Served short from byte 0 too: that source fails with DataLoss, the next mirror
  // serves the file, and nothing wrong is cached.
  auto second = FaultHttpServer::Start("127.0.0.2");
  ASSERT_TRUE(second.ok()) << second.status();
  (*second)->Serve("/k.cubin", data_);
  server_->Serve("/k.cubin", data_.substr(0, data_.size() - 10));
  FetchReport alone = Fetch({server_->Url("/k.cubin")});
  EXPECT_THAT(alone.results[0].status,
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("size mismatch")));
  ExpectNothingCached();
  FetchReport r = Fetch({server_->Url("/k.cubin"), (*second)->Url("/k.cubin")});
  ExpectFetchedRight(r);
  EXPECT_EQ(r.results[0].url, (*second)->Url("/k.cubin"));
}

TEST_F(FaultHttpTest, RedirectToAnotherHostIsFollowed) {
  auto other = FaultHttpServer::Start("127.0.0.2");
  ASSERT_TRUE(other.ok()) << other.status();
  (*other)->Serve("/real/k.cubin", data_);
  server_->SetFault("/k.cubin",
                    {.kind = FaultKind::kRedirect, .location = (*other)->Url("/real/k.cubin")});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  ExpectFetchedRight(r);
  auto reqs = (*other)->Requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_EQ(reqs[0].host, absl::StrCat("127.0.0.2:", (*other)->port()));
}

TEST_F(FaultHttpTest, RedirectLoopFailsInBoundedTime) {
  auto other = FaultHttpServer::Start("127.0.0.2");
  ASSERT_TRUE(other.ok()) << other.status();
  server_->SetFault("/k.cubin",
                    {.kind = FaultKind::kRedirect, .location = (*other)->Url("/k.cubin")});
  (*other)->SetFault("/k.cubin",
                     {.kind = FaultKind::kRedirect, .location = server_->Url("/k.cubin")});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  EXPECT_FALSE(r.status.ok());
  EXPECT_THAT(std::string(r.results[0].status.message()), HasSubstr("redirect"));
  int hops = server_->Count("/k.cubin") + (*other)->Count("/k.cubin");
  EXPECT_LE(hops, options_.attempts_per_source * (options_.max_redirects + 1));
  EXPECT_LT(elapsed_, absl::Seconds(10));
  ExpectNothingCached();
}

TEST_F(FaultHttpTest, FarMoreThanDeclaredIsCutAtSizePlusOne) {
  server_->SetFault("/k.cubin", {.kind = FaultKind::kOversize, .bytes = 200u << 20});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  EXPECT_THAT(r.results[0].status,
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("more than the declared")));
  // Stopped near the declared size: at most one receive buffer past it, not 200 MB.
  EXPECT_LT(r.results[0].bytes_received, kSize + (1u << 20));
  EXPECT_LT(elapsed_, absl::Seconds(10));
  ExpectNothingCached();
}

TEST_F(FaultHttpTest, FarMoreThanDeclaredWithoutContentLength) {
  server_->SetFault("/k.cubin", {.kind = FaultKind::kOversizeNoLength, .bytes = 200u << 20});
  FetchReport r = Fetch({server_->Url("/k.cubin")});
  EXPECT_EQ(r.results[0].status.code(), absl::StatusCode::kDataLoss) << r.results[0].status;
  EXPECT_LT(r.results[0].bytes_received, kSize + (1u << 20));
  ExpectNothingCached();
}

TEST_F(FaultHttpTest, UnknownSizeIsCappedByMaxUnknownSize) {
  // checksums.txt artifacts have no size: the cap is FetchOptions::max_unknown_size.
  options_.max_unknown_size = 1 << 20;
  server_->SetFault("/k.cubin", {.kind = FaultKind::kOversize, .bytes = 200u << 20});
  FetchReport r = Fetch({server_->Url("/k.cubin")}, std::nullopt);
  EXPECT_EQ(r.results[0].status.code(), absl::StatusCode::kDataLoss) << r.results[0].status;
  EXPECT_LT(r.results[0].bytes_received, (1u << 20) + (1u << 20));
  ExpectNothingCached();
}

TEST_F(FaultHttpTest, ConnectionRefusedIsUnavailable) {
  int port = server_->port();
  server_->Stop();
  options_.attempts_per_source = 2;
  FetchReport r = Fetch({absl::StrCat("http://127.0.0.1:", port, "/k.cubin")});
  EXPECT_EQ(r.results[0].status.code(), absl::StatusCode::kUnavailable) << r.results[0].status;
  EXPECT_LT(elapsed_, absl::Seconds(10));
  ExpectNothingCached();
}

// Many artifacts, each with its own random sequence of transient faults: every one
// lands, right, and nothing wrong is ever published.
TEST_F(FaultHttpTest, FaultStormAllTransientFaultsEndInTheRightFiles) {
  std::mt19937 rng(7);
  std::vector<FetchItem> items;
  std::vector<std::string> bodies;
  const FaultKind kinds[] = {FaultKind::kResetAfter, FaultKind::kShortBody,
                             FaultKind::kStatus,     FaultKind::kIgnoreRange,
                             FaultKind::kBadRange,   FaultKind::kStall};
  for (int i = 0; i < 24; ++i) {
    std::string path = absl::StrCat("/f", i);
    std::string body = RandomBytes(20000 + 7919 * i, 100 + i);
    server_->Serve(path, body);
    int faults = static_cast<int>(rng() % 3);  // 0..2, under attempts_per_source - 1
    for (int f = 0; f < faults; ++f) {
      Fault fault;
      fault.kind = kinds[rng() % std::size(kinds)];
      fault.bytes = rng() % body.size();
      // libcurl averages speed over a few seconds: a stall after a big burst takes
      // longer to detect, so stalls come early to keep the test short.
      if (fault.kind == FaultKind::kStall) fault.bytes %= 2000;
      fault.status = (rng() % 2) ? 503 : 500;
      fault.stall = absl::Seconds(30);
      server_->PushFault(path, fault);
    }
    Artifact a;
    a.path = path.substr(1);
    a.sha256 = Sha256Hex(body);
    a.size = body.size();
    items.push_back({a, {server_->Url(path)}});
    bodies.push_back(std::move(body));
  }
  absl::Time start = absl::Now();
  FetchReport r = FetchArtifacts(*store_, items, options_);
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.downloaded, 24);
  for (size_t i = 0; i < items.size(); ++i) {
    EXPECT_EQ(ReadFileOrDie(store_->ObjectPath(items[i].artifact.sha256)), bodies[i]);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// ---------------------------------------------------------------------------------
// The server itself, checked with a raw socket (no libcurl between test and server).

std::string RawExchange(int port, const std::string& request, int* err = nullptr) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0);
  EXPECT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[65536];
  if (err) *err = 0;
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && err) *err = errno;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

TEST(FaultHttpServerTest, ServesRangesAndRecordsRequests) {
  auto s = FaultHttpServer::Start();
  ASSERT_TRUE(s.ok());
  (*s)->Serve("/f", "0123456789");
  std::string r = RawExchange((*s)->port(),
                              "GET /f HTTP/1.1\r\nHost: x\r\nRange: bytes=3-5\r\n"
                              "Connection: close\r\n\r\n");
  EXPECT_THAT(r, HasSubstr("HTTP/1.1 206 Partial Content\r\n"));
  EXPECT_THAT(r, HasSubstr("Content-Range: bytes 3-5/10\r\n"));
  EXPECT_EQ(r.substr(r.size() - 3), "345");
  r = RawExchange((*s)->port(), "GET /f HTTP/1.1\r\nRange: bytes=10-\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(r, HasSubstr("416"));
  r = RawExchange((*s)->port(), "GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(r, HasSubstr("404 Not Found"));
  auto reqs = (*s)->Requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[0].host, "x");
  EXPECT_EQ(*reqs[0].range, "bytes=3-5");
}

TEST(FaultHttpServerTest, ResetSendsRstAndShortBodyClosesEarly) {
  auto s = FaultHttpServer::Start();
  ASSERT_TRUE(s.ok());
  std::string body = RandomBytes(1 << 20, 3);
  (*s)->Serve("/f", body);
  (*s)->PushFault("/f", {.kind = FaultKind::kShortBody, .bytes = 10});
  std::string r = RawExchange((*s)->port(), "GET /f HTTP/1.1\r\n\r\n");
  EXPECT_THAT(r, HasSubstr(absl::StrCat("Content-Length: ", body.size(), "\r\n")));
  EXPECT_EQ(r.substr(r.find("\r\n\r\n") + 4), body.substr(0, 10));
  (*s)->PushFault("/f", {.kind = FaultKind::kResetAfter, .bytes = 0});
  int err = 0;
  RawExchange((*s)->port(), "GET /f HTTP/1.1\r\n\r\n", &err);
  EXPECT_EQ(err, ECONNRESET);
}

TEST(FaultHttpServerTest, StopWakesStalledConnectionsAtOnce) {
  auto s = FaultHttpServer::Start();
  ASSERT_TRUE(s.ok());
  (*s)->Serve("/f", "abc");
  (*s)->SetFault("/f", {.kind = FaultKind::kStall, .bytes = 1, .stall = absl::Seconds(600)});
  int port = (*s)->port();
  std::thread client([port] { RawExchange(port, "GET /f HTTP/1.1\r\n\r\n"); });
  while ((*s)->Count("/f") == 0) absl::SleepFor(absl::Milliseconds(5));
  absl::Time start = absl::Now();
  (*s)->Stop();
  client.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace cubist
