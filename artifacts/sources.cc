#include "artifacts/sources.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/strings.h"
#include "manifest/manifest.h"

namespace cubist {

bool IsNetworkUrl(std::string_view location) {
  return absl::StartsWithIgnoreCase(Sv(location), "http://") ||
         absl::StartsWithIgnoreCase(Sv(location), "https://");
}

bool IsUrl(std::string_view location) {
  return IsNetworkUrl(location) || absl::StartsWithIgnoreCase(Sv(location), "file://");
}

namespace {

std::string PercentEncodePath(std::string_view path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(path.size());
  for (unsigned char c : path) {
    bool keep = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '-' || c == '.' || c == '_' || c == '~' || c == '/';
    if (keep) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace

std::string NormalizeBase(std::string_view base) {
  std::string out;
  if (IsUrl(base)) {
    out = std::string(base);
  } else {
    std::error_code ec;
    auto abs = std::filesystem::absolute(std::filesystem::path(std::string(base)), ec);
    out = absl::StrCat("file://", PercentEncodePath(ec ? std::string(base) : abs.string()));
  }
  if (out.empty() || out.back() != '/') out.push_back('/');
  return out;
}

std::string LocationBase(std::string_view location) {
  if (IsUrl(location)) {
    // Strip query and fragment, then the last path segment.
    size_t end = location.find_first_of("?#");
    std::string_view path = location.substr(0, end);
    size_t slash = path.rfind('/');
    size_t scheme_end = path.find("://");
    if (slash == std::string_view::npos || slash < scheme_end + 3) {
      return absl::StrCat(Sv(path), "/");
    }
    return std::string(path.substr(0, slash + 1));
  }
  std::filesystem::path p{std::string(location)};
  std::string dir = p.parent_path().string();
  return NormalizeBase(dir.empty() ? "." : dir);
}

std::string JoinUrl(std::string_view base, std::string_view relative_path) {
  std::string b(base);
  if (b.empty() || b.back() != '/') b.push_back('/');
  return b + PercentEncodePath(relative_path);
}

std::vector<std::string> ArtifactBases(const Manifest& manifest,
                                       const std::vector<std::string>& mirrors) {
  std::vector<std::string> out;
  auto add = [&](std::string_view b) {
    std::string n = NormalizeBase(b);
    if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(std::move(n));
  };
  for (const std::string& m : mirrors) add(m);
  for (const std::string& b : manifest.base_urls) add(b);
  if (!manifest.source.empty() && manifest.source != "<memory>") {
    std::string base = LocationBase(manifest.source);
    if (std::find(out.begin(), out.end(), base) == out.end()) out.push_back(base);
  }
  return out;
}

}  // namespace cubist
