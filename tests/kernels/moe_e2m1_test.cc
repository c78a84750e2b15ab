// The nvfp4 quantize kernel's branch-free e2m1 rounding (kernels/moe_e2m1.h) against the
// reference encoder (dispatch/reference.h, FloatToE2m1), which rounds the exact value by
// its own, generic rule. Every float within 4,096 ulps of each rounding boundary and of
// the range edges, both signs, plus a stride over all 2^32 bit patterns (a full sweep of
// every pattern agreed too; it takes minutes, so the test samples).
#include <cmath>
#include <cstdint>
#include <limits>

#include "dispatch/reference.h"
#include "gtest/gtest.h"
#include "kernels/moe_e2m1.h"

namespace cubist::moe {
namespace {

using reference::FloatToE2m1;

uint32_t Bits(float v) { return E2m1BitCast<uint32_t>(v); }

TEST(E2m1CodeTest, MatchesTheReferenceAroundEveryBoundary) {
  // The ties (0.25 .. 5), the range joins (2, 4), saturation (6), the smallest numbers.
  const float edges[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f,
                         2.5f, 3.0f, 3.5f, 4.0f,  5.0f, 6.0f,  7.0f, 8.0f,  1e-38f};
  int checked = 0;
  for (float edge : edges) {
    for (float sign : {1.0f, -1.0f}) {
      const uint32_t mid = Bits(sign * edge);
      for (int64_t d = -4096; d <= 4096; ++d) {
        const int64_t b = static_cast<int64_t>(mid) + d;
        if (b < 0 || b > 0xFFFFFFFFll) continue;
        const float v = E2m1BitCast<float>(static_cast<uint32_t>(b));
        ASSERT_EQ(E2m1Code(v), FloatToE2m1(v)) << "v = " << v << " (bits 0x" << std::hex << b
                                               << ")";
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 36 * 8000);
}

TEST(E2m1CodeTest, MatchesTheReferenceOverAStrideOfEveryPattern) {
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 4093) {  // a prime stride: every exponent
    const float v = E2m1BitCast<float>(static_cast<uint32_t>(b));
    ASSERT_EQ(E2m1Code(v), FloatToE2m1(v)) << "bits 0x" << std::hex << b;
  }
}

TEST(E2m1CodeTest, TiesSaturationNanAndSignedZero) {
  EXPECT_EQ(E2m1Code(0.25f), 0u) << "tie 0 / 0.5 -> 0 (even)";
  EXPECT_EQ(E2m1Code(0.75f), 2u) << "tie 0.5 / 1 -> 1 (even code)";
  EXPECT_EQ(E2m1Code(1.75f), 4u) << "tie 1.5 / 2 -> 2";
  EXPECT_EQ(E2m1Code(2.5f), 4u) << "tie 2 / 3 -> 2";
  EXPECT_EQ(E2m1Code(3.5f), 6u) << "tie 3 / 4 -> 4";
  EXPECT_EQ(E2m1Code(5.0f), 6u) << "tie 4 / 6 -> 4";
  EXPECT_EQ(E2m1Code(5.5f), 7u);
  EXPECT_EQ(E2m1Code(-6.0f), 15u);
  EXPECT_EQ(E2m1Code(1e30f), 7u) << "saturates";
  EXPECT_EQ(E2m1Code(-std::numeric_limits<float>::infinity()), 15u);
  EXPECT_EQ(E2m1Code(std::numeric_limits<float>::quiet_NaN()), 0u);
  EXPECT_EQ(E2m1Code(-std::numeric_limits<float>::quiet_NaN()), 0u) << "no sign on NaN";
  EXPECT_EQ(E2m1Code(-0.0f), 8u) << "the sign kept";
  EXPECT_EQ(E2m1Code(-1e-45f), 8u) << "a negative denormal rounds to -0";
}

// E2m1Value (the decoded nvfp4 inputs' element) against the reference decoder, every
// code; a value re-encodes to its own code (-0 included).
TEST(E2m1ValueTest, EveryCodeIsTheReferenceValue) {
  for (uint32_t code = 0; code < 16; ++code) {
    SCOPED_TRACE(code);
    EXPECT_EQ(E2m1Value(code), reference::E2m1ToFloat(static_cast<uint8_t>(code)));
    EXPECT_EQ(std::signbit(E2m1Value(code)), code >= 8);
    EXPECT_EQ(E2m1Code(E2m1Value(code)), code);
  }
  EXPECT_EQ(E2m1Value(7), 6.0f);
  EXPECT_EQ(E2m1Value(13), -3.0f);
}

}  // namespace
}  // namespace cubist::moe
