// The generation-2 shared-memory layout (kernels/moe_gemm_layout.h) without a GPU: which
// kernels stage their epilogue, where the buffer lies, and that its padding keeps both of
// the epilogue's access patterns free of bank conflicts.
#include <set>

#include <gtest/gtest.h>

#include "kernels/moe_gemm_layout.h"

namespace cubist::moe {
namespace {

TEST(MoeGemmTmaLayoutTest, OneCtaPerSmKernelsStageTheirEpilogue) {
  struct Case {
    MoeFormat f;
    int tm, tn, stages;
    int ctas_per_sm;
  };
  for (const Case& c : {Case{kBf16, 128, 256, 4, 1}, Case{kBf16, 128, 128, 6, 1},
                        Case{kBf16, 64, 256, 5, 1}, Case{kFp8, 128, 128, 6, 1},
                        Case{kFp8, 64, 128, 8, 1}, Case{kFp8Block, 128, 128, 6, 1},
                        Case{kBf16, 64, 128, 4, 2}}) {
    SCOPED_TRACE(testing::Message() << c.tm << "x" << c.tn << " stages " << c.stages);
    const MoeGemmTmaLayout l = MakeTmaLayout(c.f, c.f, c.tm, c.tn, c.stages);
    ASSERT_EQ(l.error, nullptr);
    EXPECT_EQ(l.ctas_per_sm, c.ctas_per_sm);
    EXPECT_LE(l.smem_bytes, kMaxDynamicSmem);
    const int sched_end = l.sched_offset + kMoeGemmTmaSchedBytes;
    if (c.ctas_per_sm == 1) {
      EXPECT_TRUE(l.staged_epilogue);
      EXPECT_EQ(l.epilogue_offset % 128, 0);  // 16-byte reads need 16-byte alignment
      EXPECT_GE(l.epilogue_offset, sched_end);
      EXPECT_EQ(l.smem_bytes,
                kSmemAlign + l.epilogue_offset + l.consumers * kMoeGemmTmaEpilogueBytes);
    } else {
      // Two CTAs per SM overlap one's epilogue with the other's main loop; a buffer would
      // cost the second CTA.
      EXPECT_FALSE(l.staged_epilogue);
      EXPECT_EQ(l.smem_bytes, kSmemAlign + sched_end);
      EXPECT_LE(2 * (l.smem_bytes + 1024), 233472);
    }
  }
}

TEST(MoeGemmTmaLayoutTest, EpilogueRowsAvoidBankConflicts) {
  constexpr int kRow = kMoeGemmTmaEpilogueRowBytes;
  EXPECT_EQ(kRow % 16, 0);
  EXPECT_EQ(kMoeGemmTmaEpilogueBytes, 64 * kRow);
  // Writes: lane l of a warp stores 4 bytes at row l / 4, byte (l % 4) * 4 of an 8-column
  // group; the 32 lanes must hit 32 different banks.
  for (int group = 0; group < kMoeGemmTmaEpilogueCols / 8; ++group) {
    std::set<int> banks;
    for (int lane = 0; lane < 32; ++lane) {
      banks.insert((lane / 4 * kRow + group * 16 + lane % 4 * 4) / 4 % 32);
    }
    EXPECT_EQ(banks.size(), 32u) << "group " << group;
  }
  // Reads: 8 consecutive lanes (one 128-byte phase) read 16 bytes each of one row.
  for (int row = 0; row < 8; ++row) {
    std::set<int> banks;
    for (int piece = 0; piece < 8; ++piece) {
      for (int w = 0; w < 4; ++w) banks.insert((row * kRow + piece * 16 + w * 4) / 4 % 32);
    }
    EXPECT_EQ(banks.size(), 32u) << "row " << row;
  }
}

}  // namespace
}  // namespace cubist::moe
