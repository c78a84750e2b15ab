// Hostile manifests through `cubist fetch`: path traversal, huge and negative sizes,
// duplicate paths, invalid UTF-8, deep nesting, a 100 MB manifest (from a file and over
// HTTP). Each must end in a clear error (exit 8, "cubist: error: <where>: <what>") in
// bounded time and bounded memory (the child's peak RSS, from wait4), and write nothing
// outside the cache. Rows of docs/reliability.md's fault matrix name these tests.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/fault_http_server.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::CliPath;
using ::cubist::testing::FaultHttpServer;
using ::cubist::testing::FileExists;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::testing::HasSubstr;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr long kRssSlack = 4;  // sanitizer runtimes and quarantines inflate RSS
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr long kRssSlack = 4;
#else
constexpr long kRssSlack = 1;
#endif
#else
constexpr long kRssSlack = 1;
#endif

struct RunResult {
  int rc = -1;
  std::string output;
  long max_rss_mb = 0;
  absl::Duration elapsed;
};

RunResult RunCli(const std::vector<std::string>& args, const std::string& log) {
  RunResult r;
  absl::Time start = absl::Now();
  rusage ru{};
  r.rc = ::cubist::testing::WaitChild(::cubist::testing::SpawnCli(args, log), &ru);
  r.elapsed = absl::Now() - start;
  r.max_rss_mb = ru.ru_maxrss / 1024;
  r.output = ReadFileOrDie(log);
  return r;
}

// RunCli for a run that might hang (a FIFO that blocks a reader): a child still running
// after `limit` is killed, and the result says so (rc -1).
RunResult RunCliWithin(const std::vector<std::string>& args, const std::string& log,
                       absl::Duration limit) {
  RunResult r;
  const absl::Time start = absl::Now();
  const pid_t pid = ::cubist::testing::SpawnCli(args, log);
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() - start > limit) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.elapsed = absl::Now() - start;
      r.output = ReadFileOrDie(log);
      return r;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.elapsed = absl::Now() - start;
  r.output = ReadFileOrDie(log);
  return r;
}

class FaultInputTest : public ::testing::Test {
 protected:
  // Writes `json` as a manifest and fetches it into a fresh cache.
  RunResult FetchManifest(const std::string& json) {
    std::string path = dir_.Join("repo/manifest.json");
    WriteFileOrDie(path, json);
    return FetchLocation(path);
  }
  RunResult FetchLocation(const std::string& location) {
    return RunCli({"fetch", "-q", "--manifest", location, "--cache", dir_.Join("cache")},
                  dir_.Join("out.log"));
  }
  // A manifest around one artifact whose JSON text is `artifact`.
  static std::string WithArtifacts(const std::string& artifacts) {
    return absl::StrCat(
        R"({"schema": "cubist.manifest/1", "name": "bad", "version": 1, "base_urls": )",
        R"(["http://127.0.0.1:9/"], "artifacts": [)", artifacts, "]}");
  }
  static std::string Art(const std::string& path_json, const std::string& size = "10") {
    return absl::StrCat(R"({"path": )", path_json, R"(, "sha256": ")", std::string(64, 'a'),
                        R"(", "size": )", size, "}");
  }
  // The common expectations: exit 8, a "cubist: error:" line naming the manifest and
  // `fragment`, a few seconds at most, bounded memory, no object written.
  void ExpectRefused(const RunResult& r, const std::string& fragment, long rss_mb = 128) {
    EXPECT_EQ(r.rc, 8) << r.output;
    EXPECT_THAT(r.output, HasSubstr("cubist: error: "));
    EXPECT_THAT(r.output, HasSubstr(fragment)) << r.output;
    EXPECT_LT(r.elapsed, absl::Seconds(20)) << r.output;
    EXPECT_LT(r.max_rss_mb, rss_mb * kRssSlack) << r.output;
    EXPECT_FALSE(FileExists(dir_.Join("cache/objects/sha256/aa")));
  }

  TempDir dir_;
};

TEST_F(FaultInputTest, PathTraversalIsRefused) {
  for (const char* p : {R"("../../escape.cubin")", R"("cubins/../../escape.cubin")",
                        R"("/etc/passwd")", R"("cubins\\..\\x.cubin")", R"("./x.cubin")",
                        R"("cubins//x.cubin")", R"("")"}) {
    SCOPED_TRACE(p);
    RunResult r = FetchManifest(WithArtifacts(Art(p)));
    ExpectRefused(r, "artifacts[0].path");
  }
  EXPECT_FALSE(FileExists(dir_.Join("escape.cubin")));
  EXPECT_FALSE(FileExists(dir_.path() + "/../escape.cubin"));
}

TEST_F(FaultInputTest, ControlCharactersAndNulInPathsAreRefused) {
  ExpectRefused(FetchManifest(WithArtifacts(Art(R"("a\u0000b.cubin")"))), "artifacts[0].path");
  ExpectRefused(FetchManifest(WithArtifacts(Art(R"("a\nb.cubin")"))), "artifacts[0].path");
}

TEST_F(FaultInputTest, HugeAndNegativeSizesAreRefused) {
  ExpectRefused(FetchManifest(WithArtifacts(Art(R"("k.cubin")", "1152921504606846976"))),
                "artifacts[0].size");
  ExpectRefused(FetchManifest(WithArtifacts(Art(R"("k.cubin")", "-1"))), "artifacts[0].size");
  ExpectRefused(FetchManifest(WithArtifacts(Art(R"("k.cubin")", "1e400"))), "manifest.json");
  ExpectRefused(FetchManifest(WithArtifacts(Art(R"("k.cubin")", "10.5"))), "artifacts[0].size");
  ExpectRefused(FetchManifest(WithArtifacts(Art(R"("k.cubin")", R"("10")"))),
                "artifacts[0].size");
}

TEST_F(FaultInputTest, DuplicatePathsAreRefused) {
  RunResult r = FetchManifest(
      WithArtifacts(Art(R"("cubins/k.cubin")") + ", " + Art(R"("cubins/k.cubin")")));
  ExpectRefused(r, "artifacts[1].path: duplicate");
}

TEST_F(FaultInputTest, DuplicateKeysAreRefused) {
  RunResult r = FetchManifest(
      R"({"schema": "cubist.manifest/1", "name": "a", "name": "b", "version": 1, "artifacts": []})");
  ExpectRefused(r, "duplicate key");
}

TEST_F(FaultInputTest, InvalidUtf8IsRefusedWithItsPosition) {
  RunResult r = FetchManifest(WithArtifacts(Art("\"cubins/k\xff\xfe.cubin\"")));
  ExpectRefused(r, "invalid UTF-8 (byte 0xff)");
  // An overlong encoding of '/' ("\xc0\xaf") must not sneak a separator in.
  r = FetchManifest(WithArtifacts(Art("\"cubins\xc0\xaf..\xc0\xafk.cubin\"")));
  ExpectRefused(r, "invalid UTF-8");
}

TEST_F(FaultInputTest, DeepNestingIsRefusedBeforeParsing) {
  std::string deep = R"({"schema": "cubist.manifest/1", "x": )" + std::string(1000000, '[');
  RunResult r = FetchManifest(deep);
  ExpectRefused(r, "nesting deeper than");
  EXPECT_LT(r.elapsed, absl::Seconds(5));
}

TEST_F(FaultInputTest, TruncatedJsonPointsAtTheEnd) {
  RunResult r = FetchManifest(R"({"schema": "cubist.manifest/1", "name": "x", "vers)");
  ExpectRefused(r, "manifest.json:1:");
}

// 100 MB: valid JSON shape (a long array of artifacts), so that nothing but the size cap
// stops it. Read at most the cap plus one byte, never parsed.
std::string HundredMegabyteManifest() {
  std::string a = absl::StrCat(R"({"path": "cubins/k0000000.cubin", "sha256": ")",
                               std::string(64, 'b'), R"(", "size": 100000},)");
  std::string out =
      R"({"schema": "cubist.manifest/1", "name": "big", "version": 1, "artifacts": [)";
  out.reserve(101u << 20);
  while (out.size() < (100u << 20)) out += a;
  out.back() = ']';
  out += "}";
  return out;
}

TEST_F(FaultInputTest, HundredMegabyteManifestFileIsRefusedInBoundedMemory) {
  std::string path = dir_.Join("repo/manifest.json");
  WriteFileOrDie(path, HundredMegabyteManifest());
  RunResult r = FetchLocation(path);
  // The read stops at the 64 MiB cap (+1 byte): memory stays near that, not 100 MB+.
  ExpectRefused(r, "larger than the limit of 67108864 bytes", 96);
  std::printf("peak RSS refusing a 100 MB manifest file: %ld MB\n", r.max_rss_mb);
}

TEST_F(FaultInputTest, HundredMegabyteManifestOverHttpIsRefusedInBoundedMemory) {
  auto server = FaultHttpServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->Serve("/manifest.json", HundredMegabyteManifest());
  RunResult r = FetchLocation((*server)->Url("/manifest.json"));
  // The body is collected in a growing string: while it doubles from 64 to 128 MiB
  // both buffers are live, so the bound is about three times the cap.
  ExpectRefused(r, "larger than the limit of 67108864 bytes", 224);
  EXPECT_EQ((*server)->Count("/manifest.json"), 1);  // a size refusal is not retried
  std::printf("peak RSS refusing a 100 MB manifest over HTTP: %ld MB\n", r.max_rss_mb);
}

TEST_F(FaultInputTest, EndlessManifestOverHttpStopsAtTheCap) {
  // 4 GiB announced and streamed: the client stops at the cap, so memory and time do
  // not depend on what the server sends.
  auto server = FaultHttpServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->Serve("/manifest.json", "{");
  (*server)->SetFault("/manifest.json", {.kind = ::cubist::testing::FaultKind::kOversizeNoLength,
                                         .bytes = uint64_t{4} << 30});
  RunResult r = FetchLocation((*server)->Url("/manifest.json"));
  ExpectRefused(r, "larger than the limit", 224);
  uint64_t sent = (*server)->Requests()[0].body_bytes_sent;
  EXPECT_LT(sent, uint64_t{256} << 20) << "the client kept reading";
}

// A manifest read over HTTP names a file:// source: refused before anything is read
// from the local disk (exit 8). The user's own --mirror file://... stays allowed.
TEST_F(FaultInputTest, RemoteManifestMayNameOnlyHttpSources) {
  const std::string data = "kernel bytes";
  WriteFileOrDie(dir_.Join("local/k.cubin"), data);
  auto server = FaultHttpServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string art = absl::StrCat(R"({"path": "k.cubin", "sha256": ")", Sha256Hex(data),
                                       R"(", "size": )", data.size(), "}");
  (*server)->Serve("/file.json",
                   absl::StrCat(R"({"schema": "cubist.manifest/1", "name": "r", "version": 1, )",
                                R"("base_urls": ["https://mirror.example/", "file://)",
                                dir_.Join("local/"), R"("], "artifacts": [)", art, "]}"));
  RunResult r = FetchLocation((*server)->Url("/file.json"));
  ExpectRefused(r, absl::StrCat((*server)->Url("/file.json"), ": base_urls[1] is file://",
                                dir_.Join("local/"), "; a manifest read over the network may "
                                "name only http:// and https:// sources"));
  EXPECT_FALSE(FileExists(dir_.Join("cache/objects/sha256/" + Sha256Hex(data).substr(0, 2))));

  (*server)->Serve("/http.json",
                   absl::StrCat(R"({"schema": "cubist.manifest/1", "name": "h", "version": 1, )",
                                R"("base_urls": ["http://127.0.0.1:9/"], "artifacts": [)", art,
                                "]}"));
  r = RunCli({"fetch", "-q", "--manifest", (*server)->Url("/http.json"), "--cache",
              dir_.Join("cache"), "--mirror", "file://" + dir_.Join("local/")},
             dir_.Join("out.log"));
  EXPECT_EQ(r.rc, 0) << r.output;
}

// FIFOs where cubist reads local files (a manifest, its .sig, an artifact behind a
// file:// source) end in a classified error at once, never a hang; so does a directory
// where the .sig belongs.
TEST_F(FaultInputTest, FifosAndDirectoriesInPlaceOfLocalFilesFailAtOnce) {
  const std::string fifo = dir_.Join("fifo.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  RunResult r = RunCliWithin({"fetch", "-q", "--manifest", fifo, "--cache", dir_.Join("cache")},
                             dir_.Join("out.log"), absl::Seconds(20));
  EXPECT_EQ(r.rc, 8) << r.output;
  EXPECT_THAT(r.output, HasSubstr(fifo + ": is a FIFO; cubist reads manifests, signatures and "
                                  "keys only from regular files"));

  // A signed manifest's .sig as a FIFO, then as a directory.
  r = RunCli({"keygen", "-q", "-o", dir_.Join("k.pem")}, dir_.Join("out.log"));
  ASSERT_EQ(r.rc, 0) << r.output;
  const std::string data = "kernel bytes";
  WriteFileOrDie(dir_.Join("repo/k.cubin"), data);
  const std::string manifest = dir_.Join("repo/manifest.json");
  WriteFileOrDie(manifest,
                 absl::StrCat(R"({"schema": "cubist.manifest/1", "name": "s", "version": 1, )",
                              R"("artifacts": [{"path": "k.cubin", "sha256": ")",
                              Sha256Hex(data), R"(", "size": )", data.size(), "}]}"));
  const std::vector<std::string> signed_fetch = {"fetch", "-q", "--manifest", manifest,
                                                 "--cache", dir_.Join("cache"),
                                                 "--trusted-key", dir_.Join("k.pub")};
  ASSERT_EQ(::mkfifo((manifest + ".sig").c_str(), 0644), 0);
  r = RunCliWithin(signed_fetch, dir_.Join("out.log"), absl::Seconds(20));
  EXPECT_EQ(r.rc, 8) << r.output;
  EXPECT_THAT(r.output, HasSubstr(manifest + ".sig: is a FIFO"));
  ASSERT_EQ(::unlink((manifest + ".sig").c_str()), 0);
  ASSERT_EQ(::mkdir((manifest + ".sig").c_str(), 0755), 0);
  r = RunCliWithin(signed_fetch, dir_.Join("out.log"), absl::Seconds(20));
  EXPECT_EQ(r.rc, 8) << r.output;
  EXPECT_THAT(r.output, HasSubstr(manifest + ".sig: is a directory"));

  // The artifact itself a FIFO behind the manifest's own directory (a file:// source).
  ASSERT_EQ(::unlink(dir_.Join("repo/k.cubin").c_str()), 0);
  ASSERT_EQ(::mkfifo(dir_.Join("repo/k.cubin").c_str(), 0644), 0);
  r = RunCliWithin({"fetch", "-q", "--manifest", manifest, "--cache", dir_.Join("cache")},
                   dir_.Join("out.log"), absl::Seconds(20));
  EXPECT_EQ(r.rc, 8) << r.output;
  EXPECT_THAT(r.output, HasSubstr(absl::StrCat(dir_.Join("repo/k.cubin"), " is a FIFO; cubist "
                                               "reads local sources only from regular files")));
}

}  // namespace
}  // namespace cubist
