// The generation-2 shared-memory layout (kernels/moe_gemm_layout.h) without a GPU: which
// kernels stage their epilogue, where the buffer lies, and that its padding keeps both of
// the epilogue's access patterns free of bank conflicts; the fp4 kernels' e4m3 tile (its
// stage areas and register targets).
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

// mxfp4 x mxfp8 with 128 tokens multiplies in e4m3 (kernels/moe_gemm_fp4.cu MainLoopF8):
// its stage is the packed weights, the raw activations regridded in place, and the two
// scale areas; its setmaxnreg targets must fit the CTA's register pool, or
// setmaxnreg.inc waits forever (a build that asked 2 x 216 + 80 of 3 x 168 hung on the
// H200).
TEST(MoeGemmFp4LayoutTest, E4m3TileStagesAndRegisters) {
  EXPECT_TRUE(Fp4Fp8Mma(kMxfp4, kMxfp8, 128));
  EXPECT_FALSE(Fp4Fp8Mma(kMxfp4, kMxfp8, 64));
  EXPECT_FALSE(Fp4Fp8Mma(kMxfp4, kBf16, 128));
  EXPECT_FALSE(Fp4Fp8Mma(kNvfp4, kNvfp4, 128));

  const MoeGemmFp4Layout l = MakeFp4Layout(kMxfp4, kMxfp8, 128, 128, 4);
  ASSERT_EQ(l.error, nullptr);
  EXPECT_TRUE(l.fp8_mma);
  EXPECT_EQ(l.a_stage_bytes, 0);                      // no bf16 panel: regridded in place
  EXPECT_EQ(l.raw_stage_bytes, 2 * 128 * 128);        // two 128-byte boxes per token row
  EXPECT_EQ(l.factor_offset, 128 * 128 + 2 * 128 * 128);
  EXPECT_EQ(l.fold_offset, l.factor_offset + 128 * 8);  // 8 scale bytes per token row
  EXPECT_EQ(l.stage_bytes, 51200);                    // + 8 per weight row, 1024-aligned
  EXPECT_EQ(l.stage_bytes % 1024, 0);
  // The token area later holds 128 token factors and 128 row factors (fp32).
  EXPECT_LE(4 * l.tile_m + 4 * l.tile_n, 8 * l.tile_m);
  EXPECT_EQ(l.threads, 512);
  EXPECT_EQ(l.converters, 96 + 128);
  EXPECT_EQ(l.ctas_per_sm, 1);
  EXPECT_LE(l.smem_bytes, kMaxDynamicSmem);
  const int pool = 65536 / l.threads / 8 * 8;  // what the launch bounds give each thread
  EXPECT_EQ(pool, 128);
  EXPECT_LE(l.consumers * l.consumer_regs + (l.threads / 128 - l.consumers) * l.producer_regs,
            (l.threads / 128) * pool);
  EXPECT_EQ(l.consumer_regs % 8, 0);
  EXPECT_EQ(l.producer_regs % 8, 0);
  EXPECT_NE(MakeFp4Layout(kMxfp4, kMxfp8, 128, 128, 5).error, nullptr);  // 5 stages: too big

  // The bf16-MMA fp4 tiles keep their layout: no scale areas, no register targets.
  for (int tm : {8, 64}) {
    const MoeGemmFp4Layout b = MakeFp4Layout(kMxfp4, kMxfp8, tm, 128, 2);
    ASSERT_EQ(b.error, nullptr) << tm;
    EXPECT_FALSE(b.fp8_mma);
    EXPECT_EQ(b.a_stage_bytes, 4 * tm * 128);
    EXPECT_EQ(b.consumer_regs, 0);
  }
}

}  // namespace
}  // namespace cubist::moe
