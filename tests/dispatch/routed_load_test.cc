// The spread of a router's rows over the experts (dispatch/routed_load.h): the
// expectation the cost model prices, and the draws the timing harness runs on.
#include "dispatch/routed_load.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cubist {
namespace {

RoutedLoad Load(int64_t tokens, int64_t top_k, int64_t routed_experts) {
  RoutedLoad l;
  l.tokens = tokens;
  l.top_k = top_k;
  l.routed_experts = routed_experts;
  return l;
}

// Two tokens, each to one of two experts: an expert's rows are 0, 1, 2 with chances
// 1/4, 1/2, 1/4.
TEST(RoutedLoadTest, ASmallCaseByHand) {
  const RoutedLoad l = Load(2, 1, 2);
  EXPECT_DOUBLE_EQ(l.MeanRowsPerExpert(), 1.0);
  EXPECT_NEAR(l.TouchedChance(), 0.75, 1e-15);
  EXPECT_NEAR(l.ExpectedTilesPerExpert(1), 1.0, 1e-12);   // E[X]
  EXPECT_NEAR(l.ExpectedTilesPerExpert(2), 0.75, 1e-12);  // P(X >= 1)
  EXPECT_NEAR(Load(3, 1, 2).ExpectedTilesPerExpert(2), 3.0 / 8 + 3.0 / 8 + 2.0 / 8, 1e-12);
}

// Two identities that hold at any size: one-row tiles count the rows (E[X] = n k / R),
// and a tile at least as tall as every count is one tile per touched expert.
TEST(RoutedLoadTest, IdentitiesAtModelSizes) {
  for (const RoutedLoad& l : {Load(65536, 8, 128), Load(4096, 4, 128), Load(16384, 8, 256),
                              Load(1, 8, 128), Load(64, 2, 8)}) {
    SCOPED_TRACE(l.tokens);
    EXPECT_NEAR(l.ExpectedTilesPerExpert(1), l.MeanRowsPerExpert(),
                1e-10 * l.MeanRowsPerExpert());
    EXPECT_NEAR(l.ExpectedTilesPerExpert(l.tokens), l.TouchedChance(), 1e-12);
  }
}

// gpt-oss-120b at 4,096 tokens: 128 rows per expert on average, 10.96 of spread. A
// 128-row tile runs one tile for the experts at or under 128 rows and two for the rest
// (about 48% of them, the binomial's median being 128); a 64-row tile two or three.
TEST(RoutedLoadTest, AnExpertJustPastATileRunsASecond) {
  const RoutedLoad l = Load(4096, 4, 128);
  EXPECT_DOUBLE_EQ(l.MeanRowsPerExpert(), 128.0);
  const double tall = l.ExpectedTilesPerExpert(128);
  const double short_tiles = l.ExpectedTilesPerExpert(64);
  EXPECT_GT(tall, 1.45);
  EXPECT_LT(tall, 1.50);
  EXPECT_GT(short_tiles, 2.45);
  EXPECT_LT(short_tiles, 2.50);
  // The same rows spread evenly fill one and two tiles exactly: routed, the tall tile
  // does 1.5x the work, the short one 1.25x.
  EXPECT_GT(tall / 1.0, short_tiles / 2.0 + 0.2);
}

TEST(RoutedLoadTest, EveryExpertPickedIsDeterministicAndNoTokensIsNothing) {
  const RoutedLoad all = Load(100, 8, 8);  // k = R: every token picks every expert
  EXPECT_DOUBLE_EQ(all.TouchedChance(), 1.0);
  EXPECT_DOUBLE_EQ(all.ExpectedTilesPerExpert(64), 2.0);
  EXPECT_DOUBLE_EQ(all.ExpectedTilesPerExpert(128), 1.0);
  const RoutedLoad none = Load(0, 8, 128);
  EXPECT_DOUBLE_EQ(none.TouchedChance(), 0.0);
  EXPECT_DOUBLE_EQ(none.ExpectedTilesPerExpert(64), 0.0);
}

// Offsets as prefix sums of counts; k = R makes every count n (the picks of a token are
// distinct), k = R - 1 the total n (R - 1) with every count at most n.
TEST(SampleRoutedOffsetsTest, EachTokenPicksDistinctExperts) {
  const std::vector<int32_t> all = SampleRoutedOffsets(Load(50, 6, 6), 6, 1);
  EXPECT_THAT(all, ::testing::ElementsAre(0, 50, 100, 150, 200, 250, 300));
  const std::vector<int32_t> most = SampleRoutedOffsets(Load(50, 5, 6), 6, 1);
  ASSERT_EQ(most.size(), 7u);
  EXPECT_EQ(most[6], 250);
  for (size_t e = 0; e + 1 < most.size(); ++e) {
    EXPECT_GE(most[e + 1] - most[e], 0);
    EXPECT_LE(most[e + 1] - most[e], 50);
  }
}

TEST(SampleRoutedOffsetsTest, TheSameSeedGivesTheSameDrawAndAnotherAnother) {
  const RoutedLoad l = Load(4096, 8, 128);
  const std::vector<int32_t> a = SampleRoutedOffsets(l, 128, 7);
  EXPECT_EQ(a, SampleRoutedOffsets(l, 128, 7));
  EXPECT_NE(a, SampleRoutedOffsets(l, 128, 8));
  EXPECT_EQ(a.back(), 4096 * 8);
}

// A rank of expert parallelism holds the first E of R experts: its rows are its share.
TEST(SampleRoutedOffsetsTest, ARankCountsItsOwnExpertsOnly) {
  const std::vector<int32_t> rank = SampleRoutedOffsets(Load(4096, 8, 256), 32, 3);
  ASSERT_EQ(rank.size(), 33u);
  // 4096 x 8 x 32 / 256 = 4096 rows expected, 60 of spread.
  EXPECT_GT(rank.back(), 4096 - 300);
  EXPECT_LT(rank.back(), 4096 + 300);
}

// One draw's tiles, over hundreds of experts, are close to the expectation the cost
// model prices (what makes a single fixed draw a fair timing load).
TEST(SampleRoutedOffsetsTest, ADrawsTilesAverageToTheExpectation) {
  const RoutedLoad l = Load(4096, 8, 256);  // DeepSeek-V3 at 4,096 tokens
  for (int64_t tile_m : {64, 128}) {
    SCOPED_TRACE(tile_m);
    const std::vector<int32_t> o = SampleRoutedOffsets(l, 256, 11);
    double tiles = 0;
    for (size_t e = 0; e + 1 < o.size(); ++e) {
      tiles += static_cast<double>((o[e + 1] - o[e] + tile_m - 1) / tile_m);
    }
    const double expected = 256 * l.ExpectedTilesPerExpert(tile_m);
    EXPECT_NEAR(tiles, expected, 0.05 * expected);
  }
}

}  // namespace
}  // namespace cubist
