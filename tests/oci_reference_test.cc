// The pieces of OCI support that need no registry: oci:// references, authentication
// challenges, credentials from the environment and docker-style config files, the
// image manifest a push writes, and the blob URLs a fetch plans.
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "artifacts/fetcher.h"
#include "artifacts/oci_client.h"
#include "artifacts/oci_manifest_source.h"
#include "artifacts/oci_push.h"
#include "artifacts/oci_reference.h"
#include "base/sha256.h"
#include "tests/test_util.h"

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

}  // namespace
}  // namespace cubist
