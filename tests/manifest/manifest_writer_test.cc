#include "manifest/manifest_writer.h"

#include <filesystem>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manifest/checksums.h"
#include "manifest/manifest_parser.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::TempDir;
using ::testing::HasSubstr;

Manifest Sample() {
  Manifest m;
  m.name = "moe-gemm-sm90a";
  m.version = 7;
  m.expires = absl::FromUnixSeconds(1798761600);  // 2027-01-01T00:00:00Z
  m.base_urls = {"https://m1/x/", "file:///srv/"};
  Artifact a;
  a.path = "cubins/k.cubin";
  a.sha256 = std::string(64, 'a');
  a.size = 123;
  a.extras["zeta"] = "true";
  a.extras["alpha"] = R"({"b":1,"a":[1,2]})";
  m.artifacts.push_back(a);
  Artifact b;
  b.path = "cubins/\xc3\xa9.cubin";
  b.sha256 = std::string(64, 'b');
  b.size = 0;
  m.artifacts.push_back(b);
  KernelSpec k;
  k.name = "k0";
  k.artifact = "cubins/k.cubin";
  k.function = "moe_gemm";
  k.arch = "sm_90a";
  k.op = "moe_gemm";
  k.abi = 1;
  k.weight_format = "mxfp4";
  k.activation_format = "bf16";
  k.activation = "swiglu";
  k.tile_m = 64;
  k.tile_n = 128;
  k.tile_k = 64;
  k.cluster = {2, 1, 1};
  k.stages = 4;
  k.threads = 256;
  k.shared_mem_bytes = 98304;
  k.extras["k_multiple"] = "128";
  m.kernels.push_back(k);
  m.extras["publisher"] = R"("team x")";
  m.extras["a_first"] = "[]";
  return m;
}

constexpr char kSampleText[] = R"({
  "schema": "cubist.manifest/1",
  "name": "moe-gemm-sm90a",
  "version": 7,
  "expires": "2027-01-01T00:00:00Z",
  "base_urls": [
    "https://m1/x/",
    "file:///srv/"
  ],
  "artifacts": [
    {
      "path": "cubins/k.cubin",
      "sha256": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "size": 123,
      "alpha": {
        "b": 1,
        "a": [1, 2]
      },
      "zeta": true
    },
    {
      "path": "cubins/é.cubin",
      "sha256": "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
      "size": 0
    }
  ],
  "kernels": [
    {
      "name": "k0",
      "artifact": "cubins/k.cubin",
      "function": "moe_gemm",
      "arch": "sm_90a",
      "op": "moe_gemm",
      "abi": 1,
      "weight_format": "mxfp4",
      "activation_format": "bf16",
      "activation": "swiglu",
      "tile_m": 64,
      "tile_n": 128,
      "tile_k": 64,
      "cluster": [2, 1, 1],
      "stages": 4,
      "threads": 256,
      "shared_mem_bytes": 98304,
      "k_multiple": 128
    }
  ],
  "a_first": [],
  "publisher": "team x"
}
)";

TEST(ManifestWriterTest, WritesTheStableForm) { EXPECT_EQ(WriteManifest(Sample()), kSampleText); }

TEST(ManifestWriterTest, RoundTripsThroughTheParser) {
  const Manifest m = Sample();
  const std::string text = WriteManifest(m);
  absl::StatusOr<Manifest> parsed = ParseManifest(text, "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  // Extras come back as compact JSON text with sorted keys; the sample's "alpha" was not.
  Manifest expected = m;
  expected.artifacts[0].extras["alpha"] = R"({"a":[1,2],"b":1})";
  EXPECT_TRUE(SameContent(*parsed, expected));
  // From here on the text is in canonical form: Write(Parse(Write(m))) == Write(m).
  const std::string canonical = WriteManifest(*parsed);
  EXPECT_EQ(canonical, WriteManifest(expected));
  absl::StatusOr<Manifest> again = ParseManifest(canonical, "m.json");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(SameContent(*again, *parsed));
  EXPECT_EQ(WriteManifest(*again), canonical);
}

TEST(ManifestWriterTest, ParseWriteIsAFixedPointForHandWrittenJson) {
  const std::string hand = R"({"kernels": [], "version": 2, "name": "n", "zz": {"y": [true, null, "s"]},
    "artifacts": [{"size": 5, "sha256": ")" + std::string(64, 'c') + R"(", "path": "a"}],
    "expires": "2030-06-01T12:00:00.5+02:00", "schema": "cubist.manifest/1"})";
  absl::StatusOr<Manifest> m = ParseManifest(hand, "hand.json");
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string once = WriteManifest(*m);
  EXPECT_THAT(once, HasSubstr("\"expires\": \"2030-06-01T10:00:00.5Z\""));
  absl::StatusOr<Manifest> m2 = ParseManifest(once, "once.json");
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_TRUE(SameContent(*m, *m2));
  EXPECT_EQ(WriteManifest(*m2), once);
}

TEST(ManifestWriterTest, ExpiresIsWrittenInUtcWithFourDigitYears) {
  Manifest m = Sample();
  for (const char* in : {"0000-01-01T00:30:00.25+00:15", "0999-12-31T23:59:60Z",
                         "9999-12-31T23:59:59.999999999Z"}) {
    absl::Time t;
    std::string err;
    ASSERT_TRUE(absl::ParseTime(absl::RFC3339_full, in, &t, &err)) << in << err;
    m.expires = t;
    const std::string text = WriteManifest(m);
    absl::StatusOr<Manifest> back = ParseManifest(text, "m.json");
    ASSERT_TRUE(back.ok()) << in << ": " << back.status();
    EXPECT_EQ(back->expires, m.expires) << in;
  }
  m.expires = absl::FromCivil(absl::CivilSecond(999, 12, 31, 23, 59, 59), absl::UTCTimeZone()) +
              absl::Milliseconds(5);
  EXPECT_THAT(WriteManifest(m), HasSubstr("\"expires\": \"0999-12-31T23:59:59.005Z\""));
}

TEST(ManifestWriterTest, OmitsUnsetOptionalFields) {
  Manifest m;
  m.name = "n";
  m.version = 1;
  Artifact a;
  a.path = "a";
  a.sha256 = std::string(64, 'd');
  m.artifacts.push_back(a);  // no size: came from a checksums.txt
  EXPECT_EQ(WriteManifest(m), R"({
  "schema": "cubist.manifest/1",
  "name": "n",
  "version": 1,
  "artifacts": [
    {
      "path": "a",
      "sha256": "dddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddddd"
    }
  ],
  "kernels": []
}
)");
  // Such a manifest parses back only when sizes are optional.
  EXPECT_FALSE(ParseManifest(WriteManifest(m), "m.json").ok());
  ManifestParseOptions lenient;
  lenient.require_artifact_size = false;
  absl::StatusOr<Manifest> back = ParseManifest(WriteManifest(m), "m.json", lenient);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameContent(*back, m));
}

TEST(ManifestWriterTest, ChecksumsManifestRoundTrips) {
  absl::StatusOr<Manifest> m =
      ParseChecksums(std::string(64, 'e') + " x/y.cubin\n", "d/checksums.txt");
  ASSERT_TRUE(m.ok()) << m.status();
  ManifestParseOptions lenient;
  lenient.require_artifact_size = false;
  absl::StatusOr<Manifest> back = ParseManifest(WriteManifest(*m), "m.json", lenient);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameContent(*back, *m));
}

TEST(ManifestWriterTest, OutputIsValidJsonEvenForBadExtras) {
  Manifest m = Sample();
  m.extras["broken"] = "{not json";
  m.extras["name"] = "\"shadow\"";  // reuses a known key: not written
  m.kernels[0].extras["tile_m"] = "1";
  const std::string text = WriteManifest(m);
  absl::StatusOr<Manifest> back = ParseManifest(text, "m.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->name, "moe-gemm-sm90a");
  EXPECT_EQ(back->extras.at("broken"), "\"{not json\"");
  EXPECT_EQ(back->kernels[0].tile_m, 64);
  EXPECT_EQ(back->kernels[0].extras.count("tile_m"), 0u);
}

TEST(ManifestWriterTest, EscapesStrings) {
  Manifest m = Sample();
  m.kernels[0].extras["note"] = R"("quote \" backslash \\ tab \t")";
  const std::string text = WriteManifest(m);
  EXPECT_THAT(text, HasSubstr(R"("note": "quote \" backslash \\ tab \t")"));
  absl::StatusOr<Manifest> back = ParseManifest(text, "m.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kernels[0].extras.at("note"), R"("quote \" backslash \\ tab \t")");
}

TEST(ManifestWriterTest, WriteManifestFileIsAtomicAndComplete) {
  TempDir dir;
  const std::string path = dir.Join("out/manifest.json");
  // Missing directory: an error, nothing written.
  absl::Status s = WriteManifestFile(Sample(), path);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  const std::string ok_path = dir.Join("manifest.json");
  ASSERT_TRUE(WriteManifestFile(Sample(), ok_path).ok());
  EXPECT_EQ(cubist::testing::ReadFileOrDie(ok_path), kSampleText);
  // Overwrites in place; no temporary file is left behind.
  Manifest m2 = Sample();
  m2.version = 8;
  ASSERT_TRUE(WriteManifestFile(m2, ok_path).ok());
  EXPECT_EQ(cubist::testing::ReadFileOrDie(ok_path), WriteManifest(m2));
  int entries = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++entries;
  EXPECT_EQ(entries, 1);
}

}  // namespace
}  // namespace cubist
