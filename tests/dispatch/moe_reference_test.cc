// Tests of the CPU reference for the moe_gemm kernels (dispatch/reference.h):
// the codecs against hand-computed values and exhaustively, the quantizers' layouts and
// error bounds, the reference GEMM and activations on small hand-checked cases, and the
// comparison's verdicts.
#include "dispatch/reference.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/random_problem.h"

namespace cubist::reference {
namespace {

using ::cubist::testing::MakeRandomProblem;
using ::cubist::testing::MoeProblemShape;
using ::cubist::testing::RaggedCounts;
using ::testing::HasSubstr;

TEST(MoeCodecTest, E4m3DecodesKnownCodes) {
  EXPECT_EQ(E4m3ToFloat(0x00), 0.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(E4m3ToFloat(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(E4m3ToFloat(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(E4m3ToFloat(0x38), 1.0f);
  EXPECT_EQ(E4m3ToFloat(0x3C), 1.5f);
  EXPECT_EQ(E4m3ToFloat(0xB8), -1.0f);
  EXPECT_EQ(E4m3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x77), 240.0f);  // e=14, m=7: 1.875 * 2^7
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0x7F)));
  EXPECT_TRUE(std::isnan(E4m3ToFloat(0xFF)));
}

TEST(MoeCodecTest, E4m3RoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(MoeCodecTest, E4m3RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(FloatToE4m3(1.0625f), 0x38);   // tie between 1 (even) and 1.125
  EXPECT_EQ(FloatToE4m3(1.1875f), 0x3A);   // tie between 1.125 and 1.25 (even)
  EXPECT_EQ(FloatToE4m3(1.07f), 0x39);     // nearest 1.125
  EXPECT_EQ(FloatToE4m3(1000.0f), 0x7E);   // saturates to 448, never NaN
  EXPECT_EQ(FloatToE4m3(464.0f), 0x7E);
  EXPECT_EQ(FloatToE4m3(-1000.0f), 0xFE);
  EXPECT_EQ(FloatToE4m3(std::ldexp(1.0f, -10)), 0x00);  // tie at half the subnormal step
  EXPECT_EQ(FloatToE4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 steps -> 2 (even)
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
}

TEST(MoeCodecTest, E2m1DecodesAndRounds) {
  const float values[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(E2m1ToFloat(static_cast<uint8_t>(c)), values[c]);
    EXPECT_EQ(E2m1ToFloat(static_cast<uint8_t>(c | 8)), -values[c]);
    EXPECT_EQ(FloatToE2m1(values[c]), c);
    if (c) EXPECT_EQ(FloatToE2m1(-values[c]), c | 8);
  }
  EXPECT_EQ(FloatToE2m1(0.25f), 0);  // tie 0 / 0.5 -> 0 (even)
  EXPECT_EQ(FloatToE2m1(0.75f), 2);  // tie 0.5 / 1 -> 1 (even code)
  EXPECT_EQ(FloatToE2m1(2.5f), 4);   // tie 2 / 3 -> 2
  EXPECT_EQ(FloatToE2m1(3.5f), 6);   // tie 3 / 4 -> 4
  EXPECT_EQ(FloatToE2m1(5.0f), 6);   // tie 4 / 6 -> 4
  EXPECT_EQ(FloatToE2m1(5.1f), 7);
  EXPECT_EQ(FloatToE2m1(100.0f), 7);  // saturates to 6
  EXPECT_EQ(FloatToE2m1(-100.0f), 15);
}

TEST(MoeCodecTest, Ue8m0IncludingNaN) {
  EXPECT_EQ(Ue8m0ToFloat(127), 1.0f);
  EXPECT_EQ(Ue8m0ToFloat(130), 8.0f);
  EXPECT_EQ(Ue8m0ToFloat(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(Ue8m0ToFloat(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(Ue8m0ToFloat(0xFF)));
}

TEST(MoeCodecTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);       // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);   // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xC000);
  EXPECT_EQ(Bf16ToFloat(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(Bf16ToFloat(FloatToBf16(3.4e38f))));
}

TEST(MoeQuantizeTest, Mxfp4PacksLowNibbleFirstWithSharedExponent) {
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f;    // with amax 6: exponent floor(log2 6) - 2 = 0, scale 1
  x[1] = -6.0f;
  x[2] = 0.5f;
  x[3] = 3.0f;
  std::vector<uint8_t> data, scale;
  float g = 0;
  Quantize(moe::kMxfp4, x, 1, 32, false, &data, &scale, &g);
  ASSERT_EQ(data.size(), 16u);
  ASSERT_EQ(scale.size(), 1u);
  EXPECT_EQ(scale[0], 127);
  EXPECT_EQ(data[0], 0x2 | (0xF << 4));  // 1.0 = code 2, -6 = code 15
  EXPECT_EQ(data[1], 0x1 | (0x5 << 4));  // 0.5 = 1, 3 = 5
  EXPECT_EQ(g, 1.0f);

  x[1] = -48.0f;  // amax 48: exponent 5 - 2 = 3, elements divided by 8
  Quantize(moe::kMxfp4, x, 1, 32, false, &data, &scale, &g);
  EXPECT_EQ(scale[0], 130);
  EXPECT_EQ(data[0], 0x0 | (0xF << 4));  // 1/8 rounds to 0, -48/8 = -6
}

TEST(MoeQuantizeTest, LayoutsAndScaleCounts) {
  const int rows = 130, k = 288;  // partial fp8-block blocks both ways
  std::vector<float> x(rows * k, 0.25f);
  std::vector<uint8_t> data, scale;
  float g;
  Quantize(moe::kBf16, x, rows, k, false, &data, &scale, &g);
  EXPECT_EQ(data.size(), 2u * rows * k);
  EXPECT_TRUE(scale.empty());
  Quantize(moe::kFp8Block, x, rows, k, false, &data, &scale, &g);
  EXPECT_EQ(data.size(), size_t(rows) * k);
  EXPECT_EQ(scale.size(), 4u * rows * 3);  // [rows, ceil(288/128)] fp32
  Quantize(moe::kFp8Block, x, rows, k, true, &data, &scale, &g);
  EXPECT_EQ(scale.size(), 4u * 2 * 3);  // [ceil(130/128), 3]
  Quantize(moe::kMxfp8, x, rows, k, false, &data, &scale, &g);
  EXPECT_EQ(scale.size(), size_t(rows) * k / 32);
  Quantize(moe::kNvfp4, x, rows, k, false, &data, &scale, &g);
  EXPECT_EQ(data.size(), size_t(rows) * k / 2);
  EXPECT_EQ(scale.size(), size_t(rows) * k / 16);
  EXPECT_FLOAT_EQ(g, 0.25f / (448.0f * 6.0f));
}

// Quantizing random data and decoding it again lands within each format's precision.
class MoeQuantizeErrorTest : public ::testing::TestWithParam<std::pair<MoeFormat, double>> {};

TEST_P(MoeQuantizeErrorTest, RoundTripErrorWithinFormatPrecision) {
  const auto [fmt, bound] = GetParam();
  // The pair that carries `fmt`: as activations, except mxfp4 (weights only).
  MoeProblemShape shape{.weight_format = fmt, .activation_format = fmt,
                        .n = 32, .k = 256, .tokens_per_expert = {100, 28}};
  if (fmt == moe::kMxfp8) shape.weight_format = moe::kMxfp4;
  if (fmt == moe::kMxfp4) shape.activation_format = moe::kBf16;
  const MoeProblemData p = MakeRandomProblem(shape, 7);
  // Re-create the unquantized A the generator drew: same seed, same draw order, so
  // compare against A quantized to bf16 instead (a fine grid) where A is not bf16.
  MoeProblemShape fine = shape;
  fine.activation_format = moe::kBf16;
  fine.weight_format = moe::kBf16;
  const MoeProblemData q = MakeRandomProblem(fine, 7);
  const bool test_a = fmt != moe::kMxfp4;
  const std::vector<float> got = test_a ? DequantizeA(p) : DequantizeB(p);
  const std::vector<float> want = test_a ? DequantizeA(q) : DequantizeB(q);
  ASSERT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * double(got[i] - want[i]);
    den += double(want[i]) * want[i];
  }
  const double rel = std::sqrt(num / den);
  EXPECT_LT(rel, bound) << moe::FormatName(fmt);
  EXPECT_GT(rel, fmt == moe::kBf16 ? -1.0 : 1e-4) << "no quantization happened?";
}

INSTANTIATE_TEST_SUITE_P(
    Formats, MoeQuantizeErrorTest,
    ::testing::Values(std::make_pair(moe::kBf16, 1e-9), std::make_pair(moe::kFp8, 0.06),
                      std::make_pair(moe::kFp8Block, 0.05), std::make_pair(moe::kMxfp8, 0.05),
                      std::make_pair(moe::kMxfp4, 0.25), std::make_pair(moe::kNvfp4, 0.2)));

TEST(MoeReferenceTest, GemmRoutesRowsToTheirExpert) {
  // E = 2: expert 0 owns row 0, expert 1 rows 1-2; K = 32, N = 2, bf16.
  MoeProblemData p;
  p.num_experts = 2;
  p.num_tokens = 3;
  p.n = 2;
  p.k = 32;
  p.offsets = {0, 1, 3};
  std::vector<float> a(3 * 32, 0.0f), b(2 * 2 * 32, 0.0f);
  a[0 * 32 + 0] = 1;  // row 0 = e0
  a[1 * 32 + 1] = 2;
  a[2 * 32 + 31] = 3;
  b[(0 * 2 + 0) * 32 + 0] = 5;   // expert 0, n 0, k 0
  b[(0 * 2 + 1) * 32 + 1] = 7;   // expert 0, n 1, k 1 (row 1 must not see it)
  b[(1 * 2 + 1) * 32 + 1] = 11;  // expert 1, n 1, k 1
  b[(1 * 2 + 0) * 32 + 31] = 13;
  std::vector<uint8_t> s;
  float g;
  Quantize(moe::kBf16, a, 3, 32, false, &p.a, &s, &g);
  Quantize(moe::kBf16, b, 4, 32, false, &p.b, &s, &g);
  const std::vector<double> c = ReferenceGemm(p);
  EXPECT_THAT(c, ::testing::ElementsAre(5, 0, 0, 22, 39, 0));
  const std::vector<double> relu2 = ApplyActivation(p, c, moe::kRelu2);
  EXPECT_THAT(relu2, ::testing::ElementsAre(25, 0, 0, 484, 1521, 0));
  // Gated: out[t, 0] = act(C[t, 0], C[t, 1]).
  const std::vector<double> sw = ApplyActivation(p, c, moe::kSwiglu);
  ASSERT_EQ(sw.size(), 3u);
  EXPECT_DOUBLE_EQ(sw[0], 0.0);                              // x1 = 0
  EXPECT_DOUBLE_EQ(sw[1], 22 / (1 + std::exp(-22.0)) * 0);   // x0 = 0
  EXPECT_DOUBLE_EQ(sw[2], 0 * 39.0);
}

TEST(MoeReferenceTest, GlobalScalesMultiplyTheProduct) {
  MoeProblemShape shape{.weight_format = moe::kNvfp4, .activation_format = moe::kNvfp4,
                        .n = 16, .k = 64, .tokens_per_expert = {3, 0, 2}};
  MoeProblemData p = MakeRandomProblem(shape, 3);
  ASSERT_EQ(p.a_global_scale.size(), 1u);
  ASSERT_EQ(p.b_global_scale.size(), 3u);
  const std::vector<double> c1 = ReferenceGemm(p);
  p.a_global_scale[0] *= 2;
  p.b_global_scale[2] *= 4;
  const std::vector<double> c2 = ReferenceGemm(p);
  for (int t = 0; t < 3; ++t) EXPECT_DOUBLE_EQ(c2[t * 16], 2 * c1[t * 16]);      // expert 0
  for (int t = 3; t < 5; ++t) EXPECT_DOUBLE_EQ(c2[t * 16 + 5], 8 * c1[t * 16 + 5]);  // e 2
}

TEST(MoeReferenceTest, ActivationFormulas) {
  const double inf = std::numeric_limits<double>::infinity();
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  EXPECT_DOUBLE_EQ(ActivationValue(moe::kSwiglu, 1.5, 2.0, 1, 0, inf), 2 * sig(2) * 1.5);
  // gpt-oss: alpha 1.702, beta 1, limit 7: x1 clamps to 7, x0 to [-7, 7].
  EXPECT_DOUBLE_EQ(ActivationValue(moe::kSwiglu, -9, 10, 1.702, 1, 7),
                   7 * sig(1.702 * 7) * (-7 + 1));
  EXPECT_DOUBLE_EQ(ActivationValue(moe::kSwiglu, 1, -10, 1, 0, 7), -10 * sig(-10) * 1);
  EXPECT_DOUBLE_EQ(ActivationValue(moe::kGeglu, 3, 1, 1, 0, inf),
                   0.5 * (1 + std::erf(1 / std::sqrt(2.0))) * 3);
  EXPECT_DOUBLE_EQ(ActivationValue(moe::kSitu, 30, 5, 4, 25, inf),
                   25 * std::tanh(30.0 / 25) * 4 * std::tanh(5.0 / 4) * sig(5));
  EXPECT_DOUBLE_EQ(ActivationValue(moe::kRelu2, -3, 0, 1, 0, inf), 0);
  EXPECT_DOUBLE_EQ(ActivationValue(moe::kRelu2, 3, 0, 1, 0, inf), 9);
  EXPECT_DOUBLE_EQ(ActivationValue(moe::kIdentity, -3, 7, 1, 0, inf), -3);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(ActivationValue(moe::kRelu2, nan, 0, 1, 0, inf)));
  EXPECT_TRUE(std::isnan(ActivationValue(moe::kSwiglu, 1, nan, 1, 0, 7)));
  EXPECT_TRUE(std::isnan(ActivationValue(moe::kSwiglu, nan, 1, 1, 0, 7)));
}

TEST(MoeReferenceTest, NanScaleReachesTheOutput) {
  MoeProblemShape shape{.weight_format = moe::kMxfp4, .activation_format = moe::kMxfp8,
                        .n = 8, .k = 64, .tokens_per_expert = {2}};
  MoeProblemData p = MakeRandomProblem(shape, 5);
  p.a_scale[1 * 2 + 1] = 0xFF;  // row 1, second block
  const std::vector<double> c = ReferenceGemm(p);
  for (int n = 0; n < 8; ++n) {
    EXPECT_FALSE(std::isnan(c[n]));
    EXPECT_TRUE(std::isnan(c[8 + n]));
  }
}

TEST(MoeReferenceTest, RaggedCountsHaveEmptyAndUnalignedExperts) {
  const std::vector<int> c = RaggedCounts(12, 0);
  EXPECT_THAT(c, ::testing::Contains(0));
  EXPECT_THAT(c, ::testing::Contains(65));
  EXPECT_THAT(c, ::testing::Contains(127));
  EXPECT_EQ(RaggedCounts(12, 1)[0], c[1]);
}

TEST(MoeCompareTest, Verdicts) {
  const std::vector<double> ref = {1.0, -2.0, 0.5, 3.0};
  std::vector<uint16_t> out;
  for (double v : ref) out.push_back(FloatToBf16(static_cast<float>(v)));
  const Tolerance tol = ToleranceFor(moe::kBf16, moe::kBf16);
  EXPECT_TRUE(CompareBf16(out, ref, tol).ok);

  std::vector<uint16_t> wrong = out;
  wrong[2] = FloatToBf16(0.6f);
  const Comparison c = CompareBf16(wrong, ref, tol);
  EXPECT_FALSE(c.ok);
  EXPECT_EQ(c.bad_elements, 1);
  EXPECT_EQ(c.first_bad, 2);
  EXPECT_THAT(c.summary, HasSubstr("first at 2"));

  std::vector<uint16_t> nan = out;
  nan[0] = 0x7FC0;
  EXPECT_FALSE(CompareBf16(nan, ref, tol).ok);
  EXPECT_FALSE(CompareBf16(std::vector<uint16_t>(3), ref, tol).ok);

  // The absolute term can follow the pre-activation scale (max|C|) instead of max|ref|.
  EXPECT_EQ(CompareBf16(wrong, ref, tol, /*atol_scale=*/100.0).bad_elements, 0);

  std::vector<double> nan_ref = ref;
  nan_ref[0] = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(CompareBf16(nan, nan_ref, tol).ok);
}

}  // namespace
}  // namespace cubist::reference
