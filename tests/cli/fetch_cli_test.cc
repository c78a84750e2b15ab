// The `cubist` command end to end against a real nginx: fetch, verify (plain and deep),
// list, path, gc, offline, exit codes; 8 processes fetching into one cache at once;
// a process killed with SIGKILL mid-download.
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "artifacts/store.h"
#include "base/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/nginx_server.h"
#include "tests/testlib/sample_repo.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::NginxServer;
using ::testing::HasSubstr;

class FetchCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
    repo_ = tmp_.Join("repo");
    cache_ = tmp_.Join("cache");
  }

  void Serve(int count, size_t min_size, size_t max_size, const std::string& limit_rate = "",
             const testing::TestTls* tls = nullptr) {
    files_ = testing::MakeSampleFiles(count, min_size, max_size, 7);
    manifest_ = testing::WriteSampleRepo(repo_, files_, "cli-sample", 3);
    NginxServer::Options o;
    o.root = repo_;
    o.workdir = tmp_.Join("nginx");
    o.limit_rate = limit_rate;
    o.workers = 2;
    if (tls != nullptr) {
      o.tls_cert = tls->cert;
      o.tls_key = tls->key;
    }
    auto s = NginxServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    url_ = server_->BaseUrl() + "manifest.json";
  }

  // Serves the set's checksums.txt (FlashInfer's form: no sizes) beside its files;
  // returns its URL.
  std::string ServeChecksums() {
    std::string sums;
    for (const Artifact& a : manifest_.artifacts) absl::StrAppend(&sums, a.sha256, " ", a.path, "\n");
    testing::WriteFileOrDie(repo_ + "/checksums.txt", sums);
    return server_->BaseUrl() + "checksums.txt";
  }

  int Cubist(const std::string& args, std::string* out = nullptr) {
    return testing::RunCommand(absl::StrCat(testing::CliPath(), " ", args), out);
  }
  // Cubist with only the CA variables `ca_env` ("SSL_CERT_FILE=..." or "") set.
  int CubistWithCa(const std::string& ca_env, const std::string& args, std::string* out) {
    return testing::RunCommand(absl::StrCat("env -u SSL_CERT_FILE -u SSL_CERT_DIR -u "
                                            "CURL_CA_BUNDLE ", ca_env, " ", testing::CliPath(),
                                            " ", args),
                               out);
  }

  // The served manifest, written elsewhere (so that its own directory holds no artifact)
  // with `base_url` as its only base URL; returns its path.
  std::string WithBaseUrl(const std::string& base_url) {
    const std::string local = tmp_.Join("local/manifest.json");
    testing::WriteFileOrDie(
        local, absl::StrReplaceAll(testing::ReadFileOrDie(repo_ + "/manifest.json"),
                                   {{"\"artifacts\"", absl::StrCat("\"base_urls\": [\"", base_url,
                                                                   "\"], \"artifacts\"")}}));
    return local;
  }

  std::string ObjectPath(int i) {
    return absl::StrCat(cache_, "/objects/sha256/", manifest_.artifacts[i].sha256.substr(0, 2),
                        "/", manifest_.artifacts[i].sha256);
  }

  testing::TempDir tmp_;
  std::string repo_, cache_, url_;
  std::vector<testing::SampleFile> files_;
  Manifest manifest_;
  std::unique_ptr<NginxServer> server_;
};

TEST_F(FetchCliTest, FetchVerifyListPathAndExitCodes) {
  Serve(20, 1000, 50000);
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("fetched 20 artifacts of cli-sample v3"));
  EXPECT_THAT(out, HasSubstr("20 downloaded"));
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("20 already cached"));
  ASSERT_EQ(Cubist(absl::StrCat("verify --deep --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("verified: 20 of 20 artifacts present and re-hashed"));

  ASSERT_EQ(Cubist(absl::StrCat("path --manifest ", url_, " --cache ", cache_, " ",
                                manifest_.artifacts[4].path), &out), 0) << out;
  EXPECT_EQ(out, ObjectPath(4) + "\n");
  ASSERT_EQ(Cubist(absl::StrCat("list --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("20 of 20 artifacts cached"));

  // Disk rot: the deep check names the file with both hashes, exits 3 (integrity),
  // removes it, and the next fetch repairs it.
  std::string rotten = files_[6].data;
  rotten[10] ^= 1;
  ::chmod(ObjectPath(6).c_str(), 0644);
  testing::WriteFileOrDie(ObjectPath(6), rotten);
  // The write changed the object's mtime, so its publish stamp no longer vouches for it:
  // even a plain verify hashes it (and leaves it for the deep one to remove).
  EXPECT_EQ(Cubist(absl::StrCat("verify --manifest ", url_, " --cache ", cache_), &out), 3)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat(manifest_.artifacts[6].path, ": sha256 mismatch: expected ",
                                          manifest_.artifacts[6].sha256, ", got ", Sha256Hex(rotten))));
  EXPECT_THAT(out, HasSubstr("changed after it was verified (its publish stamp no longer matches)"));
  EXPECT_EQ(Cubist(absl::StrCat("verify --deep --manifest ", url_, " --cache ", cache_), &out), 3) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat(manifest_.artifacts[6].path, ": sha256 mismatch: expected ",
                                          manifest_.artifacts[6].sha256, ", got ", Sha256Hex(rotten))));
  EXPECT_THAT(out, HasSubstr("removed from the cache, run 'cubist fetch' to repair"));
  EXPECT_EQ(Cubist(absl::StrCat("verify --manifest ", url_, " --cache ", cache_), &out), 5) << out;
  EXPECT_THAT(out, HasSubstr("1 missing"));
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("1 downloaded"));
  EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(6)), files_[6].data);

  // Usage errors are 2; a path not in the manifest is 5.
  EXPECT_EQ(Cubist("fetch --cache x", &out), 2) << out;
  EXPECT_THAT(out, HasSubstr("cubist: error: --manifest is required"));
  EXPECT_EQ(Cubist(absl::StrCat("path --manifest ", url_, " --cache ", cache_, " no/such"), &out), 5);
  EXPECT_THAT(out, HasSubstr("no/such is neither an artifact path nor a kernel name"));
}

// The warm path (everything cached: no per-artifact plan) must still see each object:
// truncated, deleted or replaced by a directory, it is fetched again, and its answers
// (--json entries, --filter, the summary) are the full path's.
TEST_F(FetchCliTest, AWarmFetchStillChecksEveryObjectAndReportsLikeAFullOne) {
  Serve(6, 1000, 5000);
  std::string out;
  const std::string fetch = absl::StrCat("fetch --manifest ", url_, " --cache ", cache_);
  ASSERT_EQ(Cubist(fetch, &out), 0) << out;
  ASSERT_EQ(Cubist(fetch, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("fetched 6 artifacts of cli-sample v3"));
  EXPECT_THAT(out, HasSubstr("0 downloaded, 0 reused from another process, 6 already cached"));

  ASSERT_EQ(Cubist(fetch + " --json", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("\"cached\": 6"));
  size_t entries = 0;
  for (size_t at = 0; (at = out.find("\"outcome\": \"cached\"", at)) != std::string::npos; ++at) {
    ++entries;
  }
  EXPECT_EQ(entries, 6u);
  for (const Artifact& a : manifest_.artifacts) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("\"path\": \"", a.path, "\",\n      \"sha256\": \"",
                                            a.sha256, "\"")));
  }

  const std::string one = absl::StrCat(fetch, " --filter '", manifest_.artifacts[1].path, "'");
  ASSERT_EQ(Cubist(one, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("fetched 1 artifacts of cli-sample v3"));
  EXPECT_THAT(out, HasSubstr("1 already cached"));
  EXPECT_EQ(Cubist(fetch + " --filter 'no/such/*'", &out), 5) << out;
  EXPECT_THAT(out, HasSubstr("matches --filter no/such/*"));

  // Truncated by one byte, deleted, and a directory in an object's place.
  ::chmod(ObjectPath(0).c_str(), 0644);
  ASSERT_EQ(::truncate(ObjectPath(0).c_str(), static_cast<off_t>(files_[0].data.size() - 1)), 0);
  ASSERT_EQ(::unlink(ObjectPath(3).c_str()), 0);
  ASSERT_EQ(Cubist(fetch, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("2 downloaded, 0 reused from another process, 4 already cached"));
  EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(0)), files_[0].data);
  EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(3)), files_[3].data);
  ASSERT_EQ(::unlink(ObjectPath(5).c_str()), 0);
  ASSERT_EQ(::mkdir(ObjectPath(5).c_str(), 0755), 0);
  // Not taken for the object: the full path sees it, and cannot remove it.
  EXPECT_NE(Cubist(fetch, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("fetch ", manifest_.artifacts[5].path, ": remove ",
                                          ObjectPath(5), ": Is a directory")));
  EXPECT_THAT(out, HasSubstr("5 already cached, 1 failed"));
}

TEST_F(FetchCliTest, CorruptServerFileExitsWithIntegrityCode) {
  Serve(5, 1000, 5000);
  testing::WriteFileOrDie(repo_ + "/" + manifest_.artifacts[1].path, "tampered");
  std::string out;
  EXPECT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_), &out), 3) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("cubist: error: fetch ", manifest_.artifacts[1].path,
                                          " from ", server_->BaseUrl(), manifest_.artifacts[1].path,
                                          ": size mismatch: expected ")));
  EXPECT_THAT(out, HasSubstr("4 downloaded"));
  EXPECT_THAT(out, HasSubstr("1 failed"));
}

// A manifest that states a wrong size for a known hash cannot evict the object (which
// another set needs): fetch and verify, plain and deep, blame the manifest entry with
// both sizes (exit 3) and the object stays.
TEST_F(FetchCliTest, AWrongSizeInAManifestNeverEvictsAnObjectThatHashesRight) {
  Serve(3, 1000, 5000);
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch -q --manifest ", url_, " --cache ", cache_), &out), 0)
      << out;
  const Artifact& a = manifest_.artifacts[1];
  const std::string liar = tmp_.Join("liar.json");
  testing::WriteFileOrDie(
      liar, absl::StrCat(R"({"schema": "cubist.manifest/1", "name": "liar", "version": 1, )",
                         R"("base_urls": [")", server_->BaseUrl(), R"("], "artifacts": [)",
                         R"({"path": "evict.cubin", "sha256": ")", a.sha256, R"(", "size": )",
                         *a.size + 1, "}]}"));
  const std::string blame =
      absl::StrCat("evict.cubin: the manifest ", liar, " says ", *a.size + 1,
                   " bytes, but the cached object sha256 ", a.sha256, " has ", *a.size,
                   " bytes and hashes to its name: the manifest entry is wrong");
  for (const char* command : {"fetch", "verify", "verify --deep"}) {
    SCOPED_TRACE(command);
    EXPECT_EQ(Cubist(absl::StrCat(command, " --manifest ", liar, " --cache ", cache_), &out), 3)
        << out;
    EXPECT_THAT(out, HasSubstr(blame));
    EXPECT_THAT(out, ::testing::Not(HasSubstr("removed from the cache")));
    EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(1)), files_[1].data);
  }
  EXPECT_EQ(Cubist(absl::StrCat("verify --deep --manifest ", url_, " --cache ", cache_), &out), 0)
      << out;
}

// A source that trickles (1 B/s) is abandoned as stalled once the stall window has
// passed, in cubist's words with the rate it got, and exits 4 (network).
TEST_F(FetchCliTest, ATrickleFailsAsTooSlowAfterTheStallWindow) {
  Serve(1, 20000, 20000, "1");
  // The manifest from disk (the server trickles everything), its artifact from the server.
  const std::string local = WithBaseUrl(server_->BaseUrl());
  std::string out;
  const absl::Time start = absl::Now();
  EXPECT_EQ(Cubist(absl::StrCat("fetch -q --retries 1 --stall-seconds 2 --manifest ", local,
                                " --cache ", cache_),
                   &out),
            4)
      << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("from ", server_->BaseUrl(),
                                          manifest_.artifacts[0].path, ": too slow (")));
  EXPECT_THAT(out, HasSubstr(" B/s for 2 s; the floor is 1024 B/s): the source or the network "
                             "is stalled"));
}

// The manifest itself from a source that trickles: its read ends after --stall-seconds
// too (each of its attempts), exit 4, instead of waiting out the whole transfer.
TEST_F(FetchCliTest, ATricklingManifestFailsAfterTheStallWindow) {
  Serve(1, 1000, 1000, "1");
  std::string out;
  const absl::Time start = absl::Now();
  EXPECT_EQ(Cubist(absl::StrCat("fetch -q --stall-seconds 1 --manifest ", url_, " --cache ",
                                cache_),
                   &out),
            4)
      << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat(url_, ": Operation too slow")));
  EXPECT_THAT(out, HasSubstr("(4 attempts)"));
}

// A directory or a FIFO planted where an object's partial download goes (tmp/<hash>.part)
// is replaced, and the fetch succeeds.
TEST_F(FetchCliTest, ADirectoryOrAFifoAtAPartPathIsReplaced) {
  Serve(2, 1000, 5000);
  const std::string part0 = absl::StrCat(cache_, "/tmp/", manifest_.artifacts[0].sha256, ".part");
  const std::string part1 = absl::StrCat(cache_, "/tmp/", manifest_.artifacts[1].sha256, ".part");
  testing::WriteFileOrDie(part0 + "/inside", "x");
  ASSERT_EQ(::mkfifo(part1.c_str(), 0644), 0);
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_), &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("2 downloaded"));
  EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(0)), files_[0].data);
  EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(1)), files_[1].data);
  EXPECT_FALSE(testing::FileExists(part0));
  EXPECT_FALSE(testing::FileExists(part1));
}

// HTTPS with a private CA: unknown to cubist, or the right CA for another host name,
// the manifest read and the artifacts' downloads fail at once with exit 7 (trust: no
// retry helps) naming the variables that add a CA; with SSL_CERT_FILE or CURL_CA_BUNDLE
// naming the CA they succeed.
TEST_F(FetchCliTest, TlsTrustFailuresExit7NamingTheCaVariables) {
  absl::StatusOr<testing::TestTls> tls = testing::MakeTestTls(tmp_.Join("tls"));
  ASSERT_TRUE(tls.ok()) << tls.status();
  Serve(3, 1000, 5000, "", &*tls);
  const std::string fix = "add the CA that issued it with SSL_CERT_FILE, SSL_CERT_DIR or "
                          "CURL_CA_BUNDLE";
  const std::string trust_ca = "SSL_CERT_FILE=" + tls->ca;
  std::string out;
  const absl::Time start = absl::Now();
  EXPECT_EQ(CubistWithCa("", absl::StrCat("fetch -q --manifest ", url_, " --cache ", cache_),
                         &out),
            7)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("cubist: error: ", url_, ": ")));
  EXPECT_THAT(out, HasSubstr(fix));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "a trust failure is not retried";

  const std::string wrong_host = absl::StrCat("https://127.0.0.1:", server_->port(),
                                              "/manifest.json");
  EXPECT_EQ(CubistWithCa(trust_ca,
                         absl::StrCat("fetch -q --manifest ", wrong_host, " --cache ", cache_),
                         &out),
            7)
      << out;
  EXPECT_THAT(out, HasSubstr(fix));

  // The manifest from disk, its artifacts over HTTPS only.
  const std::string local = WithBaseUrl(server_->BaseUrl());
  EXPECT_EQ(CubistWithCa("", absl::StrCat("fetch -q --manifest ", local, " --cache ", cache_),
                         &out),
            7)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("from ", server_->BaseUrl())));
  EXPECT_THAT(out, HasSubstr(fix));

  ASSERT_EQ(CubistWithCa("CURL_CA_BUNDLE=" + tls->ca,
                         absl::StrCat("fetch -q --manifest ", local, " --cache ", cache_), &out),
            0)
      << out;
  ASSERT_EQ(CubistWithCa(trust_ca, absl::StrCat("fetch --manifest ", url_, " --cache ", cache_),
                         &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("3 already cached"));
}

TEST_F(FetchCliTest, OfflineUsesTheCachedManifestAndListsWhatIsMissing) {
  Serve(6, 1000, 5000);
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_,
                                " --filter 'cubins/sm_90a/k[0-2].cubin'"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("fetched 3 artifacts"));
  server_->Stop();
  EXPECT_EQ(Cubist(absl::StrCat("fetch --offline --manifest ", url_, " --cache ", cache_), &out), 5) << out;
  for (int i = 3; i < 6; ++i) {
    EXPECT_THAT(out, HasSubstr(absl::StrCat("fetch ", manifest_.artifacts[i].path,
                                            ": not in the cache, and --offline forbids")));
  }
  EXPECT_THAT(out, HasSubstr("3 already cached"));
  // An uncached manifest URL offline says what to do.
  EXPECT_EQ(Cubist(absl::StrCat("fetch --offline --manifest http://127.0.0.1:1/none.json --cache ",
                                cache_), &out), 5);
  EXPECT_THAT(out, HasSubstr("the cache holds no copy of this manifest"));
}

TEST_F(FetchCliTest, EightProcessesDownloadEachArtifactOnce) {
  Serve(40, 20000, 120000, "2m");  // slow enough that all eight overlap
  std::string cmd = absl::StrCat("for i in 1 2 3 4 5 6 7 8; do ", testing::CliPath(),
                                 " fetch -q --manifest ", url_, " --cache ", cache_,
                                 " > ", tmp_.path(), "/out.$i 2>&1 & pids=\"$pids $!\"; done; fail=0; "
                                 "for p in $pids; do wait $p || fail=1; done; exit $fail");
  std::string out;
  int rc = testing::RunCommand("bash -c '" + cmd + "'", &out);
  std::string outputs;
  for (int i = 1; i <= 8; ++i) {
    outputs += testing::ReadFileOrDie(absl::StrCat(tmp_.path(), "/out.", i));
  }
  ASSERT_EQ(rc, 0) << out << outputs;
  std::map<std::string, int> served = server_->SuccessfulRequests();
  for (const Artifact& a : manifest_.artifacts) {
    EXPECT_EQ(served["/" + a.path], 1) << a.path << " was served " << served["/" + a.path] << " times";
  }
  // Each process asked for the manifest once: 200, or 304 for those that found the copy
  // (and its ETag) an earlier one had kept.
  int manifest_reads = 0;
  for (const std::string& line : server_->AccessLog()) {
    manifest_reads += absl::StartsWith(line, "GET /manifest.json 200 ") ||
                      absl::StartsWith(line, "GET /manifest.json 304 ");
  }
  EXPECT_EQ(manifest_reads, 8);
  ASSERT_EQ(Cubist(absl::StrCat("verify --deep --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  EXPECT_TRUE(std::filesystem::is_empty(cache_ + "/tmp"));
  EXPECT_TRUE(std::filesystem::is_empty(cache_ + "/locks"));
}

TEST_F(FetchCliTest, KilledMidDownloadLeavesTheCacheConsistent) {
  Serve(8, 200000, 300000, "100k");  // about 2.5 s of transfers, all in parallel
  pid_t pid = ::fork();
  if (pid == 0) {
    std::string cli = testing::CliPath();
    ::execl(cli.c_str(), cli.c_str(), "fetch", "-q", "--manifest", url_.c_str(), "--cache",
            cache_.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // Kill once some bytes are on disk but before the end.
  for (int i = 0; i < 400; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    bool partial = std::filesystem::exists(cache_ + "/tmp") &&
                   !std::filesystem::is_empty(cache_ + "/tmp");
    if (partial && i > 30) break;
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  // Whatever is under objects/ is whole and right.
  auto store = Store::Open(cache_, false);
  ASSERT_TRUE(store.ok());
  int present = 0;
  for (size_t i = 0; i < files_.size(); ++i) {
    if (store->Probe(manifest_.artifacts[i].sha256, std::nullopt) == ObjectState::kPresent) {
      ++present;
      EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(i)), files_[i].data);
    }
  }
  EXPECT_LT(present, 8) << "the kill came too late to test anything";
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  ASSERT_EQ(Cubist(absl::StrCat("verify --deep --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  EXPECT_TRUE(std::filesystem::is_empty(cache_ + "/tmp"));
  // The partial files were resumed, not downloaded again from byte 0.
  bool resumed = false;
  for (const std::string& line : server_->AccessLog()) resumed |= line.find("\"bytes=") != std::string::npos;
  EXPECT_TRUE(resumed);
}

TEST_F(FetchCliTest, GcRemovesWhatNoKeptManifestNeeds) {
  Serve(4, 1000, 5000);
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  // An object nobody references and a stale partial download.
  std::string orphan = std::string(64, 'a');
  testing::WriteFileOrDie(absl::StrCat(cache_, "/objects/sha256/aa/", orphan), "orphan");
  testing::WriteFileOrDie(absl::StrCat(cache_, "/tmp/", std::string(64, 'b'), ".part"), "partial");
  // And the cached parse of a manifest no longer kept (the fetched one's parse stays).
  const std::string stale_parse = absl::StrCat(cache_, "/manifests/parsed/", std::string(64, 'd'));
  testing::WriteFileOrDie(stale_parse, "stale");
  ASSERT_EQ(Cubist(absl::StrCat("gc --dry-run --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("would remove 1 objects"));
  EXPECT_THAT(out, HasSubstr("lock files, 1 parsed manifests, 0 abandoned roots; kept"));
  EXPECT_TRUE(testing::FileExists(absl::StrCat(cache_, "/objects/sha256/aa/", orphan)));
  EXPECT_TRUE(testing::FileExists(stale_parse));
  ASSERT_EQ(Cubist(absl::StrCat("gc --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("removed 1 objects (6 B), 1 partial downloads"));
  EXPECT_THAT(out, HasSubstr("lock files, 1 parsed manifests, 0 abandoned roots; kept"));
  EXPECT_FALSE(testing::FileExists(stale_parse));
  EXPECT_THAT(out, HasSubstr("kept 4 objects of 1 manifests"));
  EXPECT_FALSE(testing::FileExists(absl::StrCat(cache_, "/objects/sha256/aa/", orphan)));
  ASSERT_EQ(Cubist(absl::StrCat("verify --manifest ", url_, " --cache ", cache_), &out), 0) << out;
}


TEST_F(FetchCliTest, FetchesAFlashInferChecksumsTxtAndReportsJson) {
  Serve(5, 1000, 5000);
  const std::string sums = ServeChecksums();
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --json --manifest ", sums, " --cache ", cache_), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("\"downloaded\": 5"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("\"url\": \"", server_->BaseUrl(), manifest_.artifacts[0].path)));
  EXPECT_THAT(out, HasSubstr("\"ok\": true"));
  EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(2)), files_[2].data);
}

// Whether any object has landed under the cache's objects/.
bool AnObjectLanded(const std::string& cache) {
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(cache + "/objects", ec)) {
    if (e.is_regular_file()) return true;
  }
  return false;
}

// Issue 28, item 1: a gc while a fetch runs keeps what the fetch publishes (its pending
// root), and the fetch's success means the set is there.
TEST_F(FetchCliTest, GcDuringAFetchKeepsWhatTheFetchPublishes) {
  Serve(4, 300000, 400000, "300k");  // one at a time: about 5 s in all
  const std::string log = tmp_.Join("fetch.log");
  pid_t pid = testing::SpawnCli({"fetch", "-q", "-j", "1", "--manifest", url_, "--cache", cache_},
                                log);
  bool landed = false;
  for (int i = 0; i < 3000 && !landed; ++i) {
    landed = AnObjectLanded(cache_);
    if (!landed) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(landed) << testing::ReadFileOrDie(log);
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("gc --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("removed 0 objects"));
  EXPECT_THAT(out, HasSubstr("of 0 manifests and 1 roots in use"));
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT), 0);
  EXPECT_EQ(info.si_pid, 0) << "the fetch ended before gc ran: the test proved nothing";
  ASSERT_EQ(testing::WaitChild(pid), 0) << testing::ReadFileOrDie(log);
  ASSERT_EQ(Cubist(absl::StrCat("verify --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  // Done, the fetch let go of its root: the kept manifest holds the set from now on.
  ASSERT_EQ(Cubist(absl::StrCat("gc --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("removed 0 objects"));
  EXPECT_THAT(out, HasSubstr("kept 4 objects of 1 manifests and 0 roots in use"));
}

// Issue 28, item 5: two pins of one name (FlashInfer checksums.txt at two commits) keep
// a manifest each, so gc keeps both sets.
TEST_F(FetchCliTest, TwoPinsOfOneNameAreBothKept) {
  Serve(4, 1000, 5000);
  for (int pin = 0; pin < 2; ++pin) {
    std::string sums;
    for (int i = 2 * pin; i < 2 * pin + 2; ++i) {
      const Artifact& a = manifest_.artifacts[i];
      absl::StrAppend(&sums, a.sha256, " ", a.path, "\n");
      testing::WriteFileOrDie(absl::StrCat(repo_, "/commit", pin, "/bmm/", a.path), files_[i].data);
    }
    testing::WriteFileOrDie(absl::StrCat(repo_, "/commit", pin, "/bmm/checksums.txt"), sums);
  }
  std::string out;
  for (int pin = 0; pin < 2; ++pin) {
    ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", server_->BaseUrl(), "commit", pin,
                                  "/bmm/checksums.txt --cache ", cache_), &out), 0) << out;
  }
  ASSERT_EQ(Cubist(absl::StrCat("gc --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("removed 0 objects"));
  EXPECT_THAT(out, HasSubstr("kept 4 objects of 2 manifests"));
  for (int pin = 0; pin < 2; ++pin) {
    EXPECT_EQ(Cubist(absl::StrCat("verify --offline --manifest ", server_->BaseUrl(), "commit",
                                  pin, "/bmm/checksums.txt --cache ", cache_), &out), 0) << out;
  }
}

// Issue 28, item 3 (fetch): an allowed rollback keeps both versions' objects, the
// record stays at the higher version, until the operator drops one.
TEST_F(FetchCliTest, AnAllowedRollbackKeepsBothVersions) {
  Serve(4, 1000, 5000);  // cli-sample v3
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  // v2 names only the first two files: the other two belong to v3 alone.
  const std::string v2 = tmp_.Join("v2");
  testing::WriteSampleRepo(v2, {files_[0], files_[1]}, "cli-sample", 2);
  const std::string fetch_v2 = absl::StrCat("fetch --manifest ", v2, "/manifest.json --cache ", cache_);
  EXPECT_EQ(Cubist(fetch_v2, &out), 6) << out;
  EXPECT_THAT(out, HasSubstr("version 2 is older than version 3"));
  ASSERT_EQ(Cubist(fetch_v2 + " --allow-rollback", &out), 0) << out;
  ASSERT_EQ(Cubist(absl::StrCat("gc --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("removed 0 objects"));
  EXPECT_THAT(out, HasSubstr("kept 4 objects of 2 manifests"));
  ASSERT_EQ(Cubist(absl::StrCat("verify --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  EXPECT_EQ(Cubist(fetch_v2, &out), 6) << "the record stays at v3: " << out;
}

// `gc --drop` forgets a kept manifest by name (and version); gc refuses a layout newer
// than it knows.
TEST_F(FetchCliTest, GcDropsOnlyWhatItIsToldAndRefusesANewerLayout) {
  Serve(4, 1000, 5000);
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", url_, " --cache ", cache_), &out), 0) << out;
  EXPECT_EQ(testing::ReadFileOrDie(cache_ + "/layout"), "cubist.cache/2\n");
  EXPECT_EQ(Cubist(absl::StrCat("gc --drop other --cache ", cache_), &out), 5) << out;
  EXPECT_THAT(out, HasSubstr("gc --drop other: no kept manifest is named so (kept: cli-sample@3"));
  EXPECT_EQ(Cubist(absl::StrCat("gc --drop cli-sample@2 --cache ", cache_), &out), 5) << out;

  testing::WriteFileOrDie(cache_ + "/layout", "cubist.cache/3\n");
  EXPECT_EQ(Cubist(absl::StrCat("gc --cache ", cache_), &out), 6) << out;
  EXPECT_THAT(out, HasSubstr("has layout 3, newer than this cubist knows (2); nothing was deleted"));
  testing::WriteFileOrDie(cache_ + "/layout", "cubist.cache/2\n");

  ASSERT_EQ(Cubist(absl::StrCat("gc --drop cli-sample@3 --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("dropped kept manifest cli-sample v3 (cli-sample@"));
  EXPECT_THAT(out, HasSubstr("removed 4 objects"));
  EXPECT_EQ(Cubist(absl::StrCat("verify --manifest ", url_, " --cache ", cache_), &out), 5) << out;
}

// Issue 28, items 11 and 14: a set without sizes (checksums.txt) whose object is
// truncated, or written in place through a hard link (as into an exported tree), is
// caught by the stat the warm path makes anyway (the publish stamp): fetch repairs it,
// plain verify and path refuse it, without a deep verify.
TEST_F(FetchCliTest, ObjectsChangedAfterPublishAreCaughtWithoutADeepVerify) {
  Serve(3, 1000, 5000);
  const std::string m = ServeChecksums();
  const std::string fetch = absl::StrCat("fetch --manifest ", m, " --cache ", cache_);
  std::string out;
  ASSERT_EQ(Cubist(fetch, &out), 0) << out;

  ASSERT_EQ(::truncate(ObjectPath(1).c_str(), 10), 0);
  ASSERT_EQ(Cubist(fetch, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("1 downloaded, 0 reused from another process, 2 already cached"));
  EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(1)), files_[1].data);

  // Root writes through a 0444 hard link: same size, other bytes.
  const std::string exported = tmp_.Join("exported.cubin");
  ASSERT_EQ(::link(ObjectPath(2).c_str(), exported.c_str()), 0);
  {
    int fd = ::open(exported.c_str(), O_WRONLY);
    if (fd < 0) {
      ASSERT_EQ(::chmod(exported.c_str(), 0644), 0);  // not root: make it writable
      fd = ::open(exported.c_str(), O_WRONLY);
    }
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, "XXXX", 4, 0), 4);
    ::close(fd);
  }
  EXPECT_EQ(Cubist(absl::StrCat("verify --manifest ", m, " --cache ", cache_), &out), 3) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat(manifest_.artifacts[2].path, ": sha256 mismatch: expected ",
                                          manifest_.artifacts[2].sha256)));
  EXPECT_THAT(out, HasSubstr("changed after it was verified"));
  EXPECT_EQ(Cubist(absl::StrCat("path --manifest ", m, " --cache ", cache_, " ",
                                manifest_.artifacts[2].path), &out), 3) << out;
  EXPECT_THAT(out, HasSubstr("run 'cubist fetch' to repair"));
  ASSERT_EQ(Cubist(fetch, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("1 downloaded"));
  EXPECT_EQ(testing::ReadFileOrDie(ObjectPath(2)), files_[2].data);
  ASSERT_EQ(Cubist(absl::StrCat("verify --manifest ", m, " --cache ", cache_), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("verified: 3 of 3 artifacts present and unchanged since verified"));
  EXPECT_THAT(out, HasSubstr("(0 B hashed"));
}

// An object whose publish stamp no longer matches (touched, or written since it was
// verified) is not missing: export hashes it and exports it when its bytes are still
// the right ones (stamping it again), and refuses it, exit 3 naming it, when they are not.
TEST_F(FetchCliTest, ExportHashesUnconfirmedObjectsAndUsesThoseThatMatch) {
  Serve(3, 1000, 5000);
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("fetch -q --manifest ", url_, " --cache ", cache_), &out), 0)
      << out;
  ASSERT_EQ(::utimensat(AT_FDCWD, ObjectPath(0).c_str(), nullptr, 0), 0);  // now: unstamped
  const std::string dir = tmp_.Join("exported");
  ASSERT_EQ(Cubist(absl::StrCat("export --layout plain --manifest ", url_, " --cache ", cache_,
                                " ", dir),
                   &out),
            0)
      << out;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(testing::ReadFileOrDie(dir + "/" + files_[i].path), files_[i].data) << i;
  }
  struct stat st;
  ASSERT_EQ(::stat(ObjectPath(0).c_str(), &st), 0);
  EXPECT_EQ(st.st_mtim.tv_sec, StampFor(files_[0].data.size())) << "confirmed and stamped";

  ASSERT_EQ(::chmod(ObjectPath(1).c_str(), 0644), 0);
  std::string changed = files_[1].data;
  changed[0] ^= 0x01;
  testing::WriteFileOrDie(ObjectPath(1), changed);
  EXPECT_EQ(Cubist(absl::StrCat("export --layout plain --manifest ", url_, " --cache ", cache_,
                                " ", tmp_.Join("second")),
                   &out),
            3)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("export ", files_[1].path, ": ")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("changed after it was verified (its publish stamp no "
                                          "longer matches): sha256 ",
                                          Sha256Hex(changed))));
  EXPECT_THAT(out, HasSubstr("run `cubist fetch` with the same manifest to repair it"));
  EXPECT_FALSE(testing::FileExists(tmp_.Join("second")));
}

}  // namespace
}  // namespace cubist
