// The text of `cubist fetch`'s progress line, apart from the terminal handling, so that
// tests can check it. Header-only so that the command stays one file.
//
// It shows only what is known. A FlashInfer checksums.txt declares no sizes, so when any
// artifact to download has none the total is unknown: the line then shows the bytes
// received without a total and the bar follows files instead of bytes.
//   [############            ] 1063/2126 files  104.1 MB/208.2 MB  52.0 MB/s
//   [############            ] 1063/2126 files  104.1 MB  52.0 MB/s
#ifndef CUBIST_CLI_PROGRESS_LINE_H_
#define CUBIST_CLI_PROGRESS_LINE_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "cli/common.h"

namespace cubist::cli {

struct ProgressCounts {
  uint64_t files_done = 0;    // finished, failed included
  uint64_t files_total = 0;
  uint64_t bytes = 0;         // received so far
  uint64_t bytes_total = 0;   // declared sizes
  uint64_t files_unsized = 0; // artifacts without a declared size
  double seconds = 0;
};

inline std::string FormatProgressLine(const ProgressCounts& c, int width = 24) {
  const bool sizes_known = c.files_unsized == 0 && c.bytes_total > 0;
  double frac = 0;
  if (sizes_known) {
    frac = std::min(1.0, static_cast<double>(c.bytes) / static_cast<double>(c.bytes_total));
  } else if (c.files_total > 0) {
    frac = std::min(1.0, static_cast<double>(c.files_done) / static_cast<double>(c.files_total));
  }
  const int fill = static_cast<int>(frac * width);
  std::string line = absl::StrCat("[", std::string(fill, '#'), std::string(width - fill, ' '),
                                  "] ", c.files_done, "/", c.files_total, " files  ",
                                  HumanBytes(c.bytes));
  if (sizes_known) absl::StrAppend(&line, "/", HumanBytes(c.bytes_total));
  const uint64_t rate = c.seconds > 0 ? static_cast<uint64_t>(c.bytes / c.seconds) : 0;
  absl::StrAppend(&line, "  ", HumanBytes(rate), "/s");
  return line;
}

}  // namespace cubist::cli

#endif  // CUBIST_CLI_PROGRESS_LINE_H_
