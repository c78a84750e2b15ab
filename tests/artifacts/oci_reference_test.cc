// The pieces of OCI support that need no registry: oci:// references, authentication
// challenges, credentials from the environment, docker-style config files and
// credential helpers (scripts playing them), the image manifest a push writes, and the
// blob URLs a fetch plans.
#include <sys/stat.h>

#include <cstdlib>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "artifacts/credential_helper.h"
#include "artifacts/fetcher.h"
#include "artifacts/oci_client.h"
#include "artifacts/oci_manifest_source.h"
#include "artifacts/oci_push.h"
#include "artifacts/oci_reference.h"
#include "base/sha256.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

const std::string kHex(64, 'a');

TEST(OciReferenceTest, ParsesTagDigestPortAndNestedRepository) {
  auto r = ParseOciReference("oci://127.0.0.1:5000/team/cubins:v3");
  CUBIST_ASSERT_OK(r);
  EXPECT_EQ(r->host, "127.0.0.1:5000");
  EXPECT_EQ(r->repository, "team/cubins");
  EXPECT_EQ(r->tag, "v3");
  EXPECT_EQ(r->digest, "");
  EXPECT_TRUE(r->plain_http);
  EXPECT_EQ(r->RepositoryUrl(), "http://127.0.0.1:5000/v2/team/cubins/");
  EXPECT_EQ(r->ManifestRef(), "v3");

  auto d = ParseOciReference("oci://registry.example/cubins@sha256:" + kHex);
  CUBIST_ASSERT_OK(d);
  EXPECT_EQ(d->tag, "");
  EXPECT_EQ(d->digest, "sha256:" + kHex);
  EXPECT_FALSE(d->plain_http);
  EXPECT_EQ(d->RepositoryUrl(), "https://registry.example/v2/cubins/");
  EXPECT_EQ(d->ManifestRef(), "sha256:" + kHex);

  auto latest = ParseOciReference("oci://localhost/cubins");
  CUBIST_ASSERT_OK(latest);
  EXPECT_EQ(latest->tag, "latest");
  EXPECT_EQ(latest->ToString(), "oci://localhost/cubins:latest");
}

TEST(OciReferenceTest, RejectsBadNamesWithTheReason) {
  EXPECT_THAT(ParseOciReference("oci://h/Cubins:v1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad repository name 'Cubins'")));
  EXPECT_THAT(ParseOciReference("oci://h/c@sha256:abc"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("64 lowercase hex")));
  EXPECT_THAT(ParseOciReference("oci://h/c:v!1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad tag")));
  EXPECT_THAT(ParseOciReference("oci://hostonly"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no registry host")));
  EXPECT_THAT(ParseOciReference("oci://h/a//b:v1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad repository name")));
  EXPECT_THAT(ParseOciReference("oci://h@x/c:v1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("in the host")));
}

TEST(OciReferenceTest, PlainHttpOnlyForLoopbackOrListedHosts) {
  ::setenv("CUBIST_REGISTRY_PLAIN_HTTP", "site-registry:5000, other", 1);
  EXPECT_TRUE(ParseOciReference("oci://site-registry:5000/c:v1")->plain_http);
  EXPECT_FALSE(ParseOciReference("oci://site-registry:5001/c:v1")->plain_http);
  EXPECT_TRUE(ParseOciReference("oci://[::1]:5000/c:v1")->plain_http);
  ::unsetenv("CUBIST_REGISTRY_PLAIN_HTTP");
  EXPECT_FALSE(ParseOciReference("oci://site-registry:5000/c:v1")->plain_http);
}

// A TLS front on the node itself (nginx before a loopback registry) is listed to be
// spoken to over HTTPS; other loopback registries stay plain.
TEST(OciReferenceTest, HttpsForListedLoopbackHosts) {
  ::setenv("CUBIST_REGISTRY_HTTPS", "localhost:5443,127.0.0.1:5443", 1);
  EXPECT_FALSE(ParseOciReference("oci://localhost:5443/c:v1")->plain_http);
  EXPECT_EQ(ParseOciReference("oci://localhost:5443/c:v1")->RepositoryUrl(),
            "https://localhost:5443/v2/c/");
  EXPECT_FALSE(ParseOciReference("oci://127.0.0.1:5443/c:v1")->plain_http);
  EXPECT_TRUE(ParseOciReference("oci://localhost:5000/c:v1")->plain_http);
  ::unsetenv("CUBIST_REGISTRY_HTTPS");
  EXPECT_TRUE(ParseOciReference("oci://localhost:5443/c:v1")->plain_http);
}

TEST(OciReferenceTest, PlanFetchAsksForBlobsByDigestMirrorsFirst) {
  Manifest m;
  m.source = "oci://127.0.0.1:5000/team/cubins:v3";
  Artifact a;
  a.path = "cubins/k 1.cubin";
  a.sha256 = kHex;
  a.size = 10;
  m.artifacts.push_back(a);
  m.base_urls.push_back("http://ignored.example/");
  std::vector<FetchItem> items = PlanFetch(m, {"http://mirror:6000/"}, {});
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].urls,
            (std::vector<std::string>{"http://mirror:6000/v2/team/cubins/blobs/sha256:" + kHex,
                                      "http://127.0.0.1:5000/v2/team/cubins/blobs/sha256:" + kHex}));
}

TEST(AuthChallengeTest, ParsesBearerAndBasic) {
  auto c = ParseAuthChallenge(
      "Bearer realm=\"https://auth.example/token\",service=\"registry.example\","
      "scope=\"repository:team/cubins:pull\"");
  CUBIST_ASSERT_OK(c);
  EXPECT_EQ(c->scheme, "bearer");
  EXPECT_EQ(c->params["realm"], "https://auth.example/token");
  EXPECT_EQ(c->params["service"], "registry.example");
  EXPECT_EQ(c->params["scope"], "repository:team/cubins:pull");
  auto b = ParseAuthChallenge("Basic realm=\"cubist-test\"");
  CUBIST_ASSERT_OK(b);
  EXPECT_EQ(b->scheme, "basic");
  EXPECT_EQ(b->params["realm"], "cubist-test");
  EXPECT_THAT(ParseAuthChallenge("Bearer realm=\"open"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unterminated")));
}

TEST(AuthChallengeTest, BasicChallengeWithoutCredentialsNamesTheFix) {
  RegistryAuth auth(*ParseOciReference("oci://127.0.0.1:1/team/k:v1"), {}, "repository:team/k:pull");
  EXPECT_THAT(auth.Answer("Basic realm=\"x\"", ""),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("registry 127.0.0.1:1 requires a login for team/k")));
  RegistryCredentials creds{"bob", "hunter2", "test"};
  RegistryAuth with(*ParseOciReference("oci://127.0.0.1:1/team/k:v1"), creds, "s");
  CUBIST_ASSERT_OK(with.Answer("Basic realm=\"x\"", ""));
  std::string header = with.HeaderFor("http://127.0.0.1:1/v2/team/k/blobs/x");
  EXPECT_EQ(header, "Authorization: Basic Ym9iOmh1bnRlcjI=");
  // Never to another host.
  EXPECT_EQ(with.HeaderFor("http://mirror:1/v2/team/k/blobs/x"), "");
  // The same credentials refused: an error that names the user, not the password.
  absl::Status again = with.Answer("Basic realm=\"x\"", header);
  EXPECT_THAT(again, StatusIs(absl::StatusCode::kPermissionDenied,
                              HasSubstr("refused the credentials of user 'bob' from test")));
  EXPECT_THAT(std::string(again.message()), ::testing::Not(HasSubstr("hunter2")));
}

TEST(RegistryCredentialsTest, EnvironmentThenDockerConfig) {
  testing::TempDir tmp;
  ::unsetenv("CUBIST_REGISTRY_USERNAME");
  ::unsetenv("CUBIST_REGISTRY_PASSWORD");
  ::unsetenv("REGISTRY_AUTH_FILE");
  testing::WriteFileOrDie(tmp.Join("config.json"),
                          "{\"auths\": {\"https://reg.example:5000/v2/\": {\"auth\": "
                          "\"YWxpY2U6cHc6d2l0aDpjb2xvbnM=\"}, \"other\": {\"username\": \"u\", "
                          "\"password\": \"p\"}}}");
  ::setenv("DOCKER_CONFIG", tmp.path().c_str(), 1);
  auto c = LookUpRegistryCredentials("reg.example:5000");
  CUBIST_ASSERT_OK(c);
  EXPECT_EQ(c->username, "alice");
  EXPECT_EQ(c->password, "pw:with:colons");
  EXPECT_EQ(c->origin, tmp.Join("config.json"));
  auto o = LookUpRegistryCredentials("other");
  CUBIST_ASSERT_OK(o);
  EXPECT_EQ(o->username, "u");
  auto none = LookUpRegistryCredentials("unknown.example");
  CUBIST_ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
  ::setenv("CUBIST_REGISTRY_USERNAME", "env-user", 1);
  ::setenv("CUBIST_REGISTRY_PASSWORD", "env-pw", 1);
  EXPECT_EQ(LookUpRegistryCredentials("reg.example:5000")->username, "env-user");
  ::unsetenv("CUBIST_REGISTRY_USERNAME");
  ::unsetenv("CUBIST_REGISTRY_PASSWORD");
  testing::WriteFileOrDie(tmp.Join("config.json"), "{not json");
  EXPECT_THAT(LookUpRegistryCredentials("reg.example:5000"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a JSON object")));
  ::unsetenv("DOCKER_CONFIG");
}

// Docker credential helpers, played by shell scripts on PATH: docker-credential-cubist-test
// knows reg.example:5000 and nothing else, and records what it read on stdin.
class CredentialHelperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("CUBIST_REGISTRY_USERNAME");
    ::unsetenv("CUBIST_REGISTRY_PASSWORD");
    ::unsetenv("REGISTRY_AUTH_FILE");
    bin_ = tmp_.Join("bin");
    Script("cubist-test",
           "read -r host; printf %s \"$host\" > " + tmp_.Join("stdin") + "\n"
           "if [ \"$1\" = get ] && [ \"$host\" = reg.example:5000 ]; then\n"
           "  echo '{\"ServerURL\":\"reg.example:5000\",\"Username\":\"carol\",\"Secret\":\"helper-secret\"}'\n"
           "else echo 'credentials not found in native keychain'; exit 1; fi\n");
    Script("locked", "echo 'keychain is locked' >&2; exit 3\n");
    Script("leaky", "echo 'Secret=leaky-secret, not JSON'\n");
    Script("token", "echo '{\"Username\":\"<token>\",\"Secret\":\"refresh-token\"}'\n");
    Script("slow", "exec sleep 5\n");
    Script("silent", "exec >&- 2>&-; exec sleep 5\n");  // closes its outputs, stays
    old_path_ = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
    ::setenv("PATH", (bin_ + ":" + old_path_).c_str(), 1);
    ::setenv("DOCKER_CONFIG", tmp_.path().c_str(), 1);
  }
  void TearDown() override {
    ::setenv("PATH", old_path_.c_str(), 1);
    ::unsetenv("DOCKER_CONFIG");
  }
  void Script(const std::string& name, const std::string& body) {
    std::string path = bin_ + "/docker-credential-" + name;
    testing::WriteFileOrDie(path, "#!/bin/sh\n" + body);
    ASSERT_EQ(::chmod(path.c_str(), 0755), 0);
  }
  void Config(const std::string& json) { testing::WriteFileOrDie(tmp_.Join("config.json"), json); }

  testing::TempDir tmp_;
  std::string bin_;
  std::string old_path_;
};

TEST_F(CredentialHelperTest, CredHelpersWinOverAuthsAndGetTheHostOnStdin) {
  Config("{\"credHelpers\": {\"reg.example:5000\": \"cubist-test\"}, \"auths\": "
         "{\"reg.example:5000\": {\"auth\": \"YWxpY2U6cHc=\"}}}");
  auto c = LookUpRegistryCredentials("reg.example:5000");
  CUBIST_ASSERT_OK(c);
  EXPECT_EQ(c->username, "carol");
  EXPECT_EQ(c->password, "helper-secret");
  EXPECT_EQ(c->origin, absl::StrCat("docker-credential-cubist-test (", tmp_.Join("config.json"), ")"));
  EXPECT_EQ(testing::ReadFileOrDie(tmp_.Join("stdin")), "reg.example:5000");
}

TEST_F(CredentialHelperTest, CredsStoreWithNothingForTheHostFallsBackToAuths) {
  Config("{\"credsStore\": \"cubist-test\", \"auths\": {\"other.example\": {\"auth\": "
         "\"YWxpY2U6cHc=\"}}}");
  auto store = LookUpRegistryCredentials("reg.example:5000");
  CUBIST_ASSERT_OK(store);
  EXPECT_EQ(store->username, "carol");
  auto other = LookUpRegistryCredentials("other.example");  // "credentials not found"
  CUBIST_ASSERT_OK(other);
  EXPECT_EQ(other->username, "alice");
  EXPECT_EQ(other->origin, tmp_.Join("config.json"));
  auto none = LookUpRegistryCredentials("unknown.example");
  CUBIST_ASSERT_OK(none);
  EXPECT_TRUE(none->empty());
}

TEST_F(CredentialHelperTest, MissingHelperNamesItAndTheFix) {
  Config("{\"credHelpers\": {\"reg.example:5000\": \"not-installed-xyz\"}}");
  EXPECT_THAT(LookUpRegistryCredentials("reg.example:5000"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("asks docker-credential-not-installed-xyz for the credentials "
                                 "of reg.example:5000, but it is not on PATH; install it")));
  // Another host does not need it.
  CUBIST_EXPECT_OK(LookUpRegistryCredentials("other.example"));
}

TEST_F(CredentialHelperTest, FailuresNeverQuoteTheSecret) {
  Config("{\"credHelpers\": {\"a\": \"locked\", \"b\": \"leaky\", \"c\": \"token\", "
         "\"d\": \"../evil\"}}");
  EXPECT_THAT(LookUpRegistryCredentials("a"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("docker-credential-locked (for a): exited with status 3: "
                                 "keychain is locked; log in again")));
  absl::Status leaky = LookUpRegistryCredentials("b").status();
  EXPECT_THAT(leaky, StatusIs(absl::StatusCode::kFailedPrecondition,
                              HasSubstr("not the helper protocol's JSON")));
  EXPECT_THAT(std::string(leaky.message()), ::testing::Not(HasSubstr("leaky-secret")));
  absl::Status token = LookUpRegistryCredentials("c").status();
  EXPECT_THAT(token, StatusIs(absl::StatusCode::kFailedPrecondition,
                              HasSubstr("holds an identity token")));
  EXPECT_THAT(std::string(token.message()), ::testing::Not(HasSubstr("refresh-token")));
  EXPECT_THAT(LookUpRegistryCredentials("d"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a plain name")));
}

TEST_F(CredentialHelperTest, HungHelperIsKilledAtTheDeadline) {
  absl::Time start = absl::Now();
  EXPECT_THAT(RunCredentialHelper("slow", "reg.example", absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("docker-credential-slow (for reg.example): no answer within "
                                 "300ms (killed)")));
  EXPECT_THAT(RunCredentialHelper("silent", "reg.example", absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("docker-credential-silent (for reg.example): no answer within "
                                 "300ms (killed)")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

TEST(OciPushTest, ImageManifestFollowsOrasConventions) {
  PushSource s;
  s.manifest_bytes = "{\"schema\":\"cubist.manifest/1\"}";
  s.signature = "sig";
  s.manifest.name = "set";
  s.manifest.version = 7;
  Artifact a;
  a.path = "cubins/a.cubin";
  a.sha256 = kHex;
  s.manifest.artifacts.push_back(a);
  std::string text = BuildOciImageManifest(s, {123});
  nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["schemaVersion"], 2);
  EXPECT_EQ(j["mediaType"], "application/vnd.oci.image.manifest.v1+json");
  EXPECT_EQ(j["artifactType"], "application/vnd.cubist.artifact-set.v1");
  EXPECT_EQ(j["config"]["mediaType"], "application/vnd.oci.empty.v1+json");
  EXPECT_EQ(j["config"]["digest"], absl::StrCat("sha256:", Sha256Hex("{}")));
  ASSERT_EQ(j["layers"].size(), 3u);
  EXPECT_EQ(j["layers"][0]["digest"], "sha256:" + Sha256Hex(s.manifest_bytes));
  EXPECT_EQ(j["layers"][0]["annotations"]["org.opencontainers.image.title"], "manifest.json");
  EXPECT_EQ(j["layers"][1]["mediaType"], "application/vnd.cubist.manifest.signature.v1");
  EXPECT_EQ(j["layers"][2]["digest"], "sha256:" + kHex);
  EXPECT_EQ(j["layers"][2]["size"], 123);
  EXPECT_EQ(j["layers"][2]["annotations"]["org.opencontainers.image.title"], "cubins/a.cubin");
  EXPECT_EQ(j["annotations"]["org.cubist.manifest.version"], "7");
  // Deterministic: the same set gives the same bytes, hence the same digest.
  EXPECT_EQ(BuildOciImageManifest(s, {123}), text);
}

// Refused before any request (nothing listens on 127.0.0.1:9): a reference to a digest,
// an artifact neither beside the manifest nor in a cache, and one whose file has
// another size than the manifest says.
TEST(OciPushTest, RefusesADigestAndMissingOrChangedFilesBeforeAnyRequest) {
  ::cubist::testing::TempDir dir;
  PushSource s;
  s.manifest_bytes = "{}";
  Artifact a;
  a.path = "cubins/a.cubin";
  a.sha256 = kHex;
  a.size = 5;
  s.manifest.artifacts.push_back(a);
  auto pinned = ParseOciReference("oci://127.0.0.1:9/cubins@sha256:" + kHex);
  CUBIST_ASSERT_OK(pinned);
  EXPECT_THAT(PushArtifactSet(*pinned, s, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a push names a tag, not a digest")));
  auto tagged = ParseOciReference("oci://127.0.0.1:9/cubins:v1");
  CUBIST_ASSERT_OK(tagged);
  EXPECT_THAT(PushArtifactSet(*tagged, s, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("push cubins/a.cubin: no cache to take it from")));
  s.artifact_dir = dir.path();
  EXPECT_THAT(PushArtifactSet(*tagged, s, {}),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr(absl::StrCat("push cubins/a.cubin: no file at ", dir.path(),
                                              "/cubins/a.cubin, and no cache to take it "
                                              "from"))));
  ::cubist::testing::WriteFileOrDie(dir.Join("cubins/a.cubin"), "abc");
  EXPECT_THAT(PushArtifactSet(*tagged, s, {}),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("push cubins/a.cubin: the file has 3 bytes, the manifest "
                                 "says 5")));
}

}  // namespace
}  // namespace cubist
