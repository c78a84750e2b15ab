// Explain: every kernel's verdict for a problem, and its text (dispatch/selector.h).
#include "dispatch/selector.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/dispatch_manifests.h"

namespace cubist {
namespace {

using ::cubist::testing::ParseTestManifest;
using ::cubist::testing::SelectionKernels;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class ExplainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = ParseTestManifest(SelectionKernels());
    ASSERT_TRUE(m.ok()) << m.status();
    auto r = Registry::Create(*m);
    ASSERT_TRUE(r.ok()) << r.status();
    registry_.emplace(std::move(*r));
  }
  std::optional<Registry> registry_;
};

MoeProblem Mxfp4Problem(int64_t k, DeviceSm sm = {9, 0}) {
  MoeProblem p;
  p.weight_format = DataFormat::kMxfp4;
  p.activation_format = DataFormat::kBf16;
  p.activation = Activation::kSwiglu;
  p.experts = 128;
  p.tokens = 128 * 64;
  p.n = 1536;
  p.k = k;
  p.sm = sm;
  return p;
}

TEST_F(ExplainTest, EveryKernelGetsAVerdictInRegistryOrder) {
  MoeProblem p = Mxfp4Problem(2048);
  std::vector<Verdict> v = Explain(*registry_, p);
  ASSERT_EQ(v.size(), registry_->size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i].kernel, &registry_->kernels()[i]);
  EXPECT_TRUE(v[4].candidate());
  EXPECT_EQ(v[4].rank, 1);
  ASSERT_TRUE(v[4].cost.has_value());
  EXPECT_EQ(v[4].cost->ctas, 128 * 1 * 12);
  ASSERT_EQ(v[0].rejections.size(), 1u);
  EXPECT_EQ(v[0].rejections[0].reason, RejectReason::kWeightFormat);
  EXPECT_EQ(v[0].rank, 0);
  ASSERT_EQ(v[5].rejections.size(), 2u);
  EXPECT_EQ(v[5].rejections[0].reason, RejectReason::kWeightFormat);
  EXPECT_EQ(v[5].rejections[1].reason, RejectReason::kActivationFormat);
}

TEST_F(ExplainTest, TextNamesEachRejectionReason) {
  std::string text = FormatExplain(Mxfp4Problem(2880), Explain(*registry_, Mxfp4Problem(2880)));
  EXPECT_THAT(text, StartsWith("problem: moe_gemm{weights=mxfp4 activations=bf16 "
                               "activation=swiglu experts=128 tokens=8192 (64/expert) "
                               "n=1536 k=2880 sm=90}\n"));
  // format
  EXPECT_THAT(text, HasSubstr("\nrejected bf16_swiglu_m64n64k64: weight format: kernel "
                              "takes bf16, problem has mxfp4\n"));
  EXPECT_THAT(text, HasSubstr("\nrejected fp8_fp8_swiglu_m128n128k128: weight format: "
                              "kernel takes fp8, problem has mxfp4; activation format: "
                              "kernel takes fp8, problem has bf16\n"));
  // activation
  EXPECT_THAT(text, HasSubstr("\nrejected bf16_relu2_m128n128k64: weight format: kernel "
                              "takes bf16, problem has mxfp4; activation: kernel applies "
                              "relu2, problem wants swiglu\n"));
  // arch
  EXPECT_THAT(text, HasSubstr("\nrejected bf16_swiglu_sm100a_m128n256k64: weight format: "
                              "kernel takes bf16, problem has mxfp4; arch: sm_100a kernel "
                              "does not run on SM 90: machine code runs only within its "
                              "major version (10.x)\n"));
  // shape
  EXPECT_THAT(text, HasSubstr("\nrejected mxfp4_bf16_swiglu_m64n128k128: shape: K=2880 is "
                              "not a multiple of 128 (the kernel's k_align)\n"));
  EXPECT_THAT(text, HasSubstr("no candidate\n"));
}

TEST_F(ExplainTest, Sm90aKernelOnSm100IsArchIncompatible) {
  MoeProblem p = Mxfp4Problem(2048, {10, 0});
  std::string text = FormatExplain(p, Explain(*registry_, p));
  EXPECT_THAT(text, HasSubstr("\nrejected mxfp4_bf16_swiglu_m64n128k128: arch: sm_90a kernel "
                              "does not run on SM 100: machine code runs only within its "
                              "major version (9.x)\n"));
}

TEST_F(ExplainTest, ArchSpecificKernelNeedsItsExactSm) {
  // A hypothetical SM 9.1 device: sm_90a code is specific to 9.0.
  MoeProblem p = Mxfp4Problem(2048, {9, 1});
  std::string text = FormatExplain(p, Explain(*registry_, p));
  EXPECT_THAT(text, HasSubstr("\nrejected mxfp4_bf16_swiglu_m64n128k128: arch: sm_90a kernel "
                              "does not run on SM 91: an 'a' target runs only on SM 90\n"));
}

TEST_F(ExplainTest, RankedCandidatesComeFirstWithTheirCost) {
  MoeProblem p;
  p.activation = Activation::kSwiglu;
  p.experts = 8;
  p.tokens = 8 * 2048;
  p.n = 28672;
  p.k = 4096;
  std::string text = FormatExplain(p, Explain(*registry_, p));
  EXPECT_THAT(text, HasSubstr("}\n#1 bf16_swiglu_m128n128k64: "));
  EXPECT_THAT(text, HasSubstr("\n#2 bf16_swiglu_m64n128k64: "));
  EXPECT_THAT(text, HasSubstr("\n#3 bf16_swiglu_m64n64k64: "));
  EXPECT_THAT(text, HasSubstr("28672 CTAs, 218 waves of 1/SM, efficiency m 1.00 n 1.00 "
                              "k 1.00\n"));
  EXPECT_THAT(text, ::testing::Not(HasSubstr("no candidate")));
}

}  // namespace
}  // namespace cubist
