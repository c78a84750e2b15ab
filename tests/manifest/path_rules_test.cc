#include "manifest/path_rules.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

TEST(PathRulesTest, AcceptsNormalisedRelativePaths) {
  for (const char* p : {"a", "k.cubin", "cubins/sm_90a/bmm_x.cubin", "a/b/c/d/e",
                        "dir.with.dots/file", "..a/b..", "a/...", ".hidden/x", "x/.y",
                        "spaces are ok/f ile", "utf8/\xc3\xa9t\xc3\xa9/\xe2\x82\xac.cubin",
                        "emoji/\xf0\x9f\x98\x80"}) {
    EXPECT_TRUE(ValidateArtifactPath(p).ok()) << p << ": " << ValidateArtifactPath(p);
  }
  EXPECT_TRUE(ValidateArtifactPath(std::string(kMaxArtifactPathBytes, 'a')).ok());
}

TEST(PathRulesTest, RejectsEmpty) {
  EXPECT_THAT(ValidateArtifactPath(""), StatusIs(kInvalid, HasSubstr("empty path")));
}

TEST(PathRulesTest, RejectsAbsolute) {
  EXPECT_THAT(ValidateArtifactPath("/x"),
              StatusIs(kInvalid, HasSubstr("path \"/x\" is absolute")));
  EXPECT_THAT(ValidateArtifactPath("/"), StatusIs(kInvalid, HasSubstr("is absolute")));
}

TEST(PathRulesTest, RejectsBackslash) {
  EXPECT_THAT(ValidateArtifactPath("a\\b"),
              StatusIs(kInvalid, HasSubstr("path \"a\\\\b\" contains a backslash at byte 1; "
                                           "use '/' as the separator")));
  EXPECT_THAT(ValidateArtifactPath("..\\..\\etc"), StatusIs(kInvalid, HasSubstr("backslash")));
}

TEST(PathRulesTest, RejectsDotDotSegments) {
  for (const char* p : {"..", "../x", "a/../b", "a/.."}) {
    EXPECT_THAT(ValidateArtifactPath(p), StatusIs(kInvalid, HasSubstr("has a \"..\" segment")))
        << p;
  }
}

TEST(PathRulesTest, RejectsDotSegments) {
  for (const char* p : {".", "./x", "a/./b", "a/."}) {
    EXPECT_THAT(ValidateArtifactPath(p), StatusIs(kInvalid, HasSubstr("has a \".\" segment")))
        << p;
  }
}

TEST(PathRulesTest, RejectsEmptySegments) {
  EXPECT_THAT(ValidateArtifactPath("a//b"),
              StatusIs(kInvalid, HasSubstr("path \"a//b\" has an empty segment at byte 2")));
  EXPECT_THAT(ValidateArtifactPath("a/"),
              StatusIs(kInvalid, HasSubstr("path \"a/\" ends with '/'")));
  EXPECT_THAT(ValidateArtifactPath("a/b/"), StatusIs(kInvalid, HasSubstr("ends with '/'")));
}

TEST(PathRulesTest, RejectsNulAndControlCharacters) {
  EXPECT_THAT(ValidateArtifactPath(std::string("a\0b", 3)),
              StatusIs(kInvalid, HasSubstr("path \"a\\x00b\" contains a NUL byte at byte 1")));
  EXPECT_THAT(ValidateArtifactPath("a\nb"),
              StatusIs(kInvalid, HasSubstr("path \"a\\nb\" contains control character 0x0a "
                                           "at byte 1")));
  EXPECT_THAT(ValidateArtifactPath("ab\x7f"),
              StatusIs(kInvalid, HasSubstr("control character 0x7f at byte 2")));
  EXPECT_THAT(ValidateArtifactPath("x\x1b[31m"),
              StatusIs(kInvalid, HasSubstr("control character 0x1b at byte 1")));
  // C1 control (U+0085, NEL) encoded as valid UTF-8.
  EXPECT_THAT(ValidateArtifactPath("a\xc2\x85"),
              StatusIs(kInvalid, HasSubstr("control character U+0085 at byte 1")));
}

TEST(PathRulesTest, RejectsInvalidUtf8) {
  EXPECT_THAT(ValidateArtifactPath("a\xffz"),
              StatusIs(kInvalid, HasSubstr("path \"a\\xffz\" is not valid UTF-8 at byte 1")));
  // Truncated sequence, lone continuation byte, overlong '/', surrogate, > U+10FFFF.
  for (const char* p : {"a\xc3", "\x80", "a\xc0\xaf" "b", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                        "\xe2\x82"}) {
    EXPECT_THAT(ValidateArtifactPath(p), StatusIs(kInvalid, HasSubstr("is not valid UTF-8")))
        << p;
  }
}

TEST(PathRulesTest, RejectsOverlongPaths) {
  EXPECT_THAT(ValidateArtifactPath(std::string(kMaxArtifactPathBytes + 1, 'a')),
              StatusIs(kInvalid, HasSubstr("is 4097 bytes; the limit is 4096")));
}

TEST(PathRulesTest, MessageQuotesAreBounded) {
  // A hostile megabyte path must not produce a megabyte message.
  std::string p(100000, 'x');
  p += "/../y";
  absl::Status s = ValidateArtifactPath(p);
  ASSERT_FALSE(s.ok());
  EXPECT_LT(s.message().size(), 200u);
}

}  // namespace
}  // namespace cubist
