// OCI registries end to end, against a real registry (Debian's docker-registry,
// distribution 2.8) on loopback: push, fetch by tag and by digest, offline, tag moves,
// a pinned digest that does not match, a corrupt blob in the registry's storage,
// htpasswd (basic) logins (also through a credential helper), chunked uploads (also
// after a proxy's 413), the redirect storage middleware, the registry stopped mid-fetch
// and restarted, 8 processes into one cache, 16 nodes behind an nginx site cache
// (every blob leaves the registry once), and a TLS front with a private CA.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "artifacts/oci_push.h"
#include "artifacts/oci_reference.h"
#include "base/sha256.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/nginx_server.h"
#include "tests/testlib/registry_server.h"
#include "tests/testlib/sample_repo.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::NginxServer;
using ::cubist::testing::RegistryServer;
using ::testing::HasSubstr;
using ::testing::Not;

class OciRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (RegistryServer::BinaryPath().empty()) {
      GTEST_SKIP() << "docker-registry not installed (scripts/install-deps installs it)";
    }
    repo_ = tmp_.Join("repo");
  }

  void StartRegistry(const std::string& user = "", const std::string& password = "",
                     const std::string& extra_config = "") {
    RegistryServer::Options o;
    o.workdir = tmp_.Join("registry");
    o.user = user;
    o.password = password;
    o.extra_config = extra_config;
    auto s = RegistryServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    registry_ = *std::move(s);
  }

  void MakeRepo(int count, size_t min_size, size_t max_size) {
    files_ = testing::MakeSampleFiles(count, min_size, max_size, 11);
    manifest_ = testing::WriteSampleRepo(repo_, files_, "oci-sample", 1);
  }

  std::string Ref(const std::string& name_tag) const {
    return absl::StrCat("oci://", registry_->HostPort(), "/", name_tag);
  }

  int Cubist(const std::string& args, std::string* out = nullptr, const std::string& env = "") {
    return testing::RunCommand(absl::StrCat(env, env.empty() ? "" : " ", testing::CliPath(), " ",
                                            args),
                               out);
  }

  // Pushes the sample repo; returns the digest printed on stdout.
  std::string Push(const std::string& target, const std::string& env = "") {
    std::string out;
    int rc = Cubist(absl::StrCat("push -q --manifest ", repo_, "/manifest.json ", target), &out,
                    env);
    EXPECT_EQ(rc, 0) << out;
    return std::string(absl::StripSuffix(out, "\n"));
  }

  // Fetches the sample repo into `cache` and copies its manifest where no artifact lies
  // beside it (a push must then take them from a cache); returns the copy's path.
  std::string FetchIntoAndCopyTheManifestAlone(const std::string& cache) {
    std::string out;
    EXPECT_EQ(Cubist(absl::StrCat("fetch -q --manifest ", repo_, "/manifest.json --cache ",
                                  cache),
                     &out),
              0)
        << out;
    const std::string alone = tmp_.Join("alone/manifest.json");
    testing::WriteFileOrDie(alone, testing::ReadFileOrDie(repo_ + "/manifest.json"));
    return alone;
  }

  std::string ObjectPath(const std::string& cache, const std::string& sha) const {
    return absl::StrCat(cache, "/objects/sha256/", sha.substr(0, 2), "/", sha);
  }

  void ExpectAllCached(const std::string& cache) {
    for (size_t i = 0; i < files_.size(); ++i) {
      std::string p = ObjectPath(cache, manifest_.artifacts[i].sha256);
      ASSERT_TRUE(testing::FileExists(p)) << p;
      EXPECT_EQ(testing::ReadFileOrDie(p), files_[i].data) << files_[i].path;
    }
  }

  testing::TempDir tmp_;
  std::string repo_;
  std::vector<testing::SampleFile> files_;
  Manifest manifest_;
  std::unique_ptr<RegistryServer> registry_;
};

TEST_F(OciRegistryTest, PushThenFetchByTagByDigestAndOffline) {
  StartRegistry();
  MakeRepo(20, 1000, 60000);
  std::string digest = Push(Ref("cubist/sample:v1"));
  ASSERT_TRUE(absl::StartsWith(digest, "sha256:") && IsSha256Hex(digest.substr(7))) << digest;

  std::string out;
  std::string c1 = tmp_.Join("c1");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("cubist/sample:v1"), " --cache ", c1), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("fetched 20 artifacts of oci-sample v1"));
  EXPECT_THAT(out, HasSubstr("20 downloaded"));
  ExpectAllCached(c1);
  // Every artifact came from the registry as a blob named by its sha256.
  std::map<std::string, int> gets = registry_->BlobGets();
  for (const Artifact& a : manifest_.artifacts) EXPECT_EQ(gets["sha256:" + a.sha256], 1) << a.path;

  // Pinned: the whole set named by one digest, into another cache.
  std::string c2 = tmp_.Join("c2");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("cubist/sample@" + digest), " --cache ", c2),
                   &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("20 downloaded"));
  ExpectAllCached(c2);

  // Offline: the same command line, the registry gone.
  registry_->Stop();
  ASSERT_EQ(Cubist(absl::StrCat("fetch --offline --manifest ", Ref("cubist/sample:v1"), " --cache ",
                                c1), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("20 already cached"));
  ASSERT_EQ(Cubist(absl::StrCat("verify --offline --manifest ", Ref("cubist/sample@" + digest),
                                " --cache ", c2), &out), 0) << out;
  EXPECT_EQ(Cubist(absl::StrCat("fetch --offline --manifest ", Ref("cubist/other:v1"), " --cache ",
                                c1), &out), 5) << out;
  EXPECT_THAT(out, HasSubstr("the cache holds no copy of this artifact set"));
}

// Mirroring a fetched set: the manifest alone (no artifacts beside it), its artifacts
// taken from the cache a fetch filled; a cache without them is NotFound naming both.
TEST_F(OciRegistryTest, PushTakesArtifactsFromTheCache) {
  StartRegistry();
  MakeRepo(6, 1000, 9000);
  std::string out;
  const std::string c1 = tmp_.Join("c1");
  const std::string alone = FetchIntoAndCopyTheManifestAlone(c1);
  EXPECT_EQ(Cubist(absl::StrCat("push -q --cache ", tmp_.Join("empty"), " --manifest ", alone,
                                " ", Ref("mirror/sample:v1")),
                   &out),
            5)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("push ", files_[0].path, ": no file at ",
                                          tmp_.Join("alone/"), files_[0].path)));
  ASSERT_EQ(Cubist(absl::StrCat("push --cache ", c1, " --manifest ", alone, " ",
                                Ref("mirror/sample:v1")),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("6 artifacts, 8 blobs uploaded"));

  const std::string c2 = tmp_.Join("c2");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("mirror/sample:v1"), " --cache ", c2),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("6 downloaded"));
  ExpectAllCached(c2);
  // The set fetched from the registry, pushed on by its reference from that cache.
  ASSERT_EQ(Cubist(absl::StrCat("push -q --cache ", c2, " --manifest ", Ref("mirror/sample:v1"),
                                " ", Ref("again/sample:v1")),
                   &out),
            0)
      << out;
}

// Push from the cache hashes an object whose publish stamp no longer matches instead of
// calling it missing: pushed when its bytes are the right ones, refused (exit 3 naming
// it) when they are not.
TEST_F(OciRegistryTest, PushFromTheCacheHashesUnconfirmedObjects) {
  StartRegistry();
  MakeRepo(3, 1000, 9000);
  std::string out;
  const std::string cache = tmp_.Join("c1");
  const std::string alone = FetchIntoAndCopyTheManifestAlone(cache);
  for (const Artifact& a : manifest_.artifacts) {  // now: unstamped, bytes intact
    ASSERT_EQ(::utimensat(AT_FDCWD, ObjectPath(cache, a.sha256).c_str(), nullptr, 0), 0);
  }
  ASSERT_EQ(Cubist(absl::StrCat("push --cache ", cache, " --manifest ", alone, " ",
                                Ref("mirror/touched:v1")),
                   &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("3 artifacts, 5 blobs uploaded"));
  const std::string c2 = tmp_.Join("c2");
  ASSERT_EQ(Cubist(absl::StrCat("fetch -q --manifest ", Ref("mirror/touched:v1"), " --cache ", c2),
                   &out),
            0)
      << out;
  ExpectAllCached(c2);

  const std::string victim = ObjectPath(cache, manifest_.artifacts[2].sha256);
  ASSERT_EQ(::chmod(victim.c_str(), 0644), 0);
  std::string changed = files_[2].data;
  changed[0] ^= 0x01;
  testing::WriteFileOrDie(victim, changed);
  EXPECT_EQ(Cubist(absl::StrCat("push -q --cache ", cache, " --manifest ", alone, " ",
                                Ref("mirror/changed:v1")),
                   &out),
            3)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("push ", files_[2].path, ": ")));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("changed after it was verified (its publish stamp no "
                                          "longer matches): sha256 ",
                                          Sha256Hex(changed))));
}

TEST_F(OciRegistryTest, PushAgainSkipsEveryBlobAndGivesTheSameDigest) {
  StartRegistry();
  MakeRepo(12, 100, 5000);
  // An interrupted push, as the registry sees it: some blobs are there, no manifest.
  std::vector<testing::SampleFile> part(files_.begin(), files_.begin() + 5);
  std::string part_dir = tmp_.Join("part");
  testing::WriteSampleRepo(part_dir, part, "oci-sample", 1);
  std::string out;
  ASSERT_EQ(Cubist(absl::StrCat("push --manifest ", part_dir, "/manifest.json ",
                                Ref("cubist/partial:scratch")), &out), 0) << out;

  ASSERT_EQ(Cubist(absl::StrCat("push --manifest ", repo_, "/manifest.json ", Ref("cubist/partial:v1")),
                   &out), 0) << out;
  // The 5 artifacts and the empty config were there (a repository's blobs are
  // per repository, and the registry links ones it already stores on upload).
  EXPECT_THAT(out, HasSubstr("12 artifacts, 8 blobs uploaded"));
  EXPECT_THAT(out, HasSubstr("6 already in the registry"));
  std::string first = std::string(absl::StripSuffix(out.substr(out.rfind("sha256:")), "\n"));

  ASSERT_EQ(Cubist(absl::StrCat("push --manifest ", repo_, "/manifest.json ", Ref("cubist/partial:v1")),
                   &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("0 blobs uploaded (0 B), 14 already in the registry"));
  EXPECT_THAT(out, HasSubstr(first));
}

// Blobs over monolithic_max go up in PATCH chunks; the registry checks the digest of
// the assembled blob, and a fetch gets the exact bytes back.
TEST_F(OciRegistryTest, ChunkedUploadsOfLargeBlobs) {
  StartRegistry();
  MakeRepo(3, 300000, 700000);
  PushSource source;
  source.manifest_bytes = testing::ReadFileOrDie(repo_ + "/manifest.json");
  source.manifest = manifest_;
  source.artifact_dir = repo_;
  PushOptions options;
  options.monolithic_max = 1000;  // the artifacts, not the small blobs
  options.chunk_size = 100000;
  auto ref = ParseOciReference(Ref("cubist/chunked:v1"));
  CUBIST_ASSERT_OK(ref);
  auto report = PushArtifactSet(*ref, source, options);
  CUBIST_ASSERT_OK(report);
  EXPECT_EQ(report->blobs_uploaded, 5);
  int patches = 0;
  for (const std::string& line : registry_->AccessLog()) {
    if (absl::StartsWith(line, "PATCH /v2/cubist/chunked/blobs/uploads/")) ++patches;
  }
  EXPECT_GE(patches, 3 * 3);  // at least 3 chunks per artifact
  std::string out, cache = tmp_.Join("cache");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("cubist/chunked@" + report->digest),
                                " --cache ", cache), &out), 0) << out;
  ExpectAllCached(cache);
}

// A proxy whose body limit is smaller than a blob answers the monolithic PUT with 413;
// the push sends that blob again in chunks under the limit, and the fetch gets the
// exact bytes back.
TEST_F(OciRegistryTest, PushFallsBackToChunksWhenAProxyAnswers413) {
  if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
  StartRegistry();
  MakeRepo(3, 150000, 250000);
  NginxServer::Options o;
  o.root = tmp_.path();
  o.workdir = tmp_.Join("nginx");
  o.server_extra = absl::StrCat(
      "    client_max_body_size 100k;\n"
      "    location /v2/ {\n"
      "      proxy_pass http://", registry_->HostPort(), ";\n"
      "      proxy_set_header Host $http_host; proxy_http_version 1.1;\n"
      "      proxy_set_header Connection \"\";\n"
      "    }\n");
  auto proxy = NginxServer::Start(o);
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  PushSource source;
  source.manifest_bytes = testing::ReadFileOrDie(repo_ + "/manifest.json");
  source.manifest = manifest_;
  source.artifact_dir = repo_;
  PushOptions options;  // monolithic first: every blob is far under monolithic_max
  options.chunk_size = 64000;
  auto ref = ParseOciReference(absl::StrCat("oci://127.0.0.1:", (*proxy)->port(), "/cubist/limited:v1"));
  CUBIST_ASSERT_OK(ref);
  auto report = PushArtifactSet(*ref, source, options);
  CUBIST_ASSERT_OK(report);
  EXPECT_EQ(report->blobs_uploaded, 5);
  int refused = 0, patches = 0;
  for (const std::string& line : (*proxy)->AccessLog()) {
    if (absl::StartsWith(line, "PUT /v2/cubist/limited/blobs/uploads/") &&
        absl::StrContains(line, " 413 ")) {
      ++refused;
    }
    if (absl::StartsWith(line, "PATCH /v2/cubist/limited/blobs/uploads/") &&
        absl::StrContains(line, " 202 ")) {
      ++patches;
    }
  }
  EXPECT_EQ(refused, 3) << "one refused monolithic PUT per artifact";
  int chunks = 0;
  for (const testing::SampleFile& f : files_) chunks += static_cast<int>((f.data.size() + 63999) / 64000);
  EXPECT_EQ(patches, chunks) << "every artifact in 64,000-byte chunks";
  std::string out, cache = tmp_.Join("cache");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("cubist/limited@" + report->digest),
                                " --cache ", cache), &out), 0) << out;
  ExpectAllCached(cache);
}

// A file that changed after the manifest was built is refused by size before upload.
TEST_F(OciRegistryTest, PushRefusesAFileThatDiffersFromTheManifest) {
  StartRegistry();
  MakeRepo(2, 1000, 2000);
  testing::WriteFileOrDie(repo_ + "/" + files_[1].path, files_[1].data + "x");
  std::string out;
  EXPECT_EQ(Cubist(absl::StrCat("push --manifest ", repo_, "/manifest.json ", Ref("cubist/bad:v1")), &out),
            3) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("push ", files_[1].path, ": the file has ")));
  EXPECT_THAT(out, HasSubstr("rebuild the manifest"));
  // Same size, other bytes: the registry's digest check refuses it.
  std::string same = files_[1].data;
  same[0] ^= 1;
  testing::WriteFileOrDie(repo_ + "/" + files_[1].path, same);
  EXPECT_EQ(Cubist(absl::StrCat("push --manifest ", repo_, "/manifest.json ", Ref("cubist/bad:v1")), &out),
            3) << out;
  EXPECT_THAT(out, HasSubstr("the registry computed another sha256 than the manifest's"));
}

TEST_F(OciRegistryTest, TagMovedIsReported) {
  StartRegistry();
  MakeRepo(3, 100, 1000);
  std::string d1 = Push(Ref("cubist/moving:stable"));
  std::string out, cache = tmp_.Join("cache");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("cubist/moving:stable"), " --cache ", cache),
                   &out), 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("moved")));
  // Version 2 of the set under the same tag.
  files_ = testing::MakeSampleFiles(3, 100, 1000, 12);
  manifest_ = testing::WriteSampleRepo(repo_, files_, "oci-sample", 2);
  std::string d2 = Push(Ref("cubist/moving:stable"));
  ASSERT_NE(d1, d2);
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("cubist/moving:stable"), " --cache ", cache),
                   &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("cubist: note: ", Ref("cubist/moving:stable"),
                                          ": the tag moved from ", d1, " to ", d2)));
  ExpectAllCached(cache);
}

TEST_F(OciRegistryTest, PinnedDigestMismatchIsRefused) {
  StartRegistry();
  MakeRepo(3, 100, 1000);
  std::string digest = Push(Ref("cubist/pinned:v1"));
  // Alter the stored image manifest in place (same size, still valid JSON): the
  // registry then serves other bytes under the pinned digest.
  std::string path = registry_->BlobDataPath(digest);
  std::string data = testing::ReadFileOrDie(path);
  ASSERT_THAT(data, HasSubstr("oci-sample"));
  testing::WriteFileOrDie(path, absl::StrReplaceAll(data, {{"oci-sample", "oci-sampla"}}));
  std::string out, cache = tmp_.Join("cache");
  EXPECT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("cubist/pinned@" + digest), " --cache ", cache),
                   &out), 3) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("not the pinned ", digest, "; refused")));
  for (const Artifact& a : manifest_.artifacts) {
    EXPECT_FALSE(testing::FileExists(ObjectPath(cache, a.sha256))) << "nothing may be fetched";
  }
}

TEST_F(OciRegistryTest, CorruptBlobInRegistryStorageIsRefusedAndNeverCached) {
  StartRegistry();
  MakeRepo(6, 2000, 4000);
  Push(Ref("cubist/corrupt:v1"));
  const Artifact& bad = manifest_.artifacts[2];
  std::string path = registry_->BlobDataPath(bad.sha256);
  std::string data = testing::ReadFileOrDie(path);
  data[100] ^= 0x01;
  testing::WriteFileOrDie(path, data);

  std::string out, cache = tmp_.Join("cache");
  EXPECT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("cubist/corrupt:v1"), " --cache ", cache),
                   &out), 3) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("fetch ", bad.path)));
  EXPECT_THAT(out, HasSubstr("sha256 mismatch"));
  EXPECT_THAT(out, HasSubstr("5 downloaded"));
  EXPECT_FALSE(testing::FileExists(ObjectPath(cache, bad.sha256)));
  EXPECT_FALSE(testing::FileExists(absl::StrCat(cache, "/tmp/", bad.sha256, ".part")));
}

TEST_F(OciRegistryTest, HtpasswdLoginFromEnvironmentAndDockerConfig) {
  if (RegistryServer::HtpasswdPath().empty()) {
    GTEST_SKIP() << "htpasswd not installed (apache2-utils; scripts/install-deps installs it)";
  }
  StartRegistry("alice", "s3cret-pw");
  MakeRepo(4, 100, 3000);
  std::string out;
  // Anonymous: refused, with the fix.
  EXPECT_EQ(Cubist(absl::StrCat("push --manifest ", repo_, "/manifest.json ", Ref("team/k:v1")), &out,
                   "env -u CUBIST_REGISTRY_USERNAME HOME=" + tmp_.path()), 7) << out;
  EXPECT_THAT(out, HasSubstr("requires a login"));
  EXPECT_THAT(out, HasSubstr("CUBIST_REGISTRY_USERNAME"));
  // A wrong password: refused, naming the user, never printing the password.
  EXPECT_EQ(Cubist(absl::StrCat("push --manifest ", repo_, "/manifest.json ", Ref("team/k:v1")), &out,
                   "CUBIST_REGISTRY_USERNAME=alice CUBIST_REGISTRY_PASSWORD=wrong-pw"), 7) << out;
  EXPECT_THAT(out, HasSubstr("refused the credentials of user 'alice'"));
  EXPECT_THAT(out, Not(HasSubstr("wrong-pw")));
  // The right one.
  std::string digest;
  ASSERT_EQ(Cubist(absl::StrCat("push -q --manifest ", repo_, "/manifest.json ", Ref("team/k:v1")), &out,
                   "CUBIST_REGISTRY_USERNAME=alice CUBIST_REGISTRY_PASSWORD=s3cret-pw"), 0) << out;
  EXPECT_THAT(out, Not(HasSubstr("s3cret-pw")));
  // Fetch with a docker-style config file.
  std::string docker = tmp_.Join("docker");
  testing::WriteFileOrDie(docker + "/config.json",
                          absl::StrCat("{\"auths\": {\"", registry_->HostPort(),
                                       "\": {\"auth\": \"YWxpY2U6czNjcmV0LXB3\"}}}"));
  std::string cache = tmp_.Join("cache");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("team/k:v1"), " --cache ", cache), &out,
                   "DOCKER_CONFIG=" + docker), 0) << out;
  EXPECT_THAT(out, HasSubstr("4 downloaded"));
  ExpectAllCached(cache);
  // Anonymous fetch: refused.
  EXPECT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("team/k:v1"), " --cache ", tmp_.Join("c2")),
                   &out, "HOME=" + tmp_.path()), 7) << out;
  EXPECT_THAT(out, HasSubstr("requires a login"));
  // A credential helper named by credHelpers (a script on PATH playing one).
  std::string bin = tmp_.Join("bin");
  testing::WriteFileOrDie(bin + "/docker-credential-cubist-test",
                          "#!/bin/sh\nread -r host\n"
                          "echo \"{\\\"ServerURL\\\":\\\"$host\\\",\\\"Username\\\":\\\"alice\\\","
                          "\\\"Secret\\\":\\\"s3cret-pw\\\"}\"\n");
  ASSERT_EQ(::chmod((bin + "/docker-credential-cubist-test").c_str(), 0755), 0);
  std::string helpers = tmp_.Join("helpers");
  testing::WriteFileOrDie(helpers + "/config.json",
                          absl::StrCat("{\"credHelpers\": {\"", registry_->HostPort(),
                                       "\": \"cubist-test\"}}"));
  const std::string path_env = absl::StrCat("PATH=", bin, ":$PATH DOCKER_CONFIG=", helpers);
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("team/k:v1"), " --cache ", tmp_.Join("c3")),
                   &out, path_env), 0) << out;
  EXPECT_THAT(out, HasSubstr("4 downloaded"));
  EXPECT_THAT(out, Not(HasSubstr("s3cret-pw")));
  // The helper it names is not installed: exit 6, naming it and the fix.
  testing::WriteFileOrDie(helpers + "/config.json",
                          absl::StrCat("{\"credHelpers\": {\"", registry_->HostPort(),
                                       "\": \"absent-xyz\"}}"));
  EXPECT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("team/k:v1"), " --cache ", tmp_.Join("c4")),
                   &out, path_env), 6) << out;
  EXPECT_THAT(out, HasSubstr("docker-credential-absent-xyz"));
  EXPECT_THAT(out, HasSubstr("is not on PATH; install it"));
}

// The README's recipe for a registry that serves blobs with little CPU: the `redirect`
// storage middleware answers every blob GET with a 307 to nginx serving the registry's
// storage root. The fetch follows the redirects, verifies every blob, and the login
// never reaches the storage server (another origin), which logs the Authorization
// header it gets.
TEST_F(OciRegistryTest, RedirectMiddlewareBlobsComeFromTheStorageServerWithoutCredentials) {
  if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
  if (RegistryServer::HtpasswdPath().empty()) {
    GTEST_SKIP() << "htpasswd not installed (apache2-utils; scripts/install-deps installs it)";
  }
  std::string storage = tmp_.Join("registry") + "/storage";
  std::filesystem::create_directories(storage);
  NginxServer::Options n;
  n.root = storage;
  n.workdir = tmp_.Join("blob-nginx");
  n.http_extra = "  log_format auth '$request_method $uri $status \"$http_authorization\"';\n";
  n.server_extra = absl::StrCat(
      "    access_log ", n.workdir, "/auth.log auth;\n",
      "    location ~ \"^/docker/registry/v2/blobs/sha256/[0-9a-f]{2}/[0-9a-f]{64}/data$\" {}\n",
      "    location / { return 404; }\n");
  auto blobs = NginxServer::Start(n);
  ASSERT_TRUE(blobs.ok()) << blobs.status();
  StartRegistry("alice", "s3cret-pw",
                absl::StrCat("middleware:\n  storage:\n    - name: redirect\n      options:\n"
                             "        baseurl: ", (*blobs)->BaseUrl(), "\n"));
  MakeRepo(12, 1000, 40000);
  const std::string login = "CUBIST_REGISTRY_USERNAME=alice CUBIST_REGISTRY_PASSWORD=s3cret-pw";
  Push(Ref("team/k:v1"), login);

  std::string out;
  std::string cache = tmp_.Join("cache");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", Ref("team/k:v1"), " --cache ", cache), &out,
                   login), 0) << out;
  EXPECT_THAT(out, HasSubstr("12 downloaded"));
  ExpectAllCached(cache);

  // The registry redirected every artifact's GET and sent no blob itself.
  std::map<std::string, int> redirected;
  for (const std::string& line : registry_->AccessLog()) {
    std::vector<std::string> p = absl::StrSplit(line, ' ');
    if (p.size() == 3 && p[0] == "GET" && absl::StrContains(p[1], "/blobs/sha256:")) {
      EXPECT_EQ(p[2], "307") << line;
      redirected[p[1].substr(p[1].find("/blobs/") + 7)]++;
    }
  }
  for (const Artifact& a : manifest_.artifacts) {
    EXPECT_EQ(redirected["sha256:" + a.sha256], 1) << a.path;
  }
  // The storage server sent each artifact once and never saw the login.
  std::string log = testing::ReadFileOrDie(n.workdir + "/auth.log");
  for (const Artifact& a : manifest_.artifacts) {
    EXPECT_THAT(log, HasSubstr(absl::StrCat("GET /docker/registry/v2/blobs/sha256/",
                                            a.sha256.substr(0, 2), "/", a.sha256,
                                            "/data 200 \"-\"")))
        << a.path;
  }
  EXPECT_THAT(log, Not(HasSubstr("Basic")));
  EXPECT_THAT(log, Not(HasSubstr("Bearer")));
}

// The registry bearer-token flow against real servers: nginx in front of the registry
// answers like a token-authenticated registry (401 + WWW-Authenticate: Bearer realm=...
// unless the request carries the token) and serves the token endpoint, which wants
// HTTP basic credentials.
TEST_F(OciRegistryTest, BearerTokenFlowThroughATokenGate) {
  if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
  StartRegistry();
  MakeRepo(5, 100, 200000);
  NginxServer::Options o;
  o.root = tmp_.path();
  o.workdir = tmp_.Join("nginx");
  o.server_extra = absl::StrCat(
      "    client_max_body_size 0;\n"
      "    location = /token {\n"
      "      if ($http_authorization != \"Basic Ym9iOmdhdGUtcHc=\") { return 401; }\n"
      "      default_type application/json;\n"
      "      return 200 '{\"token\": \"tok-$arg_service\"}';\n"
      "    }\n"
      "    location /v2/ {\n"
      "      if ($http_authorization != \"Bearer tok-gate\") {\n"
      "        add_header WWW-Authenticate 'Bearer realm=\"http://$http_host/token\",service=\"gate\"' always;\n"
      "        return 401;\n"
      "      }\n"
      "      proxy_pass http://", registry_->HostPort(), ";\n"
      "      proxy_set_header Host $http_host; proxy_http_version 1.1;\n"
      "      proxy_set_header Connection \"\"; proxy_request_buffering off;\n"
      "    }\n");
  auto gate = NginxServer::Start(o);
  ASSERT_TRUE(gate.ok()) << gate.status();
  std::string ref = absl::StrCat("oci://127.0.0.1:", (*gate)->port(), "/team/tokens:v1");
  std::string out;
  std::string creds = "CUBIST_REGISTRY_USERNAME=bob CUBIST_REGISTRY_PASSWORD=gate-pw";
  ASSERT_EQ(Cubist(absl::StrCat("push --manifest ", repo_, "/manifest.json ", ref), &out, creds), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("5 artifacts, 7 blobs uploaded"));
  std::string cache = tmp_.Join("cache");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", ref, " --cache ", cache), &out, creds), 0) << out;
  EXPECT_THAT(out, HasSubstr("5 downloaded"));
  ExpectAllCached(cache);
  std::map<std::string, int> ok = (*gate)->SuccessfulRequests();
  EXPECT_GE(ok["/token"], 2);  // one login per command
  // Without credentials the token endpoint refuses: PermissionDenied with the fix.
  EXPECT_EQ(Cubist(absl::StrCat("fetch --manifest ", ref, " --cache ", tmp_.Join("c2")), &out,
                   "HOME=" + tmp_.path()), 7) << out;
  EXPECT_THAT(out, HasSubstr("requires a login for team/tokens (token endpoint answered HTTP 401)"));
  EXPECT_THAT(out, Not(HasSubstr("gate-pw")));
}

// A registry behind a TLS front: nginx with a certificate for "localhost" from a private
// CA that openssl makes here, proxying to the loopback registry, listed in
// CUBIST_REGISTRY_HTTPS. With the CA trusted through SSL_CERT_FILE, push and fetch go
// over HTTPS; with the CA unknown, or the right CA and another host name (the address
// instead of "localhost"), the first request is refused at once, exit 7 naming the
// variables that add a CA, and nothing is cached.
TEST_F(OciRegistryTest, TlsFrontTrustedOnlyThroughItsCaAndHostName) {
  if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
  StartRegistry();
  MakeRepo(4, 1000, 60000);
  absl::StatusOr<testing::TestTls> tls = testing::MakeTestTls(tmp_.Join("tls"));
  ASSERT_TRUE(tls.ok()) << tls.status();
  NginxServer::Options o;
  o.root = tmp_.path();
  o.workdir = tmp_.Join("nginx");
  o.tls_cert = tls->cert;
  o.tls_key = tls->key;
  // The registry builds upload URLs from Host and X-Forwarded-Proto.
  o.server_extra = absl::StrCat(
      "    client_max_body_size 0;\n"
      "    location /v2/ {\n"
      "      proxy_pass http://", registry_->HostPort(), ";\n"
      "      proxy_set_header Host $http_host; proxy_set_header X-Forwarded-Proto https;\n"
      "      proxy_http_version 1.1; proxy_set_header Connection \"\";\n"
      "      proxy_request_buffering off;\n"
      "    }\n");
  auto front = NginxServer::Start(o);
  ASSERT_TRUE(front.ok()) << front.status();
  const int port = (*front)->port();
  const std::string ref = absl::StrCat("oci://localhost:", port, "/cubist/tls:v1");
  // Only the CA variables given: none from the environment the test runs in.
  const std::string https = absl::StrCat(
      "env -u SSL_CERT_FILE -u SSL_CERT_DIR -u CURL_CA_BUNDLE CUBIST_REGISTRY_HTTPS=localhost:",
      port, ",127.0.0.1:", port);
  const std::string trusted = absl::StrCat(https, " SSL_CERT_FILE=", tls->ca);
  const std::string fix = "add the CA that issued it with SSL_CERT_FILE, SSL_CERT_DIR or "
                          "CURL_CA_BUNDLE";

  const std::string digest = Push(ref, trusted);
  ASSERT_TRUE(absl::StartsWith(digest, "sha256:")) << digest;
  std::string out;
  const std::string cache = tmp_.Join("cache");
  ASSERT_EQ(Cubist(absl::StrCat("fetch --manifest ", ref, " --cache ", cache), &out, trusted), 0)
      << out;
  EXPECT_THAT(out, HasSubstr("4 downloaded"));
  ExpectAllCached(cache);
  // Every blob came through the TLS front.
  std::map<std::string, int> served = (*front)->SuccessfulRequests();
  for (const Artifact& a : manifest_.artifacts) {
    EXPECT_EQ(served[absl::StrCat("/v2/cubist/tls/blobs/sha256:", a.sha256)], 1) << a.path;
  }

  const std::string other = tmp_.Join("other");
  const absl::Time start = absl::Now();
  EXPECT_EQ(Cubist(absl::StrCat("fetch --manifest ", ref, " --cache ", other), &out, https), 7)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("https://localhost:", port, "/v2/cubist/tls/")));
  EXPECT_THAT(out, HasSubstr(fix));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "a trust failure is not retried";
  EXPECT_EQ(Cubist(absl::StrCat("push -q --manifest ", repo_, "/manifest.json ", ref), &out,
                   https),
            7)
      << out;
  EXPECT_THAT(out, HasSubstr(fix));

  const std::string by_address = absl::StrCat("oci://127.0.0.1:", port, "/cubist/tls:v1");
  EXPECT_EQ(Cubist(absl::StrCat("fetch --manifest ", by_address, " --cache ", other), &out,
                   trusted),
            7)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("https://127.0.0.1:", port, "/v2/cubist/tls/")));
  EXPECT_THAT(out, HasSubstr(fix));
  for (const Artifact& a : manifest_.artifacts) {
    EXPECT_FALSE(testing::FileExists(ObjectPath(other, a.sha256))) << a.path;
  }
}

TEST_F(OciRegistryTest, RegistryStoppedMidFetchAndRestartedResumes) {
  if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
  StartRegistry();
  MakeRepo(1, 24 << 20, 24 << 20);
  Push(Ref("cubist/big:v1"));
  // nginx in front, slowed down and unbuffered, so that the transfer is under way
  // when the registry stops.
  NginxServer::Options o;
  o.root = tmp_.path();
  o.workdir = tmp_.Join("nginx");
  o.limit_rate = "6m";
  o.server_extra = absl::StrCat(
      "    location /v2/ { proxy_pass http://", registry_->HostPort(),
      "; proxy_buffering off; proxy_http_version 1.1; proxy_set_header Connection \"\"; }\n");
  auto front = NginxServer::Start(o);
  ASSERT_TRUE(front.ok()) << front.status();
  std::string cache = tmp_.Join("cache");
  std::string ref = absl::StrCat("oci://127.0.0.1:", (*front)->port(), "/cubist/big:v1");
  pid_t pid = testing::SpawnCli({"fetch", "--manifest", ref, "--cache", cache, "--retries", "10"},
                                tmp_.Join("fetch.log"));
  std::string part = absl::StrCat(cache, "/tmp/", manifest_.artifacts[0].sha256, ".part");
  bool started = false;
  for (int i = 0; i < 1000 && !started; ++i) {  // up to 10 s
    struct stat st;
    started = ::stat(part.c_str(), &st) == 0 && st.st_size > (4 << 20);
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(started) << testing::ReadFileOrDie(tmp_.Join("fetch.log"));
  registry_->Stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CUBIST_ASSERT_OK(registry_->Restart());
  EXPECT_EQ(testing::WaitChild(pid), 0) << testing::ReadFileOrDie(tmp_.Join("fetch.log"));
  ExpectAllCached(cache);
  // A later request asked for the rest only (regression: a 502 answer to the resumed
  // request made the fetcher start over from byte 0).
  bool resumed = false;
  for (const std::string& line : (*front)->AccessLog()) {
    if (absl::StrContains(line, "/blobs/sha256:") && absl::StrContains(line, " 206 ") &&
        absl::StrContains(line, "\"bytes=")) {
      resumed = true;
    }
  }
  EXPECT_TRUE(resumed) << absl::StrJoin((*front)->AccessLog(), "\n");
}

TEST_F(OciRegistryTest, EightProcessesIntoOneCachePullEachBlobOnce) {
  StartRegistry();
  MakeRepo(40, 20000, 200000);
  Push(Ref("cubist/shared:v1"));
  std::string cache = tmp_.Join("cache");
  std::vector<pid_t> pids;
  for (int i = 0; i < 8; ++i) {
    pids.push_back(testing::SpawnCli({"fetch", "-q", "--manifest", Ref("cubist/shared:v1"), "--cache",
                                      cache},
                                     tmp_.Join(absl::StrCat("fetch", i, ".log"))));
  }
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(testing::WaitChild(pids[i]), 0)
        << testing::ReadFileOrDie(tmp_.Join(absl::StrCat("fetch", i, ".log")));
  }
  ExpectAllCached(cache);
  std::map<std::string, int> gets = registry_->BlobGets();
  for (const Artifact& a : manifest_.artifacts) {
    EXPECT_EQ(gets["sha256:" + a.sha256], 1) << a.path;
  }
}

TEST_F(OciRegistryTest, SixteenNodesBehindASiteCacheTakeEachBlobOnceFromTheRegistry) {
  if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
  StartRegistry();
  MakeRepo(30, 10000, 300000);
  Push(Ref("cubist/site:v1"));
  // The recipe of README "Many nodes": blobs (immutable, named by digest) are cached
  // and collapsed into one origin request; tags are passed through.
  NginxServer::Options o;
  o.root = tmp_.path();
  o.workdir = tmp_.Join("nginx");
  o.workers = 2;
  o.http_extra = absl::StrCat("  proxy_cache_path ", tmp_.Join("nginx/cache"),
                              " levels=1:2 keys_zone=cubist_blobs:10m max_size=1g inactive=7d "
                              "use_temp_path=off;\n");
  std::string upstream = absl::StrCat("http://", registry_->HostPort());
  o.server_extra = absl::StrCat(
      "    location ~ \"^/v2/.+/blobs/sha256:[0-9a-f]{64}$\" {\n"
      "      proxy_pass ", upstream, ";\n"
      "      proxy_cache cubist_blobs; proxy_cache_key $uri; proxy_cache_valid 200 7d;\n"
      "      proxy_cache_lock on; proxy_cache_lock_timeout 10m; proxy_cache_lock_age 10m;\n"
      "      proxy_http_version 1.1; proxy_set_header Connection \"\";\n"
      "    }\n"
      "    location /v2/ { proxy_pass ", upstream,
      "; proxy_http_version 1.1; proxy_set_header Connection \"\"; }\n");
  auto cache_server = NginxServer::Start(o);
  ASSERT_TRUE(cache_server.ok()) << cache_server.status();
  // Half the nodes name the site cache as the registry, half keep the registry's name
  // and give the cache as a --mirror (asked first for the same /v2/ paths).
  std::string ref = absl::StrCat("oci://127.0.0.1:", (*cache_server)->port(), "/cubist/site:v1");
  std::string mirror = absl::StrCat("http://127.0.0.1:", (*cache_server)->port());
  std::vector<pid_t> pids;
  for (int i = 0; i < 16; ++i) {
    std::vector<std::string> args = {"fetch", "-q", "--cache", tmp_.Join(absl::StrCat("node", i)),
                                      "--manifest"};
    if (i % 2 == 0) {
      args.push_back(ref);
    } else {
      args.insert(args.end(), {Ref("cubist/site:v1"), "--mirror", mirror});
    }
    pids.push_back(testing::SpawnCli(args, tmp_.Join(absl::StrCat("node", i, ".log"))));
  }
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(testing::WaitChild(pids[i]), 0)
        << testing::ReadFileOrDie(tmp_.Join(absl::StrCat("node", i, ".log")));
  }
  for (int i = 0; i < 16; ++i) ExpectAllCached(tmp_.Join(absl::StrCat("node", i)));
  // The origin's log: every blob (artifacts and the cubist manifest) left it once.
  std::map<std::string, int> gets = registry_->BlobGets();
  for (const Artifact& a : manifest_.artifacts) {
    EXPECT_EQ(gets["sha256:" + a.sha256], 1) << a.path;
  }
  // The cubist manifest blob: once through the cache, and by the 8 nodes that read the
  // set's manifests from the registry itself (a mirror serves artifacts only).
  std::string manifest_sha = Sha256Hex(testing::ReadFileOrDie(repo_ + "/manifest.json"));
  EXPECT_EQ(gets["sha256:" + manifest_sha], 1 + 8);
}

}  // namespace
}  // namespace cubist
