// The fetcher against a real nginx on loopback: happy path, corrupt and missing files,
// mirrors, a server that stops mid-run, oversize bodies, resume, planted objects.
#include "artifacts/fetcher.h"

#include <sys/stat.h>

#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "artifacts/sources.h"
#include "base/sha256.h"
#include "tests/testlib/nginx_server.h"
#include "tests/testlib/sample_repo.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::NginxServer;
using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

class FetcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
    repo_ = tmp_.Join("repo");
    files_ = testing::MakeSampleFiles(12, 1000, 200000, 42);
    manifest_ = testing::WriteSampleRepo(repo_, files_);
    StartServer("");
    auto store = Store::Open(tmp_.Join("cache"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_.emplace(*std::move(store));
    options_.backoff_base = absl::Milliseconds(10);
    options_.backoff_max = absl::Milliseconds(50);
    options_.connect_timeout = absl::Seconds(2);
  }

  void StartServer(const std::string& limit_rate) {
    NginxServer::Options o;
    o.root = repo_;
    o.workdir = tmp_.Join(absl::StrCat("nginx", servers_++));
    o.limit_rate = limit_rate;
    auto s = NginxServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

  std::vector<FetchItem> Items(const std::vector<std::string>& bases) {
    std::vector<FetchItem> items;
    for (const Artifact& a : manifest_.artifacts) {
      FetchItem it{a, {}};
      for (const std::string& b : bases) it.urls.push_back(JoinUrl(b, a.path));
      items.push_back(std::move(it));
    }
    return items;
  }

  std::string ObjectBytes(const Artifact& a) { return testing::ReadFileOrDie(store_->ObjectPath(a.sha256)); }

  int CountFiles(const std::string& dir) {
    int n = 0;
    for (auto& e : std::filesystem::directory_iterator(dir)) (void)e, ++n;
    return n;
  }

  testing::TempDir tmp_;
  std::string repo_;
  std::vector<testing::SampleFile> files_;
  Manifest manifest_;
  std::unique_ptr<NginxServer> server_;
  int servers_ = 0;
  std::optional<Store> store_;
  FetchOptions options_;
};

TEST_F(FetcherTest, DownloadsEverythingThenFindsItCached) {
  FetchReport r = FetchArtifacts(*store_, Items({server_->BaseUrl()}), options_);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.downloaded, 12);
  for (size_t i = 0; i < files_.size(); ++i) {
    EXPECT_EQ(ObjectBytes(manifest_.artifacts[i]), files_[i].data);
    struct stat st;
    ASSERT_EQ(::stat(store_->ObjectPath(manifest_.artifacts[i].sha256).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0444u);
  }
  EXPECT_EQ(CountFiles(store_->root() + "/tmp"), 0);
  EXPECT_EQ(CountFiles(store_->root() + "/locks"), 0);
  size_t requests = server_->AccessLog().size();
  FetchReport again = FetchArtifacts(*store_, Items({server_->BaseUrl()}), options_);
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(again.cached, 12);
  EXPECT_EQ(again.bytes_received, 0u);
  EXPECT_EQ(server_->AccessLog().size(), requests) << "a cached fetch touched the network";
}

TEST_F(FetcherTest, CorruptFileOnServerIsDataLossAndNeverCached) {
  const Artifact& bad = manifest_.artifacts[3];
  std::string wrong = files_[3].data;
  wrong[wrong.size() / 2] ^= 0x5a;
  testing::WriteFileOrDie(repo_ + "/" + bad.path, wrong);
  FetchReport r = FetchArtifacts(*store_, Items({server_->BaseUrl()}), options_);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.downloaded, 11);
  const ArtifactResult& res = r.results[3];
  EXPECT_THAT(res.status, StatusIs(absl::StatusCode::kDataLoss,
                                   HasSubstr(absl::StrCat("fetch ", bad.path, " from ",
                                                          server_->BaseUrl(), bad.path,
                                                          ": sha256 mismatch: expected ",
                                                          bad.sha256, ", got ",
                                                          Sha256Hex(wrong), " (",
                                                          wrong.size(), " bytes)"))));
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("sha256 mismatch")));
  EXPECT_EQ(store_->Probe(bad.sha256, bad.size), ObjectState::kMissing);
  EXPECT_EQ(CountFiles(store_->root() + "/tmp"), 0);
}

TEST_F(FetcherTest, MissingFileIsNotFoundAndOthersLand) {
  std::filesystem::remove(repo_ + "/" + manifest_.artifacts[0].path);
  FetchReport r = FetchArtifacts(*store_, Items({server_->BaseUrl()}), options_);
  EXPECT_EQ(r.downloaded, 11);
  EXPECT_THAT(r.results[0].status,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("HTTP 404 (not found)")));
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kNotFound, HasSubstr(manifest_.artifacts[0].path)));
}

TEST_F(FetcherTest, FallsBackToTheNextMirrorOn404AndOnCorruption) {
  // Mirror one has no files at all; mirror two serves a corrupt copy of artifact 5;
  // mirror three is right.
  std::string corrupt_root = tmp_.Join("corrupt");
  testing::WriteSampleRepo(corrupt_root, files_);
  testing::WriteFileOrDie(corrupt_root + "/" + manifest_.artifacts[5].path, "not the file");
  std::string empty_base = server_->BaseUrl() + "nothing-here/";
  std::string corrupt_base = NormalizeBase(corrupt_root);
  FetchReport r = FetchArtifacts(
      *store_, Items({empty_base, corrupt_base, server_->BaseUrl()}), options_);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.results[5].url, server_->BaseUrl() + manifest_.artifacts[5].path);
  EXPECT_EQ(r.results[4].url, corrupt_base + manifest_.artifacts[4].path);
  EXPECT_EQ(ObjectBytes(manifest_.artifacts[5]), files_[5].data);
}

TEST_F(FetcherTest, AllSourcesFailingListsEachOne) {
  std::string empty_base = server_->BaseUrl() + "nothing-here/";
  std::vector<FetchItem> items = Items({empty_base, server_->BaseUrl() + "also-not/"});
  items.resize(1);
  FetchReport r = FetchArtifacts(*store_, items, options_);
  EXPECT_THAT(r.results[0].status,
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat(": all 2 sources failed: from ", empty_base))));
}

TEST_F(FetcherTest, MoreBytesThanDeclaredStopsAtTheLimit) {
  Artifact& a = manifest_.artifacts[2];
  std::string bigger = files_[2].data + std::string(1 << 20, 'x');
  testing::WriteFileOrDie(repo_ + "/" + a.path, bigger);
  std::vector<FetchItem> items = Items({server_->BaseUrl()});
  FetchReport r = FetchArtifacts(*store_, {items[2]}, options_);
  EXPECT_THAT(r.results[0].status,
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("sent more than the declared ", *a.size, " bytes"))));
  EXPECT_LT(r.results[0].bytes_received, *a.size + (1 << 20));
  EXPECT_EQ(store_->Probe(a.sha256, a.size), ObjectState::kMissing);
}

TEST_F(FetcherTest, OfflineReportsMissingArtifactsWithoutNetwork) {
  options_.offline = true;
  FetchReport r = FetchArtifacts(*store_, Items({server_->BaseUrl()}), options_);
  EXPECT_EQ(r.failed, 12);
  EXPECT_THAT(r.results[0].status,
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--offline forbids the network")));
  EXPECT_TRUE(server_->AccessLog().empty());
}

TEST_F(FetcherTest, ResumesAPartialDownloadWithRange) {
  const Artifact& a = manifest_.artifacts[7];
  size_t half = files_[7].data.size() / 2;
  testing::WriteFileOrDie(store_->TempPath(a.sha256), files_[7].data.substr(0, half));
  std::vector<FetchItem> items = Items({server_->BaseUrl()});
  FetchReport r = FetchArtifacts(*store_, {items[7]}, options_);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.results[0].bytes_received, files_[7].data.size() - half);
  EXPECT_EQ(ObjectBytes(a), files_[7].data);
  bool saw_range = false;
  for (const std::string& line : server_->AccessLog()) {
    saw_range |= line.find(absl::StrCat("\"bytes=", half, "-\"")) != std::string::npos &&
                 line.find(" 206 ") != std::string::npos;
  }
  EXPECT_TRUE(saw_range) << "no 206 answer to a Range request in the access log";
}

TEST_F(FetcherTest, StalePartialWithWrongBytesIsRedownloadedFromScratch) {
  const Artifact& a = manifest_.artifacts[8];
  testing::WriteFileOrDie(store_->TempPath(a.sha256), std::string(1000, 'z'));
  std::vector<FetchItem> items = Items({server_->BaseUrl()});
  FetchReport r = FetchArtifacts(*store_, {items[8]}, options_);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(ObjectBytes(a), files_[8].data);
  EXPECT_EQ(r.results[0].attempts, 2);
}

TEST_F(FetcherTest, PlantedSymlinkOrWrongSizeObjectIsReplaced) {
  const Artifact& a = manifest_.artifacts[1];
  const Artifact& b = manifest_.artifacts[2];
  std::filesystem::create_directories(std::filesystem::path(store_->ObjectPath(a.sha256)).parent_path());
  std::filesystem::create_directories(std::filesystem::path(store_->ObjectPath(b.sha256)).parent_path());
  testing::WriteFileOrDie(tmp_.Join("evil"), "evil");
  std::filesystem::create_symlink(tmp_.Join("evil"), store_->ObjectPath(a.sha256));
  testing::WriteFileOrDie(store_->ObjectPath(b.sha256), "short");
  EXPECT_EQ(store_->Probe(a.sha256, a.size), ObjectState::kNotRegular);
  EXPECT_EQ(store_->Probe(b.sha256, b.size), ObjectState::kWrongSize);
  FetchReport r = FetchArtifacts(*store_, Items({server_->BaseUrl()}), options_);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(ObjectBytes(a), files_[1].data);
  EXPECT_EQ(ObjectBytes(b), files_[2].data);
  EXPECT_EQ(testing::ReadFileOrDie(tmp_.Join("evil")), "evil");
}

TEST_F(FetcherTest, ServerStoppedMidRunThenBackIsRetriedAndResumed) {
  server_->Stop();
  StartServer("60k");  // 12 files of up to 200 KB in parallel: about 3 s at this rate
  std::thread restarter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    server_->Stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_TRUE(server_->Restart().ok());
  });
  options_.attempts_per_source = 20;
  FetchReport r = FetchArtifacts(*store_, Items({server_->BaseUrl()}), options_);
  restarter.join();
  ASSERT_TRUE(r.status.ok()) << r.status;
  for (size_t i = 0; i < files_.size(); ++i) {
    EXPECT_EQ(ObjectBytes(manifest_.artifacts[i]), files_[i].data);
  }
  int retried = 0;
  for (const ArtifactResult& res : r.results) retried += res.attempts > 1;
  EXPECT_GT(retried, 0);
}

TEST_F(FetcherTest, ServerGoneForGoodIsUnavailableInBoundedTime) {
  std::string base = server_->BaseUrl();
  server_->Stop();
  absl::Time start = absl::Now();
  FetchReport r = FetchArtifacts(*store_, Items({base}), options_);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_EQ(r.failed, 12);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("(4 attempts)")));
  EXPECT_EQ(CountFiles(store_->root() + "/tmp"), 0);
  EXPECT_EQ(CountFiles(store_->root() + "/locks"), 0);
}


TEST_F(FetcherTest, SymlinksPlantedAtTheTempAndLockPathsAreReplacedNotFollowed) {
  const Artifact& a = manifest_.artifacts[4];
  testing::WriteFileOrDie(tmp_.Join("victim"), "do not touch");
  std::filesystem::create_symlink(tmp_.Join("victim"), store_->TempPath(a.sha256));
  std::filesystem::create_symlink(tmp_.Join("victim"), store_->LockPath(a.sha256));
  std::vector<FetchItem> items = Items({server_->BaseUrl()});
  FetchReport r = FetchArtifacts(*store_, {items[4]}, options_);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(ObjectBytes(a), files_[4].data);
  EXPECT_EQ(testing::ReadFileOrDie(tmp_.Join("victim")), "do not touch");
}

}  // namespace
}  // namespace cubist
