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

bool KeptAsIs(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '-' || c == '.' || c == '_' || c == '~' || c == '/';
}

// Appends `path` to `out`, percent-encoding what a URL path may not hold as is. Most
// paths need nothing encoded: they are appended in one piece (PlanFetch does this once
// per artifact, 13,000 times for a FlashInfer FMHA set).
void AppendPercentEncoded(std::string_view path, std::string* out) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  size_t plain = 0;
  while (plain < path.size() && KeptAsIs(static_cast<unsigned char>(path[plain]))) ++plain;
  out->append(path.data(), plain);
  for (unsigned char c : path.substr(plain)) {
    if (KeptAsIs(c)) {
      out->push_back(static_cast<char>(c));
    } else {
      out->push_back('%');
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 15]);
    }
  }
}

std::string PercentEncodePath(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  AppendPercentEncoded(path, &out);
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
  std::string url;
  url.reserve(base.size() + 1 + relative_path.size());
  url.append(base);
  if (url.empty() || url.back() != '/') url.push_back('/');
  AppendPercentEncoded(relative_path, &url);
  return url;
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
