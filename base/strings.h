// String glue. Debian 12's abseil is built with its own absl::string_view (not an alias
// of std::string_view), so std::string_view does not convert to absl::AlphaNum. Wrap it:
//   absl::StrCat("path ", Sv(path))
#ifndef CUBIST_BASE_STRINGS_H_
#define CUBIST_BASE_STRINGS_H_

#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace cubist {

inline absl::string_view Sv(std::string_view s) { return {s.data(), s.size()}; }
inline std::string_view Sv(absl::string_view s) { return {s.data(), s.size()}; }
inline absl::string_view Sv(const std::string& s) { return {s.data(), s.size()}; }
inline absl::string_view Sv(const char* s) { return absl::string_view(s); }

}  // namespace cubist

#endif  // CUBIST_BASE_STRINGS_H_
