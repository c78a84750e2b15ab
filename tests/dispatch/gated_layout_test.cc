#include "dispatch/gated_layout.h"

#include <cstdint>
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Two experts of 2I = 6 rows of 2 bytes. Row bytes name the row: up rows 'u0'.., gate 'g0'..
// (the expert in the high bit), laid out as each checkpoint stores them.
std::vector<uint8_t> Rows(std::initializer_list<const char*> names) {
  std::vector<uint8_t> out;
  for (int e = 0; e < 2; ++e) {
    for (const char* n : names) {
      out.push_back(static_cast<uint8_t>(n[0] | (e << 7)));
      out.push_back(static_cast<uint8_t>(n[1]));
    }
  }
  return out;
}

TEST(GatedLayoutTest, EveryLayoutBecomesUpThenGate) {
  const std::vector<uint8_t> ours = Rows({"u0", "u1", "u2", "g0", "g1", "g2"});
  const struct {
    const char* name;
    std::vector<uint8_t> checkpoint;
  } cases[] = {
      {"up_gate", Rows({"u0", "u1", "u2", "g0", "g1", "g2"})},
      {"gate_up", Rows({"g0", "g1", "g2", "u0", "u1", "u2"})},
      {"gate_up_interleaved", Rows({"g0", "u0", "g1", "u1", "g2", "u2"})},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto layout = ParseGatedLayout(c.name);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(GatedLayoutName(*layout), c.name);
    std::vector<uint8_t> got(ours.size(), 0xEE);
    CUBIST_ASSERT_OK(ReorderGatedRows(*layout, c.checkpoint.data(), got.data(), 2, 6, 2));
    EXPECT_THAT(got, ElementsAreArray(ours));
  }
}

TEST(GatedLayoutTest, SourceRowsOfAGptOssBias) {
  // A bias [E, 2I] is rows of one fp32: gpt-oss's interleaved order, I = 2.
  EXPECT_EQ(GatedSourceRow(GatedLayout::kGateUpInterleaved, 4, 0), 1);  // up 0
  EXPECT_EQ(GatedSourceRow(GatedLayout::kGateUpInterleaved, 4, 1), 3);  // up 1
  EXPECT_EQ(GatedSourceRow(GatedLayout::kGateUpInterleaved, 4, 2), 0);  // gate 0
  EXPECT_EQ(GatedSourceRow(GatedLayout::kGateUpInterleaved, 4, 3), 2);  // gate 1
  const std::vector<float> checkpoint = {-1.0f, 1.0f, -2.0f, 2.0f};  // g0 u0 g1 u1
  std::vector<float> ours(4);
  CUBIST_ASSERT_OK(ReorderGatedRows(GatedLayout::kGateUpInterleaved, checkpoint.data(),
                                    ours.data(), 1, 4, sizeof(float)));
  EXPECT_THAT(ours, ElementsAre(1.0f, 2.0f, -1.0f, -2.0f));
}

TEST(GatedLayoutTest, BadInputIsRefusedAndNothingIsWritten) {
  EXPECT_THAT(ParseGatedLayout("w13"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gated layout: 'w13' is not a layout; expected up_gate")));
  std::vector<uint8_t> src(12), dst(12, 0xEE);
  std::iota(src.begin(), src.end(), 0);
  EXPECT_THAT(ReorderGatedRows(GatedLayout::kGateUp, src.data(), dst.data(), 1, 3, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("rows: 3 is not a positive even count")));
  EXPECT_THAT(ReorderGatedRows(GatedLayout::kGateUp, src.data(), dst.data(), -1, 2, 4),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("experts: -1 is negative")));
  EXPECT_THAT(ReorderGatedRows(GatedLayout::kGateUp, nullptr, dst.data(), 1, 2, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("src is null with 8 bytes to copy")));
  EXPECT_THAT(ReorderGatedRows(GatedLayout::kGateUp, src.data(), src.data() + 4, 1, 2, 4),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("src and dst overlap; reorder into a second buffer")));
  EXPECT_THAT(dst, ::testing::Each(0xEE));
  // Nothing to copy: null pointers are fine.
  CUBIST_EXPECT_OK(ReorderGatedRows(GatedLayout::kGateUp, nullptr, nullptr, 0, 2, 4));
}

}  // namespace
}  // namespace cubist
