// The fetch progress line shows only what is known (cli/progress_line.h).
#include "cli/progress_line.h"

#include "gtest/gtest.h"

namespace cubist::cli {
namespace {

TEST(ProgressLineTest, KnownSizesShowTheTotal) {
  ProgressCounts c{.files_done = 1, .files_total = 2, .bytes = 500'000, .bytes_total = 1'000'000,
                   .files_unsized = 0, .seconds = 1};
  EXPECT_EQ(FormatProgressLine(c, 10), "[#####     ] 1/2 files  500.0 kB/1.0 MB  500.0 kB/s");
}

// Regression: a checksums.txt manifest has no sizes, and the line read "994.1 MB/0 B".
TEST(ProgressLineTest, UnknownSizesShowNoTotalAndTheBarFollowsFiles) {
  ProgressCounts c{.files_done = 1063, .files_total = 2126, .bytes = 994'100'000,
                   .bytes_total = 0, .files_unsized = 2126, .seconds = 4};
  EXPECT_EQ(FormatProgressLine(c, 10), "[#####     ] 1063/2126 files  994.1 MB  248.5 MB/s");
}

TEST(ProgressLineTest, SomeSizesUnknownIsUnknown) {
  ProgressCounts c{.files_done = 0, .files_total = 4, .bytes = 2'000, .bytes_total = 1'000,
                   .files_unsized = 1, .seconds = 0};
  EXPECT_EQ(FormatProgressLine(c, 4), "[    ] 0/4 files  2.0 kB  0 B/s");
}

}  // namespace
}  // namespace cubist::cli
