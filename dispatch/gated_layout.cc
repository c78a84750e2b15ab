#include "dispatch/gated_layout.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/strings.h"

namespace cubist {
namespace {

constexpr std::pair<GatedLayout, std::string_view> kNames[] = {
    {GatedLayout::kUpGate, "up_gate"},
    {GatedLayout::kGateUp, "gate_up"},
    {GatedLayout::kGateUpInterleaved, "gate_up_interleaved"},
};

absl::Status Bad(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("gated layout: ", Sv(what)));
}

}  // namespace

absl::StatusOr<GatedLayout> ParseGatedLayout(std::string_view name) {
  for (const auto& [layout, n] : kNames) {
    if (name == n) return layout;
  }
  return Bad(absl::StrCat("'", Sv(name),
                          "' is not a layout; expected up_gate (the kernels' order), "
                          "gate_up (vLLM's w13) or gate_up_interleaved (gpt-oss)"));
}

std::string_view GatedLayoutName(GatedLayout layout) {
  for (const auto& [l, n] : kNames) {
    if (l == layout) return n;
  }
  return "unknown";
}

int64_t GatedSourceRow(GatedLayout layout, int64_t rows, int64_t r) {
  const int64_t half = rows / 2;
  const bool gate = r >= half;  // our row r is the gate's (r - half), else up's r
  const int64_t i = gate ? r - half : r;
  switch (layout) {
    case GatedLayout::kUpGate: return r;
    case GatedLayout::kGateUp: return gate ? i : half + i;
    case GatedLayout::kGateUpInterleaved: return 2 * i + (gate ? 0 : 1);
  }
  return r;
}

absl::Status ReorderGatedRows(GatedLayout layout, const void* src, void* dst, int64_t experts,
                              int64_t rows, int64_t row_bytes) {
  if (rows <= 0 || rows % 2 != 0) {
    return Bad(absl::StrCat("rows: ", rows, " is not a positive even count (2I: the linear "
                            "and the gate half)"));
  }
  if (experts < 0 || row_bytes < 0) {
    return Bad(absl::StrCat(experts < 0 ? "experts: " : "row_bytes: ",
                            experts < 0 ? experts : row_bytes, " is negative"));
  }
  const int64_t expert_bytes = rows * row_bytes;
  const int64_t total = experts * expert_bytes;
  if (total == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return Bad(absl::StrCat(src == nullptr ? "src" : "dst", " is null with ", total,
                            " bytes to copy"));
  }
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  if (s < d + total && d < s + total) {
    return Bad("src and dst overlap; reorder into a second buffer");
  }
  for (int64_t e = 0; e < experts; ++e) {
    const uint8_t* se = s + e * expert_bytes;
    uint8_t* de = d + e * expert_bytes;
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(de + r * row_bytes, se + GatedSourceRow(layout, rows, r) * row_bytes,
                  static_cast<size_t>(row_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace cubist
