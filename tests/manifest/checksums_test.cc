#include "manifest/checksums.h"

#include <string>

#include "base/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;
const std::string kHexA(64, 'a');
const std::string kHexB = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

TEST(ChecksumsTest, ParsesFlashInferForm) {
  const std::string text = kHexA + " cubins/a.cubin\n" + kHexB + " cubins/sm_100a/b.cubin\n";
  absl::StatusOr<Manifest> m = ParseChecksums(text, "https://h/x/abc123/checksums.txt");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->artifacts.size(), 2u);
  EXPECT_EQ(m->artifacts[0].path, "cubins/a.cubin");
  EXPECT_EQ(m->artifacts[0].sha256, kHexA);
  EXPECT_FALSE(m->artifacts[0].size.has_value());
  EXPECT_EQ(m->artifacts[1].path, "cubins/sm_100a/b.cubin");
  EXPECT_EQ(m->artifacts[1].sha256, kHexB);
  EXPECT_TRUE(m->kernels.empty());
  EXPECT_EQ(m->name, "abc123");
  EXPECT_EQ(m->version, 1);
  EXPECT_EQ(m->schema, kManifestSchema);
  EXPECT_EQ(m->source, "https://h/x/abc123/checksums.txt");
  EXPECT_EQ(m->digest, Sha256Hex(text));
}

TEST(ChecksumsTest, AcceptsSha256sumFormsBlankLinesAndCrlf) {
  const std::string text = "\r\n" + kHexA + "  text-mode.cubin\r\n\n   \n" + kHexB +
                           " *binary mode.cubin\r\n" + kHexA + " last-without-newline";
  absl::StatusOr<Manifest> m = ParseChecksums(text, "checksums.txt");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->artifacts.size(), 3u);
  EXPECT_EQ(m->artifacts[0].path, "text-mode.cubin");
  EXPECT_EQ(m->artifacts[1].path, "binary mode.cubin");
  EXPECT_EQ(m->artifacts[1].sha256, kHexB);
  EXPECT_EQ(m->artifacts[2].path, "last-without-newline");
}

TEST(ChecksumsTest, MalformedLinesNameTheLine) {
  const std::string good = kHexA + " a.cubin\n";
  EXPECT_THAT(ParseChecksums(good + "\n\n\n\n\nd41d8cd9 b.cubin\n", "checksums.txt"),
              StatusIs(kInvalid, HasSubstr("checksums.txt:7: expected '<64 hex> <path>', got "
                                           "\"d41d8cd9 b.cubin\"")));
  // Uppercase hex, a tab separator, a missing path, a BSD --tag line, an escaped name.
  for (const std::string& bad :
       {std::string(64, 'A') + " x", kHexA + "\tx", kHexA + " ", kHexA,
        "SHA256 (x) = " + kHexA, "\\" + kHexA + " a\\nb"}) {
    EXPECT_THAT(ParseChecksums(good + bad + "\n", "checksums.txt"),
                StatusIs(kInvalid, HasSubstr("checksums.txt:2: expected '<64 hex> <path>', got ")))
        << bad;
  }
}

TEST(ChecksumsTest, PathsFollowThePathRules) {
  EXPECT_THAT(ParseChecksums(kHexA + " ../../etc/passwd\n", "checksums.txt"),
              StatusIs(kInvalid, HasSubstr("checksums.txt:1: path \"../../etc/passwd\" has a "
                                           "\"..\" segment")));
  EXPECT_THAT(ParseChecksums(kHexA + " a.cubin\n" + kHexA + "  /abs\n", "c.txt"),
              StatusIs(kInvalid, HasSubstr("c.txt:2: path \"/abs\" is absolute")));
  EXPECT_THAT(ParseChecksums(kHexA + " a\rb\n", "c.txt"),
              StatusIs(kInvalid, HasSubstr("c.txt:1: path \"a\\rb\" contains control character 0x0d")));
  EXPECT_THAT(ParseChecksums(kHexA + " a\xff\n", "c.txt"),
              StatusIs(kInvalid, HasSubstr("c.txt:1: path \"a\\xff\" is not valid UTF-8")));
}

TEST(ChecksumsTest, DuplicatePathsNameBothLines) {
  const std::string text = kHexA + " a.cubin\n" + kHexB + " b.cubin\n" + kHexB + " *a.cubin\n";
  EXPECT_THAT(ParseChecksums(text, "checksums.txt"),
              StatusIs(kInvalid, HasSubstr("checksums.txt:3: duplicate path \"a.cubin\" (also line 1)")));
}

TEST(ChecksumsTest, EmptyFileIsAnError) {
  EXPECT_THAT(ParseChecksums("", "checksums.txt"),
              StatusIs(kInvalid, HasSubstr("checksums.txt: no entries")));
  EXPECT_THAT(ParseChecksums("\n\r\n  \n", "checksums.txt"),
              StatusIs(kInvalid, HasSubstr("checksums.txt: no entries")));
}

TEST(ChecksumsTest, SizeLimit) {
  ManifestParseOptions o;
  o.max_bytes = 64;
  EXPECT_THAT(ParseChecksums(kHexA + " a.cubin\n", "c.txt", o),
              StatusIs(kInvalid, HasSubstr("c.txt: 73 bytes is over the limit of 64 bytes")));
}

TEST(ChecksumsTest, NameAndVersionFromOptions) {
  ManifestParseOptions o;
  o.checksums_name = "flashinfer-trtllm";
  o.checksums_version = 42;
  absl::StatusOr<Manifest> m = ParseChecksums(kHexA + " a\n", "whatever", o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "flashinfer-trtllm");
  EXPECT_EQ(m->version, 42);
  o.checksums_name = "bad name";
  EXPECT_THAT(ParseChecksums(kHexA + " a\n", "c.txt", o),
              StatusIs(kInvalid, HasSubstr("c.txt: manifest name: expected 1 to 128 characters")));
  o.checksums_name = "";
  o.checksums_version = 0;
  EXPECT_THAT(ParseChecksums(kHexA + " a\n", "c.txt", o),
              StatusIs(kInvalid, HasSubstr("c.txt: manifest version: expected an integer from 1")));
}

TEST(ChecksumsTest, NameFromSource) {
  EXPECT_EQ(ChecksumsNameFromSource("https://h/cubins/abc123/checksums.txt"), "abc123");
  EXPECT_EQ(ChecksumsNameFromSource("https://h/cubins/abc123/checksums.txt?x=1#f"), "abc123");
  EXPECT_EQ(ChecksumsNameFromSource("/srv/batched_gemm-2a1b-99/checksums.txt"),
            "batched_gemm-2a1b-99");
  EXPECT_EQ(ChecksumsNameFromSource("sums/fmha.sha256"), "fmha");
  EXPECT_EQ(ChecksumsNameFromSource("checksums.txt"), "checksums");
  EXPECT_EQ(ChecksumsNameFromSource("https://host/checksums.txt"), "host");
  EXPECT_EQ(ChecksumsNameFromSource("/d/we ird+name/checksums.txt"), "we-ird-name");
  EXPECT_EQ(ChecksumsNameFromSource(""), "checksums");
  EXPECT_EQ(ChecksumsNameFromSource("/"), "checksums");
  EXPECT_EQ(ChecksumsNameFromSource("/x/../checksums.txt"), "checksums");
}

TEST(ParseManifestOrChecksumsTest, DispatchesOnFirstByte) {
  const std::string json = "\xEF\xBB\xBF \n {\"schema\": \"cubist.manifest/1\", \"name\": \"j\", "
                           "\"version\": 3, \"artifacts\": []}";
  absl::StatusOr<Manifest> m = ParseManifestOrChecksums(json, "m.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "j");
  EXPECT_EQ(m->version, 3);
  m = ParseManifestOrChecksums("\n" + kHexA + " a.cubin\n", "dir/checksums.txt");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "dir");
  ASSERT_EQ(m->artifacts.size(), 1u);
  // Each error comes from the parser the first byte chose.
  EXPECT_THAT(ParseManifestOrChecksums("{ bad", "m.json"),
              StatusIs(kInvalid, HasSubstr("m.json:1:3: syntax error")));
  EXPECT_THAT(ParseManifestOrChecksums("<html>", "m.json"),
              StatusIs(kInvalid, HasSubstr("m.json:1: expected '<64 hex> <path>', got \"<html>\"")));
}

TEST(ParseManifestOrChecksumsTest, PackedFormHoldsWhatTheParseHolds) {
  const std::string checksums = kHexA + " a.cubin\n" + kHexB + " sub/b.cubin\n";
  const std::string json =
      "{\"schema\": \"cubist.manifest/1\", \"name\": \"j\", \"version\": 3, "
      "\"artifacts\": [{\"path\": \"a.cubin\", \"sha256\": \"" + kHexA + "\", \"size\": 4}]}";
  for (const std::string& bytes : {checksums, json}) {
    absl::StatusOr<Manifest> whole = ParseManifestOrChecksums(bytes, "dir/checksums.txt");
    ASSERT_TRUE(whole.ok()) << whole.status();
    PackedArtifacts packed;
    absl::StatusOr<Manifest> m =
        ParseManifestOrChecksumsPacked(bytes, "dir/checksums.txt", {}, &packed);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(m->artifacts.empty());
    EXPECT_EQ(packed.size(), whole->artifacts.size());
    m->artifacts = packed.Unpack();
    EXPECT_EQ(*m, *whole);
  }
  PackedArtifacts packed;
  EXPECT_THAT(ParseManifestOrChecksumsPacked("<html>", "m.json", {}, &packed),
              StatusIs(kInvalid, HasSubstr("m.json:1: expected '<64 hex> <path>'")));
}

}  // namespace
}  // namespace cubist
