#include "manifest/path_rules.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "manifest/message_text.h"

namespace cubist {
namespace {

absl::Status Bad(std::string_view path, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("path ", QuoteForMessage(path), " ", absl::string_view(what.data(), what.size())));
}

}  // namespace

absl::Status ValidateArtifactPath(std::string_view path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "empty path; expected a relative path such as \"cubins/sm_90a/k.cubin\"");
  }
  if (path.size() > kMaxArtifactPathBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "path %s is %d bytes; the limit is %d", QuoteForMessage(path, 40), path.size(),
        kMaxArtifactPathBytes));
  }
  // Byte-level checks first: they decide whether the segment checks below can even
  // trust what they see (a NUL would truncate the path for every C API downstream).
  for (size_t i = 0; i < path.size();) {
    const unsigned char c = static_cast<unsigned char>(path[i]);
    if (c == 0) return Bad(path, absl::StrCat("contains a NUL byte at byte ", i));
    if (c < 0x20 || c == 0x7F) {
      return Bad(path, absl::StrFormat("contains control character 0x%02x at byte %d", c, i));
    }
    if (c == '\\') {
      return Bad(path, absl::StrCat("contains a backslash at byte ", i,
                                    "; use '/' as the separator"));
    }
    char32_t cp = 0;
    const size_t len = Utf8SequenceLength(path, i, &cp);
    if (len == 0) return Bad(path, absl::StrCat("is not valid UTF-8 at byte ", i));
    if (cp >= 0x80 && cp <= 0x9F) {
      return Bad(path, absl::StrFormat("contains control character U+%04X at byte %d",
                                       static_cast<uint32_t>(cp), i));
    }
    i += len;
  }
  if (path.front() == '/') {
    return Bad(path, "is absolute; expected a path relative to the artifact set's root");
  }
  if (path.back() == '/') return Bad(path, "ends with '/'; expected a file path");
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string_view::npos ? path.size() : slash;
    const std::string_view segment = path.substr(start, end - start);
    if (segment.empty()) {
      return Bad(path, absl::StrCat("has an empty segment at byte ", start,
                                    "; write it in normalised form (no \"//\")"));
    }
    if (segment == "..") {
      return Bad(path, "has a \"..\" segment; paths must not leave the artifact set's root");
    }
    if (segment == ".") {
      return Bad(path, "has a \".\" segment; write it in normalised form");
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return absl::OkStatus();
}

}  // namespace cubist
