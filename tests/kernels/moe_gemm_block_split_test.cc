// The fp8-block scale-block rule of the 192-column kernels (kernels/moe_gemm_block_split.h)
// without a GPU: for every N tile of several N, gated and not, the lo/hi split and the
// per-unit decision kernels/moe_gemm_tma.cu promotes with give each 8-column group the
// scale block of the per-group rule the kernel used before them (the specification,
// written out again below), rows past N clamped to N - 1 as there.
#include <algorithm>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_block_split.h"

namespace cubist::moe {
namespace {

constexpr int32_t kTileN = 192;

// The per-group rule: group g's first B row (the gate half's N/2 further), clamped to
// N - 1, over 128.
int32_t SpecBlock(int32_t n, MoeActivation act, int32_t n_tile, int g) {
  const int32_t b_rows = MoeGemmTmaBRows(kTileN, act);
  const int h = IsGated(act) && g * 8 >= b_rows ? 1 : 0;
  const int32_t first = n_tile * b_rows + (h == 1 ? n / 2 : 0);
  return std::min(first + (g * 8) % b_rows, n - 1) / 128;
}

// Model shapes (Mixtral, Qwen3, gpt-oss, DeepSeek-V3), N not a multiple of 192 (4096,
// 14336 identity; 4096 gated), N/2 an odd multiple of 8 or 16 (the general loop), and N
// inside one block.
const std::vector<int32_t> kNs = {28672, 14336, 5760, 4096, 2880, 1536, 7168, 2000,
                                  2032,  2080,  208,  112,  16,   48,   9216, 3072};

struct Counts {
  int tiles = 0, on_units = 0;
};

Counts CheckAllTiles(int32_t n, MoeActivation act) {
  SCOPED_TRACE(testing::Message() << "N " << n << (IsGated(act) ? " gated" : " identity"));
  Counts c;
  const int groups = MoeGemmHalfGroups(kTileN, act);
  const int halves = IsGated(act) ? 2 : 1;
  const int unit = MoeGemmSplitUnitGroups(kTileN, act);
  for (int32_t n_tile = 0; n_tile < MoeGemmNTiles(n, act, kTileN); ++n_tile) {
    SCOPED_TRACE(testing::Message() << "n_tile " << n_tile);
    ++c.tiles;
    const bool on_units = MoeGemmSplitsOnUnits(n, act, kTileN, n_tile);
    c.on_units += on_units ? 1 : 0;
    for (int h = 0; h < halves; ++h) {
      const int32_t lo = MoeGemmHalfLoBlock(n, act, kTileN, n_tile, h);
      const int32_t hi = MoeGemmHalfHiBlock(n, act, kTileN, n_tile, h);
      EXPECT_TRUE(hi == lo || hi == lo + 1) << lo << " " << hi;
      EXPECT_LT(hi, (n + 127) / 128);  // a row of the expert's scales
      const int split = MoeGemmHalfSplit(n, act, kTileN, n_tile, h);
      EXPECT_GE(split, 1);
      EXPECT_LE(split, groups);
      for (int gi = 0; gi < groups; ++gi) {
        const int g = h * groups + gi;
        const int32_t spec = SpecBlock(n, act, n_tile, g);
        EXPECT_EQ(MoeGemmScaleBlockOfGroup(n, act, kTileN, n_tile, g), spec) << "group " << g;
        EXPECT_EQ(gi < split ? lo : hi, spec) << "group " << g << ", split " << split;
        if (on_units) {
          EXPECT_EQ(split % unit, 0);
          EXPECT_EQ(MoeGemmUnitTakesLo(gi, unit, split) ? lo : hi, spec)
              << "group " << g << ", split " << split;
        }
      }
    }
  }
  return c;
}

TEST(MoeGemmBlockSplitTest, EveryGroupTakesThePerGroupRulesBlock) {
  for (int32_t n : kNs) {
    for (MoeActivation act : {kIdentity, kSwiglu}) CheckAllTiles(n, act);
  }
}

// Identity tiles start at n_tile * 192, row 0 or 64 of a block: always on units of 8 groups,
// splitting at 16 or 8. Gated tiles, units of 4 groups, are on units exactly when N/2 is a
// multiple of 32 (every model shape); the others take the per-group loop, and some tiles of
// such N do.
TEST(MoeGemmBlockSplitTest, UnitsCoverIdentityAndGatedWhereHalfOfNIsAMultipleOf32) {
  EXPECT_EQ(MoeGemmSplitUnitGroups(kTileN, kIdentity), 8);
  EXPECT_EQ(MoeGemmSplitUnitGroups(kTileN, kSwiglu), 4);
  for (int32_t n : kNs) {
    SCOPED_TRACE(testing::Message() << "N " << n);
    const Counts id = CheckAllTiles(n, kIdentity);
    EXPECT_EQ(id.on_units, id.tiles);
    for (int32_t n_tile = 0; n_tile < id.tiles; ++n_tile) {
      const int split = MoeGemmHalfSplit(n, kIdentity, kTileN, n_tile, 0);
      EXPECT_EQ(split, n_tile % 2 == 0 ? 16 : 8) << "n_tile " << n_tile;
    }
    const Counts gated = CheckAllTiles(n, kSwiglu);
    if ((n / 2) % 32 == 0) {
      EXPECT_EQ(gated.on_units, gated.tiles);
    } else if (gated.tiles >= 4) {
      EXPECT_LT(gated.on_units, gated.tiles);
    }
  }
  // Mixtral-8x7B FC1, gated: the linear and gate halves start at the same offset in their
  // blocks, 0, 96, 64, 32 rows for n_tile 0, 1, 2, 3: splits 12 (none), 4, 8, 12.
  for (int32_t n_tile = 0; n_tile < 4; ++n_tile) {
    const int want[] = {12, 4, 8, 12};
    EXPECT_EQ(MoeGemmHalfSplit(28672, kSwiglu, kTileN, n_tile, 0), want[n_tile]);
    EXPECT_EQ(MoeGemmHalfSplit(28672, kSwiglu, kTileN, n_tile, 1), want[n_tile]);
  }
}

// The unit decision for every split on units of 4 and 8 groups matches "group < split".
TEST(MoeGemmBlockSplitTest, UnitDecisionIsGroupBeforeSplit) {
  for (int unit : {4, 8}) {
    for (int split = unit; split <= 16; split += unit) {
      for (int gi = 0; gi < 24; ++gi) {
        EXPECT_EQ(MoeGemmUnitTakesLo(gi, unit, split), gi < split)
            << "unit " << unit << ", split " << split << ", group " << gi;
      }
    }
  }
}

}  // namespace
}  // namespace cubist::moe
