// The generation-2 shared-memory layout (kernels/moe_gemm_layout.h) without a GPU: which
// kernels stage their epilogue, where the buffer lies, and that its padding keeps both of
// the epilogue's access patterns free of bank conflicts; which tiles the fp4 kernels take.
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kernels/moe_gemm_layout.h"

namespace cubist::moe {
namespace {

using ::testing::HasSubstr;

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

// fp8-block 192-column tiles (kernels/moe_gemm_tma.cu StagedScaleLoop) keep two slots of
// block scales per consumer in shared memory, between the scheduler's arrays and the
// epilogue buffer: 64 A-row scales and up to one B scale per 8-column group (the lo/hi
// loop stores four), the B scales read 16 bytes at a time. No other kernel has them, so their layouts stay as they were.
TEST(MoeGemmTmaLayoutTest, Fp8Block192StagesItsScalesInSharedMemory) {
  const MoeGemmTmaLayout l = MakeTmaLayout(kFp8Block, kFp8Block, 128, 192, 4);
  ASSERT_EQ(l.error, nullptr);
  EXPECT_TRUE(l.smem_scales);
  EXPECT_TRUE(l.staged_epilogue);
  const int slot = MoeGemmTmaScaleSlotBytes(192);
  EXPECT_EQ(slot, (64 + 192 / 8) * 4);
  EXPECT_EQ(slot % 16, 0);
  EXPECT_EQ(l.scale_offset % 16, 0);
  EXPECT_EQ(l.scale_offset, RoundUp(l.sched_offset + kMoeGemmTmaSchedBytes, 128));
  EXPECT_GE(l.epilogue_offset, l.scale_offset + l.consumers * kMoeGemmTmaScaleSlots * slot);
  EXPECT_EQ(l.smem_bytes, kSmemAlign + l.epilogue_offset + 2 * kMoeGemmTmaEpilogueBytes);
  EXPECT_EQ(l.smem_bytes, 193152);  // fp8 per tensor's 191,744 plus 2 x 2 x 352
  // Four 40 KB stages are the most that fit, as for fp8 per tensor at 192 columns.
  EXPECT_THAT(MakeTmaLayout(kFp8Block, kFp8Block, 128, 192, 5).error,
              HasSubstr("shared memory exceeds 227 KB"));
  struct Case {
    MoeFormat f;
    int tm, tn, stages;
  };
  for (const Case& c : {Case{kFp8, 128, 192, 4}, Case{kFp8Block, 128, 128, 6},
                        Case{kFp8Block, 64, 128, 8}, Case{kFp8, 128, 128, 6},
                        Case{kBf16, 128, 256, 4}}) {
    SCOPED_TRACE(testing::Message() << c.tm << "x" << c.tn);
    const MoeGemmTmaLayout o = MakeTmaLayout(c.f, c.f, c.tm, c.tn, c.stages);
    ASSERT_EQ(o.error, nullptr);
    EXPECT_FALSE(o.smem_scales);
    if (o.staged_epilogue) {
      EXPECT_EQ(o.epilogue_offset, RoundUp(o.sched_offset + kMoeGemmTmaSchedBytes, 128));
    }
  }
  // 192 columns need the two consumers of a 128-row tile; bf16 has no such tile.
  for (MoeFormat f : {kFp8Block, kFp8}) {
    EXPECT_THAT(MakeTmaLayout(f, f, 64, 192, 4).error,
                HasSubstr("tile_n 192 is for fp8 and fp8-block kernels of 128 rows"));
  }
  EXPECT_THAT(MakeTmaLayout(kBf16, kBf16, 128, 192, 4).error,
              HasSubstr("tile_n 192 is for fp8 and fp8-block kernels of 128 rows"));
}

// kernels/moe_gemm_fp4.cu multiplies in bf16 from registers for every tile it builds:
// its stage is the packed weights, the bf16 panels and the raw activation boxes. 128
// tokens of mxfp8 do not fit two such stages; that tile is kernels/moe_gemm_fp4_fp8.cu's
// (MakeFp4Fp8Layout), and the fp4 layout refuses it naming that kernel.
TEST(MoeGemmFp4LayoutTest, Mxfp8TakesUpTo64TokensAndNamesTheFp8Kernel) {
  for (int tm : {8, 16, 32, 64}) {
    const MoeGemmFp4Layout l = MakeFp4Layout(kMxfp4, kMxfp8, tm, 128, 2);
    ASSERT_EQ(l.error, nullptr) << tm;
    EXPECT_EQ(l.w_stage_bytes, 128 * 128) << tm;
    EXPECT_EQ(l.a_stage_bytes, 4 * tm * 128) << tm;    // four bf16 panels
    EXPECT_EQ(l.raw_stage_bytes, 2 * tm * 128) << tm;  // two 128-byte boxes per token row
    EXPECT_EQ(l.stage_bytes, l.w_stage_bytes + l.a_stage_bytes + l.raw_stage_bytes) << tm;
  }
  const MoeGemmFp4Layout big = MakeFp4Layout(kMxfp4, kMxfp8, 128, 128, 2);
  ASSERT_NE(big.error, nullptr);
  EXPECT_THAT(big.error, HasSubstr("at most 64 tokens"));
  EXPECT_THAT(big.error, HasSubstr("kernels/moe_gemm_fp4_fp8.cu"));
  EXPECT_EQ(MakeFp4Fp8Layout(128, 128, 2).error, nullptr);
  // The other pairs keep their 128-token tiles.
  EXPECT_EQ(MakeFp4Layout(kMxfp4, kBf16, 128, 128, 2).error, nullptr);
  EXPECT_EQ(MakeFp4Layout(kNvfp4, kNvfp4, 128, 128, 2).error, nullptr);
}

// The kernels with raw activations keep a scale-flag word per stage (the converters
// write it, the consumers read it after the stage's `converted` barrier) between the
// mbarriers and the scheduler's arrays; the 8-byte barriers stay 8-byte aligned and the
// scheduler 128-byte aligned. bf16 activations copied by TMA need neither.
TEST(MoeGemmFp4LayoutTest, ScaleFlagsLieBetweenTheBarriersAndTheScheduler) {
  struct Case {
    MoeFormat w, a;
    int tm, stages;
  };
  for (const Case& c : {Case{kMxfp4, kBf16, 8, 6}, Case{kMxfp4, kMxfp8, 32, 3},
                        Case{kNvfp4, kNvfp4, 128, 2}, Case{kMxfp4, kMxfp8, 8, 8},
                        Case{kMxfp4, kBf16, 64, 3}}) {
    SCOPED_TRACE(testing::Message() << c.tm << " tokens, " << c.stages << " stages");
    const MoeGemmFp4Layout l = MakeFp4Layout(c.w, c.a, c.tm, 128, c.stages);
    ASSERT_EQ(l.error, nullptr);
    EXPECT_EQ(l.barrier_offset % 8, 0);
    EXPECT_EQ(l.sched_offset % 128, 0);
    if (l.raw_stage_bytes > 0) {
      EXPECT_EQ(l.flag_offset, l.barrier_offset + 3 * 8 * c.stages);
      EXPECT_LE(l.flag_offset + 4 * c.stages, l.sched_offset);
    } else {
      EXPECT_LE(l.barrier_offset + 2 * 8 * c.stages, l.sched_offset);
    }
    EXPECT_LT(l.sched_offset - l.barrier_offset, 28 * c.stages + 128);
  }
}

// Where converters run (raw activations), each stage has a slot of the k-tile's weight
// scale bytes per tile row (256 / 32 = 8 for mxfp4, 256 / 16 = 16 for nvfp4), 16-byte
// aligned, after the scheduler's arrays and before the epilogue; without converters the
// consumers read global memory and the layout has no slots. 8-token mxfp4 x bf16 tiles
// keep two CTAs per SM with 3 stages (4 held them before the slots: 4 KB more pass the
// 113 KB a CTA may take).
// An fp4 layout of 128 weight rows and what a test expects of it.
struct Fp4Case {
  MoeFormat w, a;
  int tm, stages, expected;
  MoeGemmFp4Layout Layout() const { return MakeFp4Layout(w, a, tm, 128, stages); }
};

TEST(MoeGemmFp4LayoutTest, ConvertersStageTheWeightScales) {
  // expected: the slot bytes per row (0: no slots).
  for (const Fp4Case& c : {Fp4Case{kMxfp4, kBf16, 8, 3, 8}, Fp4Case{kMxfp4, kMxfp8, 32, 4, 8},
                           Fp4Case{kNvfp4, kNvfp4, 128, 2, 16}, Fp4Case{kNvfp4, kBf16, 8, 3, 16},
                           Fp4Case{kMxfp4, kBf16, 16, 3, 0}, Fp4Case{kNvfp4, kBf16, 128, 2, 0}}) {
    SCOPED_TRACE(testing::Message() << c.tm << " tokens, " << c.stages << " stages");
    const MoeGemmFp4Layout l = c.Layout();
    const int row_bytes = c.expected;
    ASSERT_EQ(l.error, nullptr);
    EXPECT_EQ(l.wscale_row_bytes, row_bytes);
    EXPECT_EQ(l.wscale_stage_bytes, 128 * row_bytes);
    EXPECT_EQ(row_bytes > 0, l.raw_stage_bytes > 0);
    if (row_bytes > 0) {
      EXPECT_EQ(l.wscale_offset % 16, 0);
      EXPECT_GE(l.wscale_offset, l.sched_offset + kMoeGemmTmaSchedBytes);
      EXPECT_EQ(l.epilogue_offset, l.wscale_offset + c.stages * 128 * row_bytes);
    } else {
      EXPECT_EQ(l.epilogue_offset, l.sched_offset + kMoeGemmTmaSchedBytes);
    }
  }
  EXPECT_EQ(MakeFp4Layout(kMxfp4, kBf16, 8, 128, 3).ctas_per_sm, 2);
  EXPECT_EQ(MakeFp4Layout(kMxfp4, kBf16, 8, 128, 4).ctas_per_sm, 1);
}

// Two CTAs per SM launch with 80 registers a thread (65536 / (2 x 384), rounded down to 8);
// the consumer warpgroups take 88 of them from the producer warpgroup's 64, exactly the
// CTA's pool (setmaxnreg.inc past it would wait forever). A CTA alone on its SM with a
// warpgroup of converters (512 threads, 128 a thread) gives its consumers 160 and both
// other warpgroups 96; one CTA of 384 threads keeps its launch registers (168).
TEST(MoeGemmFp4LayoutTest, TwoCtasPerSmMoveRegistersToTheConsumers) {
  // expected: CTAs per SM.
  for (const Fp4Case& c : {Fp4Case{kMxfp4, kBf16, 8, 3, 2}, Fp4Case{kMxfp4, kMxfp8, 16, 3, 2},
                           Fp4Case{kNvfp4, kNvfp4, 8, 4, 2}, Fp4Case{kMxfp4, kBf16, 16, 3, 2},
                           Fp4Case{kMxfp4, kBf16, 64, 3, 1}, Fp4Case{kNvfp4, kNvfp4, 128, 2, 1},
                           Fp4Case{kMxfp4, kMxfp8, 64, 3, 1}}) {
    SCOPED_TRACE(testing::Message() << c.tm << " tokens, " << c.stages << " stages");
    const MoeGemmFp4Layout l = c.Layout();
    ASSERT_EQ(l.error, nullptr);
    ASSERT_EQ(l.ctas_per_sm, c.expected);
    if (c.expected == 2) {
      EXPECT_EQ(l.threads, 384);
      EXPECT_EQ(l.consumer_regs, 88);
      EXPECT_EQ(l.producer_regs, 64);
      EXPECT_EQ(2 * l.consumer_regs + l.producer_regs, 3 * 80);
      EXPECT_TRUE(SetMaxNRegFits(l.threads, 2, 88, 64, 2));
      EXPECT_FALSE(SetMaxNRegFits(l.threads, 2, 96, 64, 2));
    } else if (l.threads == 512) {
      EXPECT_GT(l.converters, 96);
      EXPECT_EQ(l.consumer_regs, 160);
      EXPECT_EQ(l.producer_regs, 96);
      EXPECT_EQ(2 * l.consumer_regs + 2 * l.producer_regs, 4 * 128);
      EXPECT_TRUE(SetMaxNRegFits(l.threads, 2, 160, 96));
      EXPECT_FALSE(SetMaxNRegFits(l.threads, 2, 168, 96));
    } else {
      EXPECT_EQ(l.threads, 384);
      EXPECT_EQ(l.consumer_regs, 0);
    }
  }
}

}  // namespace
}  // namespace cubist::moe
