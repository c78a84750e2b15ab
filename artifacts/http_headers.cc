#include "artifacts/http_headers.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "base/strings.h"

namespace cubist {

std::optional<absl::Duration> RetryAfterFromHeaderLine(std::string_view line) {
  constexpr std::string_view kName = "retry-after:";
  if (!absl::StartsWithIgnoreCase(Sv(line), Sv(kName))) return std::nullopt;
  int64_t secs;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(Sv(line.substr(kName.size()))), &secs) ||
      secs < 0) {
    return std::nullopt;
  }
  return absl::Seconds(secs);
}

std::optional<std::string> EtagFromHeaderLine(std::string_view line) {
  constexpr std::string_view kName = "etag:";
  if (!absl::StartsWithIgnoreCase(Sv(line), Sv(kName))) return std::nullopt;
  absl::string_view tag = absl::StripAsciiWhitespace(Sv(line.substr(kName.size())));
  // It goes back out as a header line: refuse what could end or bend that line, and
  // anything too long to be an entity tag.
  if (tag.empty() || tag.size() > 1024) return std::nullopt;
  for (char c : tag) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return std::nullopt;
  }
  return std::string(tag);
}

std::optional<uint64_t> ContentRangeStartFromHeaderLine(std::string_view line) {
  constexpr std::string_view kName = "content-range:";
  constexpr std::string_view kUnit = "bytes";
  if (!absl::StartsWithIgnoreCase(Sv(line), Sv(kName))) return std::nullopt;
  std::string_view value = line.substr(kName.size());
  const size_t unit = value.find(kUnit);
  if (unit == std::string_view::npos) return std::nullopt;
  value = value.substr(unit + kUnit.size());
  uint64_t start;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(Sv(value.substr(0, value.find('-')))),
                        &start)) {
    return std::nullopt;
  }
  return start;
}

void ResponseHeaders::AddLine(std::string_view line) {
  if (absl::StartsWith(Sv(line), "HTTP/")) {
    *this = ResponseHeaders();  // a new response (after a redirect or a 1xx)
  } else if (auto delay = RetryAfterFromHeaderLine(line); delay.has_value()) {
    retry_after = delay;
  } else if (auto tag = EtagFromHeaderLine(line); tag.has_value()) {
    etag = *std::move(tag);
  } else if (auto start = ContentRangeStartFromHeaderLine(line); start.has_value()) {
    content_range_start = start;
  }
}

}  // namespace cubist
