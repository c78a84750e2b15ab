#include "artifacts/sources.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
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

// The local path of a file:// URL ("file:///a%20b" -> "/a b"; "file://localhost/x" ->
// "/x").
std::string FileUrlPath(std::string_view url) {
  std::string_view rest = url.substr(7);
  if (absl::StartsWithIgnoreCase(Sv(rest), "localhost/")) rest.remove_prefix(9);
  rest = rest.substr(0, rest.find_first_of("?#"));
  std::string out;
  out.reserve(rest.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == '%' && i + 2 < rest.size() + 0 && hex(rest[i + 1]) >= 0 &&
        hex(rest[i + 2]) >= 0) {
      out.push_back(static_cast<char>(hex(rest[i + 1]) * 16 + hex(rest[i + 2])));
      i += 2;
    } else {
      out.push_back(rest[i]);
    }
  }
  return out;
}

const char* FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  return "not a regular file";
}

}  // namespace

absl::Status CheckFileUrlIsRegular(std::string_view url) {
  if (!absl::StartsWithIgnoreCase(Sv(url), "file://")) return absl::OkStatus();
  const std::string path = FileUrlPath(url);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      Sv(url), ": ", path, " is ", FileKind(st.st_mode),
      "; cubist reads local sources only from regular files"));
}

absl::Status CheckRemoteManifestSources(const Manifest& manifest, std::string_view location) {
  for (size_t i = 0; i < manifest.base_urls.size(); ++i) {
    if (IsNetworkUrl(manifest.base_urls[i])) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(location), ": base_urls[", i, "] is ", manifest.base_urls[i],
        "; a manifest read over the network may name only http:// and https:// sources "
        "(to use a local copy, pass it yourself with --mirror)"));
  }
  return absl::OkStatus();
}

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
