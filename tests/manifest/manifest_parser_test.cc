#include "manifest/manifest_parser.h"

#include <string>

#include <nlohmann/json.hpp>

#include "absl/time/time.h"
#include "base/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Json = nlohmann::ordered_json;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
const std::string kHexA(64, 'a');
const std::string kHexB(64, 'b');

Json ValidKernel(const std::string& name = "k0", const std::string& artifact = "cubins/a.cubin") {
  return Json{{"name", name},
              {"artifact", artifact},
              {"function", "moe_gemm_kernel"},
              {"arch", "sm_90a"},
              {"op", "moe_gemm"},
              {"abi", 1},
              {"weight_format", "mxfp4"},
              {"activation_format", "bf16"},
              {"activation", "swiglu"},
              {"tile_m", 64},
              {"tile_n", 128},
              {"tile_k", 64},
              {"cluster", {2, 1, 1}},
              {"stages", 4},
              {"threads", 256},
              {"shared_mem_bytes", 98304}};
}

Json ValidManifest() {
  return Json{{"schema", "cubist.manifest/1"},
              {"name", "moe-gemm-sm90a"},
              {"version", 7},
              {"expires", "2027-01-01T00:00:00Z"},
              {"base_urls", {"https://m1.example/x/", "file:///srv/cubins/"}},
              {"artifacts",
               {{{"path", "cubins/a.cubin"}, {"sha256", kHexA}, {"size", 123}},
                {{"path", "cubins/b.cubin"}, {"sha256", kHexB}, {"size", 0}}}},
              {"kernels", {ValidKernel("k0"), ValidKernel("k1", "cubins/b.cubin")}}};
}

// ParseManifestPacked of the same bytes, its artifacts unpacked: what ParseManifest
// gives, an error included.
absl::StatusOr<Manifest> ParsePackedAndUnpack(std::string_view bytes, std::string_view source,
                                              const ManifestParseOptions& o = {}) {
  PackedArtifacts packed;
  absl::StatusOr<Manifest> m = ParseManifestPacked(bytes, source, o, &packed);
  if (m.ok()) {
    EXPECT_TRUE(m->artifacts.empty());
    m->artifacts = packed.Unpack();
  }
  return m;
}

// ParseManifest, checked against ParseManifestPacked: every case below holds for both.
absl::StatusOr<Manifest> Parse(const Json& j, const ManifestParseOptions& o = {}) {
  const std::string bytes = j.dump(2);
  absl::StatusOr<Manifest> built = ParseManifest(bytes, "manifest.json", o);
  absl::StatusOr<Manifest> packed = ParsePackedAndUnpack(bytes, "manifest.json", o);
  EXPECT_EQ(built.status(), packed.status());
  if (built.ok() && packed.ok()) EXPECT_EQ(*built, *packed);
  return built;
}

TEST(ManifestParserTest, ParsesValidManifest) {
  const std::string bytes = ValidManifest().dump(2);
  absl::StatusOr<Manifest> m = ParseManifest(bytes, "manifest.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->schema, "cubist.manifest/1");
  EXPECT_EQ(m->name, "moe-gemm-sm90a");
  EXPECT_EQ(m->version, 7);
  ASSERT_TRUE(m->expires.has_value());
  EXPECT_EQ(*m->expires, absl::FromUnixSeconds(1798761600));  // 2027-01-01T00:00:00Z
  EXPECT_THAT(m->base_urls, ElementsAre("https://m1.example/x/", "file:///srv/cubins/"));
  ASSERT_EQ(m->artifacts.size(), 2u);
  EXPECT_EQ(m->artifacts[0].path, "cubins/a.cubin");
  EXPECT_EQ(m->artifacts[0].sha256, kHexA);
  EXPECT_EQ(m->artifacts[0].size, 123u);
  EXPECT_EQ(m->artifacts[1].size, 0u);
  ASSERT_EQ(m->kernels.size(), 2u);
  const KernelSpec& k = m->kernels[0];
  EXPECT_EQ(k.name, "k0");
  EXPECT_EQ(k.artifact, "cubins/a.cubin");
  EXPECT_EQ(k.function, "moe_gemm_kernel");
  EXPECT_EQ(k.arch, "sm_90a");
  EXPECT_EQ(k.op, "moe_gemm");
  EXPECT_EQ(k.abi, 1);
  EXPECT_EQ(k.weight_format, "mxfp4");
  EXPECT_EQ(k.activation_format, "bf16");
  EXPECT_EQ(k.activation, "swiglu");
  EXPECT_EQ(k.tile_m, 64);
  EXPECT_EQ(k.tile_n, 128);
  EXPECT_EQ(k.tile_k, 64);
  EXPECT_EQ(k.cluster, (std::array<int, 3>{2, 1, 1}));
  EXPECT_EQ(k.stages, 4);
  EXPECT_EQ(k.threads, 256);
  EXPECT_EQ(k.shared_mem_bytes, 98304);
  EXPECT_EQ(m->kernels[1].artifact, "cubins/b.cubin");
  EXPECT_EQ(m->source, "manifest.json");
  EXPECT_EQ(m->digest, Sha256Hex(bytes));
  EXPECT_EQ(m->FindKernel("k1"), &m->kernels[1]);
}

TEST(ManifestParserTest, OptionalFieldsMayBeAbsent) {
  Json j = ValidManifest();
  j.erase("expires");
  j.erase("base_urls");
  j.erase("kernels");
  absl::StatusOr<Manifest> m = Parse(j);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->expires.has_value());
  EXPECT_TRUE(m->base_urls.empty());
  EXPECT_TRUE(m->kernels.empty());
}

TEST(ManifestParserTest, ClusterDefaultsToOneOneOne) {
  Json j = ValidManifest();
  j["kernels"][0].erase("cluster");
  absl::StatusOr<Manifest> m = Parse(j);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kernels[0].cluster, (std::array<int, 3>{1, 1, 1}));
}

TEST(ManifestParserTest, UnknownFieldsAreKeptAsJsonText) {
  Json j = ValidManifest();
  j["publisher"] = {{"team", "x"}, {"ids", {1, 2}}};
  j["artifacts"][0]["compressed"] = false;
  j["kernels"][1]["k_multiple"] = 128;
  j["kernels"][1]["note"] = "fast";
  absl::StatusOr<Manifest> m = Parse(j);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->extras.at("publisher"), R"({"ids":[1,2],"team":"x"})");
  EXPECT_EQ(m->extras.size(), 1u);
  EXPECT_EQ(m->artifacts[0].extras.at("compressed"), "false");
  EXPECT_EQ(m->kernels[1].extras.at("k_multiple"), "128");
  EXPECT_EQ(m->kernels[1].extras.at("note"), "\"fast\"");
  EXPECT_TRUE(m->kernels[0].extras.empty());
}

// ---- schema, name, version, expires, base_urls ----------------------------------------

TEST(ManifestParserTest, SchemaMustMatch) {
  Json j = ValidManifest();
  j["schema"] = "cubist.manifest/2";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "manifest.json: schema: this cubist reads \"cubist.manifest/1\", got "
      "\"cubist.manifest/2\"")));
  j.erase("schema");
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "manifest.json: schema: missing; expected \"cubist.manifest/1\"")));
  j["schema"] = 1;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("schema: expected \"cubist.manifest/1\", got 1")));
}

TEST(ManifestParserTest, NameRules) {
  Json j = ValidManifest();
  for (const char* ok : {"a", "A.b_c-9", "x"}) {
    j["name"] = ok;
    EXPECT_TRUE(Parse(j).ok()) << ok;
  }
  j["name"] = std::string(128, 'n');
  EXPECT_TRUE(Parse(j).ok());
  for (const std::string& bad : std::vector<std::string>{"", "has space", "slash/name", std::string(129, 'n'), "\xc3\xa9"}) {
    j["name"] = bad;
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
        "manifest.json: name: expected 1 to 128 characters from [A-Za-z0-9._-], got \"")))
        << bad;
  }
  j["name"] = 5;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("name: expected 1 to 128 characters "
                                                     "from [A-Za-z0-9._-], got 5")));
  j.erase("name");
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("manifest.json: name: missing")));
}

TEST(ManifestParserTest, VersionRules) {
  Json j = ValidManifest();
  j["version"] = 1;
  EXPECT_TRUE(Parse(j).ok());
  j["version"] = int64_t{1} << 53;
  EXPECT_TRUE(Parse(j).ok());
  const std::string expected = "manifest.json: version: expected an integer from 1 to 9007199254740992, got ";
  j["version"] = (int64_t{1} << 53) + 1;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "9007199254740993")));
  j["version"] = 0;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "0")));
  j["version"] = -3;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "-3")));
  j["version"] = 1.5;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "1.5")));
  j["version"] = "7";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "\"7\"")));
  j["version"] = nullptr;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "null")));
  // A float that happens to be whole is still a float.
  EXPECT_THAT(ParseManifest(R"({"schema":"cubist.manifest/1","name":"n","version":7.0,"artifacts":[]})",
                            "m.json"),
              StatusIs(kInvalid, HasSubstr("m.json: version: expected an integer from 1 to "
                                           "9007199254740992, got 7.0")));
  EXPECT_THAT(ParseManifest(R"({"schema":"cubist.manifest/1","name":"n","version":1e2,"artifacts":[]})",
                            "m.json"),
              StatusIs(kInvalid, HasSubstr("version: expected an integer")));
  EXPECT_THAT(ParseManifest(R"({"schema":"cubist.manifest/1","name":"n","version":18446744073709551616,"artifacts":[]})",
                            "m.json"),
              StatusIs(kInvalid, HasSubstr("version: expected an integer")));
}

TEST(ManifestParserTest, ExpiresRules) {
  Json j = ValidManifest();
  j["expires"] = "2027-01-01T01:00:00+01:00";
  absl::StatusOr<Manifest> m = Parse(j);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m->expires, absl::FromUnixSeconds(1798761600));
  j["expires"] = "2027-01-01t00:00:00.250z";
  m = Parse(j);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m->expires, absl::FromUnixSeconds(1798761600) + absl::Milliseconds(250));
  for (const char* bad : {"2027-01-01", "2027-02-30T00:00:00Z", " 2027-01-01T00:00:00Z",
                          "2027-01-01T00:00:00", "infinite-future", "2027-1-1T00:00:00Z",
                          "12027-01-01T00:00:00Z", "2027-01-01T25:00:00Z",
                          "2027-01-01T00:00:00+1:00", "2027-01-01T00:00:00.Z", "tomorrow"}) {
    j["expires"] = bad;
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
        "manifest.json: expires: expected an RFC 3339 time such as \"2027-01-01T00:00:00Z\", got \"")))
        << bad;
  }
  j["expires"] = "0000-01-01T00:00:00+01:00";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "expires: expected an RFC 3339 time within years 0000 to 9999 in UTC")));
  j["expires"] = "9999-12-31T23:59:59-00:01";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("within years 0000 to 9999")));
  j["expires"] = "0000-01-01T00:00:00Z";
  EXPECT_TRUE(Parse(j).ok());
  j["expires"] = 1798761600;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("expires: expected an RFC 3339 time "
                                                     "such as \"2027-01-01T00:00:00Z\", got 1798761600")));
}

TEST(ManifestParserTest, BaseUrlRules) {
  Json j = ValidManifest();
  j["base_urls"] = {"http://a/", "https://b/c", "file:///d"};
  EXPECT_TRUE(Parse(j).ok());
  for (const char* bad : {"ftp://a/", "/local/path", "https://", "HTTPS://a/", "https://a b/",
                          "https://a/\r\nX-Evil: 1"}) {
    j["base_urls"] = {"https://ok/", bad};
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("manifest.json: base_urls[1]: expected a URL")))
        << bad;
  }
  j["base_urls"] = "https://a/";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "base_urls: expected an array of URL strings, got \"https://a/\"")));
  j["base_urls"] = {"https://ok/", 3};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "base_urls[1]: expected a URL starting with http://, https:// or file://, got 3")));
}

// ---- artifacts -----------------------------------------------------------------------

TEST(ManifestParserTest, ArtifactsRequiredArray) {
  Json j = ValidManifest();
  j.erase("artifacts");
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("manifest.json: artifacts: missing; expected "
                                                     "an array of artifact objects")));
  j["artifacts"] = Json::object();
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("artifacts: expected an array of artifact "
                                                     "objects, got an object")));
  j["artifacts"] = {"cubins/a.cubin"};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "artifacts[0]: expected an artifact object, got \"cubins/a.cubin\"")));
}

TEST(ManifestParserTest, ArtifactSha256Rules) {
  Json j = ValidManifest();
  j["artifacts"][1]["sha256"] = std::string(63, 'a');
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "manifest.json: artifacts[1].sha256: expected 64 lowercase hex characters, got 63")));
  j["artifacts"][1]["sha256"] = std::string(65, 'a');
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "artifacts[1].sha256: expected 64 lowercase hex characters, got 65")));
  j["artifacts"][1]["sha256"] = std::string(63, 'a') + "A";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "artifacts[1].sha256: expected 64 lowercase hex characters, got \"aaaa")));
  j["artifacts"][1]["sha256"] = std::string(63, 'a') + "g";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("expected 64 lowercase hex characters")));
  j["artifacts"][1]["sha256"] = 63;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "artifacts[1].sha256: expected a string of 64 lowercase hex characters, got 63")));
  j["artifacts"][1].erase("sha256");
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "artifacts[1].sha256: missing; expected 64 lowercase hex characters")));
}

TEST(ManifestParserTest, ArtifactPathRules) {
  Json j = ValidManifest();
  const std::pair<const char*, const char*> cases[] = {
      {"/etc/passwd", "artifacts[0].path: path \"/etc/passwd\" is absolute"},
      {"a/../../x", "artifacts[0].path: path \"a/../../x\" has a \"..\" segment"},
      {"a\\b", "artifacts[0].path: path \"a\\\\b\" contains a backslash"},
      {"a//b", "artifacts[0].path: path \"a//b\" has an empty segment"},
      {"", "artifacts[0].path: empty path"},
  };
  for (const auto& [path, message] : cases) {
    j["artifacts"][0]["path"] = path;
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(std::string("manifest.json: ") + message)))
        << path;
  }
  // "\u0000" inside a JSON string decodes to a NUL byte.
  EXPECT_THAT(ParseManifest(
                  R"({"schema":"cubist.manifest/1","name":"n","version":1,"artifacts":[)"
                  R"({"path":"a\u0000b","sha256":")" + kHexA + R"(","size":1}]})",
                  "m.json"),
              StatusIs(kInvalid, HasSubstr("m.json: artifacts[0].path: path \"a\\x00b\" "
                                           "contains a NUL byte")));
  j["artifacts"][0]["path"] = 7;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "artifacts[0].path: expected a relative path string, got 7")));
  j["artifacts"][0].erase("path");
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("artifacts[0].path: missing")));
}

TEST(ManifestParserTest, DuplicateArtifactPathsNameBothIndices) {
  Json j = ValidManifest();
  j["artifacts"].push_back({{"path", "x"}, {"sha256", kHexA}, {"size", 1}});
  j["artifacts"].push_back({{"path", "cubins/a.cubin"}, {"sha256", kHexB}, {"size", 1}});
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "manifest.json: artifacts[3].path: duplicate \"cubins/a.cubin\" (also artifacts[0])")));
}

TEST(ManifestParserTest, ArtifactSizeRules) {
  Json j = ValidManifest();
  j["artifacts"][0]["size"] = int64_t{1} << 53;
  EXPECT_TRUE(Parse(j).ok());
  const std::string expected =
      "manifest.json: artifacts[0].size: expected an integer from 0 to 9007199254740992, got ";
  j["artifacts"][0]["size"] = -1;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "-1")));
  j["artifacts"][0]["size"] = (int64_t{1} << 53) + 1;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "9007199254740993")));
  j["artifacts"][0]["size"] = uint64_t{18446744073709551615u};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "18446744073709551615")));
  j["artifacts"][0]["size"] = 12.5;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "12.5")));
  j["artifacts"][0]["size"] = "12";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(expected + "\"12\"")));
  j["artifacts"][0].erase("size");
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "manifest.json: artifacts[0].size: missing; expected the file's size in bytes")));
  ManifestParseOptions lenient;
  lenient.require_artifact_size = false;
  absl::StatusOr<Manifest> m = Parse(j, lenient);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->artifacts[0].size.has_value());
}

// ---- kernels -------------------------------------------------------------------------

TEST(ManifestParserTest, KernelPositiveIntegerFields) {
  for (const char* field : {"abi", "tile_m", "tile_n", "tile_k", "stages", "threads"}) {
    const std::string prefix = std::string("manifest.json: kernels[1].") + field + ": ";
    Json j = ValidManifest();
    j["kernels"][1][field] = "64";
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(prefix + "expected a positive integer, got \"64\"")));
    j["kernels"][1][field] = 0;
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(prefix + "expected a positive integer, got 0")));
    j["kernels"][1][field] = -64;
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(prefix + "expected a positive integer, got -64")));
    j["kernels"][1][field] = 64.0;
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(prefix + "expected a positive integer, got 64.0")));
    j["kernels"][1][field] = int64_t{3000000000};
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
        prefix + "expected a positive integer no larger than 2147483647, got 3000000000")));
    j["kernels"][1].erase(field);
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(prefix + "missing; expected a positive integer")));
  }
}

TEST(ManifestParserTest, KernelStringFields) {
  for (const char* field : {"name", "function", "op", "weight_format", "activation_format",
                            "activation"}) {
    const std::string prefix = std::string("manifest.json: kernels[0].") + field + ": ";
    Json j = ValidManifest();
    j["kernels"][0][field] = "";
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(prefix + "expected a non-empty string, got \"\"")));
    j["kernels"][0][field] = 5;
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(prefix + "expected a non-empty string, got 5")));
    j["kernels"][0][field] = std::string("a\0b", 3);
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
        prefix + "expected a string without control characters, got \"a\\x00b\"")));
    j["kernels"][0].erase(field);
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(prefix + "missing; expected a non-empty string")));
  }
}

TEST(ManifestParserTest, KernelSharedMemoryMayBeZero) {
  Json j = ValidManifest();
  j["kernels"][0]["shared_mem_bytes"] = 0;
  EXPECT_TRUE(Parse(j).ok());
  j["kernels"][0]["shared_mem_bytes"] = -1;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "manifest.json: kernels[0].shared_mem_bytes: expected an integer >= 0, got -1")));
  j["kernels"][0].erase("shared_mem_bytes");
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("kernels[0].shared_mem_bytes: missing")));
}

TEST(ManifestParserTest, KernelArchRules) {
  Json j = ValidManifest();
  for (const char* ok : {"sm_90", "sm_90a", "sm_100f", "sm_100a", "sm_120", "sm_89"}) {
    j["kernels"][0]["arch"] = ok;
    EXPECT_TRUE(Parse(j).ok()) << ok;
  }
  for (const char* bad : {"sm90", "sm_9", "sm_90b", "sm_1000", "SM_90", "compute_90", "sm_09",
                          "sm_90af", "sm_"}) {
    j["kernels"][0]["arch"] = bad;
    EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
        "manifest.json: kernels[0].arch: expected an architecture such as \"sm_90a\"")))
        << bad;
  }
}

TEST(ManifestParserTest, KernelClusterRules) {
  Json j = ValidManifest();
  j["kernels"][0]["cluster"] = {1, 2};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "kernels[0].cluster: expected [x, y, z] of positive integers, got an array")));
  j["kernels"][0]["cluster"] = 2;
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("kernels[0].cluster: expected [x, y, z]")));
  j["kernels"][0]["cluster"] = {1, 0, 1};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "kernels[0].cluster[1]: expected a positive integer, got 0")));
}

TEST(ManifestParserTest, KernelArtifactMustBeListed) {
  Json j = ValidManifest();
  j["kernels"][1]["artifact"] = "cubins/missing.cubin";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "manifest.json: kernels[1].artifact: \"cubins/missing.cubin\" is not one of the "
      "artifacts' paths")));
}

TEST(ManifestParserTest, DuplicateKernelNamesNameBothIndices) {
  Json j = ValidManifest();
  j["kernels"].push_back(ValidKernel("k2"));
  j["kernels"].push_back(ValidKernel("k0"));
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "manifest.json: kernels[3].name: duplicate \"k0\" (also kernels[0])")));
}

TEST(ManifestParserTest, KernelsMustBeArrayOfObjects) {
  Json j = ValidManifest();
  j["kernels"] = Json::object();
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("kernels: expected an array of kernel objects")));
  j["kernels"] = {1};
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr("kernels[0]: expected a kernel object, got 1")));
}

// ---- document-level rules -------------------------------------------------------------

TEST(ManifestParserTest, TopLevelMustBeObject) {
  EXPECT_THAT(ParseManifest("[1, 2]", "manifest.json"), StatusIs(kInvalid, HasSubstr(
      "manifest.json: expected a JSON object at the top level, got an array")));
  EXPECT_THAT(ParseManifest("\"x\"", "manifest.json"), StatusIs(kInvalid, HasSubstr(
      "manifest.json: expected a JSON object at the top level, got \"x\"")));
}

TEST(ManifestParserTest, SyntaxErrorsGiveLineAndColumn) {
  EXPECT_THAT(ParseManifest("{\n  \"schema\": \"cubist.manifest/1\",\n  \"name\": tru }", "manifest.json"),
              StatusIs(kInvalid, StartsWith("manifest.json:3:14: syntax error: ")));
  EXPECT_THAT(ParseManifest("{\"a\": 1,}", "m.json"),
              StatusIs(kInvalid, StartsWith("m.json:1:9: syntax error: ")));
  EXPECT_THAT(ParseManifest("", "m.json"),
              StatusIs(kInvalid, AllOf(StartsWith("m.json:1:1: syntax error: "),
                                       HasSubstr("unexpected end of input"))));
  EXPECT_THAT(ParseManifest("{} {}", "m.json"),
              StatusIs(kInvalid, StartsWith("m.json:1:4: syntax error: ")));
  EXPECT_THAT(ParseManifest("{\"a\": 1} // comment", "m.json"),
              StatusIs(kInvalid, HasSubstr("syntax error")));
  EXPECT_THAT(ParseManifest("{\"version\": 1e400}", "m.json"),
              StatusIs(kInvalid, HasSubstr("m.json: invalid JSON: number overflow")));
}

TEST(ManifestParserTest, InvalidUtf8IsRefusedWithPosition) {
  EXPECT_THAT(ParseManifest("{\n \"name\": \"a\xff\"}", "manifest.json"),
              StatusIs(kInvalid, HasSubstr("manifest.json:2:12: invalid UTF-8 (byte 0xff)")));
  EXPECT_THAT(ParseManifest("{\"x\": \"\xc0\xaf\"}", "m.json"),
              StatusIs(kInvalid, HasSubstr("m.json:1:8: invalid UTF-8 (byte 0xc0)")));
  // A lone surrogate escape is invalid too (nlohmann checks escapes).
  EXPECT_THAT(ParseManifest(R"({"x": "\ud800"})", "m.json"),
              StatusIs(kInvalid, HasSubstr("syntax error")));
}

TEST(ManifestParserTest, DuplicateKeysAreRefusedWithPath) {
  EXPECT_THAT(ParseManifest(R"({"name": "a", "name": "b"})", "m.json"),
              StatusIs(kInvalid, HasSubstr("m.json: duplicate key \"name\"")));
  Json j = ValidManifest();
  std::string text = j.dump();
  // Give kernels[1] a second "tile_m".
  const std::string k1 = ValidKernel("k1", "cubins/b.cubin").dump();
  const size_t pos = text.find(k1);
  ASSERT_NE(pos, std::string::npos);
  text.insert(pos + 1, "\"tile_m\":32,");
  EXPECT_THAT(ParseManifest(text, "m.json"),
              StatusIs(kInvalid, HasSubstr("m.json: kernels[1]: duplicate key \"tile_m\"")));
}

// The artifacts are checked as the parser reads them (so that the list is never held as
// a document), yet errors come in the order the rules list them, as when the document was
// built first: a syntax error anywhere first, then schema, name, version, ..., artifacts.
TEST(ManifestParserTest, ArtifactErrorsComeInRuleOrderWhereverTheyAre) {
  const std::string bad_artifact =
      R"({"artifacts": [{"path": "a", "sha256": "x", "size": 1}], )";
  for (const auto& parse : {&ParseManifest, &ParsePackedAndUnpack}) {
    EXPECT_THAT(parse(bad_artifact + R"("schema": "cubist.manifest/1", "name": "n"})",
                      "m.json", {}),
                StatusIs(kInvalid, HasSubstr("m.json: version: missing")));
    EXPECT_THAT(parse(bad_artifact + R"("schema": "cubist.manifest/1", "name": "n", )"
                                     R"("version": 1, "x": [1,})",
                      "m.json", {}),
                StatusIs(kInvalid, StartsWith("m.json:1:")));
    EXPECT_THAT(parse(bad_artifact + R"("schema": "cubist.manifest/1", "name": "n", )"
                                     R"("version": 1})",
                      "m.json", {}),
                StatusIs(kInvalid, HasSubstr("m.json: artifacts[0].sha256: expected 64 "
                                             "lowercase hex characters, got 1")));
  }
}

TEST(ManifestParserTest, ArtifactErrorsNameTheirIndexWhenEarlierOnesAreGone) {
  Json j = ValidManifest();
  for (int i = 0; i < 5; ++i) {
    j["artifacts"].push_back(
        {{"path", "more/" + std::to_string(i)}, {"sha256", kHexA}, {"size", i}});
  }
  std::string text = j.dump();
  const size_t pos = text.find("{\"path\":\"more/3\"");
  ASSERT_NE(pos, std::string::npos);
  text.insert(pos + 1, "\"size\":1,");
  for (const auto& parse : {&ParseManifest, &ParsePackedAndUnpack}) {
    EXPECT_THAT(parse(text, "m.json", {}),
                StatusIs(kInvalid, HasSubstr("m.json: artifacts[5]: duplicate key \"size\"")));
  }
  j["artifacts"][6]["path"] = "more/2/x";
  EXPECT_THAT(Parse(j), StatusIs(kInvalid, HasSubstr(
      "manifest.json: artifacts[6].path: \"more/2/x\" lies under \"more/2\" (artifacts[4])")));
}

TEST(ManifestParserTest, PackedParseOfAChecksumsFreeManifestKeepsMissingSizes) {
  Json j = ValidManifest();
  j["artifacts"][1].erase("size");
  j["artifacts"][1]["x-note"] = {{"a", 1}};
  ManifestParseOptions o;
  o.require_artifact_size = false;
  absl::StatusOr<Manifest> m = Parse(j, o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->artifacts[1].size.has_value());
  EXPECT_EQ(m->artifacts[1].extras.at("x-note"), R"({"a":1})");
}

TEST(ManifestParserTest, DeepNestingIsRefusedBeforeParsing) {
  ManifestParseOptions o;
  std::string deep = "{\"schema\": \"cubist.manifest/1\", \"x\": " + std::string(100, '[') +
                     std::string(100, ']') + "}";
  EXPECT_THAT(ParseManifest(deep, "m.json", o),
              StatusIs(kInvalid, HasSubstr("m.json:1:101: nesting deeper than 64 levels")));
  // Brackets inside strings do not count.
  Json j = ValidManifest();
  j["note"] = std::string(1000, '[');
  EXPECT_TRUE(Parse(j).ok());
  // A million open brackets: refused quickly, without building anything.
  EXPECT_THAT(ParseManifest(std::string(1 << 20, '['), "m.json"),
              StatusIs(kInvalid, HasSubstr("m.json:1:65: nesting deeper than 64 levels")));
  // Exactly at the limit is fine as far as depth goes.
  std::string at_limit = "{\"schema\": \"cubist.manifest/1\", \"name\": \"n\", \"version\": 1, "
                         "\"artifacts\": [], \"x\": " + std::string(63, '[') + std::string(63, ']') + "}";
  EXPECT_TRUE(ParseManifest(at_limit, "m.json").ok()) << ParseManifest(at_limit, "m.json").status();
}

// Regression: nlohmann's callback parser rescans the enclosing array at the end of every
// object, so 100k artifacts took 12 s and "[{},{},...]" grew quadratically. The SAX
// builder is linear: 300k objects parse in well under a second.
TEST(ManifestParserTest, LargeArraysOfObjectsParseInLinearTime) {
  std::string bytes = R"({"schema": "cubist.manifest/1", "name": "n", "version": 1, "artifacts": [], "x": [)";
  for (int i = 0; i < 300000; ++i) bytes += i == 0 ? "{}" : ",{}";
  bytes += "]}";
  const absl::Time start = absl::Now();
  absl::StatusOr<Manifest> m = ParseManifest(bytes, "m.json");
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->extras.at("x").size(), 300000u * 3 - 1 + 2);
  EXPECT_LT(took, absl::Seconds(5));
}

TEST(ManifestParserTest, OversizedInputIsRefusedUnread) {
  ManifestParseOptions o;
  o.max_bytes = 100;
  const std::string bytes = "{" + std::string(200, ' ') + "}";
  EXPECT_THAT(ParseManifest(bytes, "m.json", o), StatusIs(kInvalid, HasSubstr(
      "m.json: 202 bytes is over the limit of 100 bytes")));
}

TEST(ManifestParserTest, ErrorValuesAreQuotedSafely) {
  Json j = ValidManifest();
  j["kernels"][0]["tile_m"] = std::string(10000, 'x') + "\n";
  absl::Status s = Parse(j).status();
  EXPECT_THAT(s, StatusIs(kInvalid, HasSubstr("kernels[0].tile_m: expected a positive integer, got \"xxx")));
  EXPECT_LT(s.message().size(), 200u);
}

// ---- kernel lists (the builder's kernels file) ---------------------------------------

TEST(ParseKernelListTest, AcceptsArrayOrObject) {
  Json arr = {ValidKernel("a"), ValidKernel("b")};
  absl::StatusOr<std::vector<KernelSpec>> ks = ParseKernelList(arr.dump(), "kernels.json");
  ASSERT_TRUE(ks.ok()) << ks.status();
  ASSERT_EQ(ks->size(), 2u);
  EXPECT_EQ((*ks)[1].name, "b");
  Json obj = {{"kernels", arr}, {"generator", "x"}};
  ks = ParseKernelList(obj.dump(), "kernels.json");
  ASSERT_TRUE(ks.ok()) << ks.status();
  EXPECT_EQ(ks->size(), 2u);
}

TEST(ParseKernelListTest, ErrorsNamePaths) {
  Json arr = {ValidKernel("a"), ValidKernel("b")};
  arr[1]["tile_m"] = "64";
  EXPECT_THAT(ParseKernelList(arr.dump(), "kernels.json"), StatusIs(kInvalid, HasSubstr(
      "kernels.json: [1].tile_m: expected a positive integer, got \"64\"")));
  Json obj = {{"kernels", arr}};
  EXPECT_THAT(ParseKernelList(obj.dump(), "kernels.json"), StatusIs(kInvalid, HasSubstr(
      "kernels.json: kernels[1].tile_m: expected a positive integer, got \"64\"")));
  Json dup = {ValidKernel("a"), ValidKernel("a")};
  EXPECT_THAT(ParseKernelList(dup.dump(), "kernels.json"), StatusIs(kInvalid, HasSubstr(
      "kernels.json: [1].name: duplicate \"a\" (also [0])")));
  EXPECT_THAT(ParseKernelList("{}", "kernels.json"), StatusIs(kInvalid, HasSubstr(
      "kernels.json: kernels: missing; expected an array of kernel objects")));
  EXPECT_THAT(ParseKernelList("3", "kernels.json"), StatusIs(kInvalid, HasSubstr(
      "kernels.json: expected an array of kernel objects or an object with \"kernels\", got 3")));
}

}  // namespace
}  // namespace cubist
