// The flashinferMetaInfo.h parser (manifest/trtllm_gen_meta.h) on headers in the
// generator's syntax.
#include "manifest/trtllm_gen_meta.h"

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/flashinfer_pin.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::DefaultPinKernels;
using ::cubist::testing::MetaInfoHeader;
using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<std::string> Hashes(size_t n) {
  std::vector<std::string> h;
  for (size_t i = 0; i < n; ++i) h.push_back(Sha256Hex(absl::StrCat("cubin ", i)));
  return h;
}

TEST(TrtllmGenMetaTest, ReadsEveryEntryWithItsLabelledOptions) {
  const auto kernels = DefaultPinKernels();
  const auto hashes = Hashes(kernels.size());
  auto info = ParseTrtllmGenMetaInfo(MetaInfoHeader(kernels, hashes), "flashinferMetaInfo.h");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->list_name, "tllmGenBatchedGemmList");
  EXPECT_EQ(info->export_version, "7.0.4.0.4.0");
  ASSERT_EQ(info->kernels.size(), 3u);
  const TrtllmGenKernelMeta& k = info->kernels[0];
  EXPECT_EQ(k.function, kernels[0].function);
  EXPECT_EQ(k.shared_mem_bytes, 150528);
  EXPECT_EQ(k.threads, 384);
  EXPECT_EQ(k.sha256, hashes[0]);
  EXPECT_EQ(k.sm_version, "Sm100f");
  EXPECT_EQ(info->kernels[2].sm_version, "Sm103a");
  ASSERT_NE(k.Find("mDtypeA"), nullptr);
  EXPECT_EQ(k.Find("mDtypeA")->text, "trtllm::gen::Dtype(17826828)");
  EXPECT_EQ(k.Find("mDtypeA")->Int(), 17826828);
  EXPECT_EQ(k.Find("mBlockK")->Int(), -1);
  EXPECT_EQ(k.Find("mKernelTraits")->text, "{}");
  EXPECT_TRUE(k.Find("mKernelTraits")->list);
  EXPECT_EQ(k.Find("mRouteSfsImpl")->text, "{batchedGemm::RouteImpl(0)}");
  EXPECT_EQ(k.Find("mBatchMode")->Int(), 1);
  EXPECT_EQ(k.Find("mNoSuchOption"), nullptr);
  EXPECT_EQ(k.line, 25u);
}

TEST(TrtllmGenMetaTest, DeclaredLengthMustMatch) {
  const auto kernels = DefaultPinKernels();
  std::string h = MetaInfoHeader(kernels, Hashes(3));
  h.replace(h.find("ListLen = 3"), 11, "ListLen = 4");
  EXPECT_THAT(ParseTrtllmGenMetaInfo(h, "m.h"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "m.h:20: the list declares 4 kernels but holds 3; the header is "
                       "truncated or edited"));
}

TEST(TrtllmGenMetaTest, TruncatedHeaderNamesTheEntry) {
  std::string h = MetaInfoHeader(DefaultPinKernels(), Hashes(3));
  h.resize(h.size() / 2);
  EXPECT_THAT(ParseTrtllmGenMetaInfo(h, "m.h"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("initializer not closed before the end of the file")));
}

TEST(TrtllmGenMetaTest, BadHashIsRefusedWithItsLine) {
  auto hashes = Hashes(3);
  hashes[1] = "ABC";
  EXPECT_THAT(ParseTrtllmGenMetaInfo(MetaInfoHeader(DefaultPinKernels(), hashes), "m.h"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "m.h:58: entry 1: sha256 \"ABC\" is not 64 lowercase hex characters"));
}

TEST(TrtllmGenMetaTest, UnterminatedStringAndCommentAreErrors) {
  EXPECT_THAT(ParseTrtllmGenMetaInfo("static const X tllmGenBatchedGemmList[] = {\n{\"abc\n}};",
                                     "m.h"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "m.h:2: unterminated string literal (strings end on their line)"));
  EXPECT_THAT(ParseTrtllmGenMetaInfo("/* never closed", "m.h"),
              StatusIs(absl::StatusCode::kInvalidArgument, "m.h:1: unterminated /* comment"));
}

TEST(TrtllmGenMetaTest, NotAKernelListIsSaidSo) {
  EXPECT_THAT(ParseTrtllmGenMetaInfo("#pragma once\nint x = 3;\n", "m.h"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("m.h: no kernel list (`static const ... "
                                 "tllmGenBatchedGemmList[] = {`)")));
}

TEST(TrtllmGenMetaTest, DepthAndSizeAreBounded) {
  std::string deep = "static const X tllmGenBatchedGemmList[] = {\n{";
  for (int i = 0; i < 50; ++i) deep += "{";
  EXPECT_THAT(ParseTrtllmGenMetaInfo(deep, "m.h"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "m.h:2: initializers nest deeper than 8 levels"));
  TrtllmGenMetaLimits limits;
  limits.max_bytes = 10;
  EXPECT_THAT(ParseTrtllmGenMetaInfo("01234567890", "m.h", limits),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("m.h: 11 bytes is over the limit of 10 bytes")));
}

}  // namespace
}  // namespace cubist
