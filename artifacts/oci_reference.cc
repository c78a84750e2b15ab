#include "artifacts/oci_reference.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/sha256.h"
#include "base/strings.h"

namespace cubist {
namespace {

bool IsLoopbackHost(std::string_view host_port) {
  std::string_view host = host_port;
  if (!host.empty() && host[0] == '[') {
    size_t close = host.find(']');
    host = host.substr(1, close == std::string_view::npos ? host.size() : close - 1);
    return host == "::1";
  }
  host = host.substr(0, host.find(':'));
  return host == "localhost" || absl::StartsWith(Sv(host), "127.");
}

// True when `host_port` is in the comma-separated list of HOST[:PORT] in `variable`.
bool ListedIn(const char* variable, std::string_view host_port) {
  const char* env = std::getenv(variable);
  if (env == nullptr) return false;
  for (absl::string_view h : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
    if (absl::StripAsciiWhitespace(h) == Sv(host_port)) return true;
  }
  return false;
}

// Distribution spec: path components of [a-z0-9]+ joined by '.', '_', '__' or '-'+.
// Checked loosely (the registry has the last word) but strictly enough that nothing
// odd reaches a URL: lowercase alphanumerics and . _ - between slashes.
bool ValidRepository(std::string_view repo) {
  if (repo.empty() || repo.size() > 255) return false;
  for (absl::string_view part : absl::StrSplit(Sv(repo), '/')) {
    if (part.empty()) return false;
    if (!absl::ascii_isalnum(static_cast<unsigned char>(part.front())) ||
        !absl::ascii_isalnum(static_cast<unsigned char>(part.back()))) {
      return false;
    }
    for (char c : part) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
                c == '-';
      if (!ok) return false;
    }
  }
  return true;
}

bool ValidTag(std::string_view tag) {
  if (tag.empty() || tag.size() > 128) return false;
  if (!(absl::ascii_isalnum(static_cast<unsigned char>(tag[0])) || tag[0] == '_')) return false;
  for (char c : tag) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' ||
          c == '-')) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool IsOciReference(std::string_view location) {
  return absl::StartsWithIgnoreCase(Sv(location), "oci://");
}

absl::StatusOr<OciReference> ParseOciReference(std::string_view location) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OCI reference '", Sv(location), "': ", Sv(why),
        "; expected oci://HOST[:PORT]/REPO[:TAG] or oci://HOST[:PORT]/REPO@sha256:DIGEST"));
  };
  if (!IsOciReference(location)) return bad("does not start with oci://");
  std::string_view rest = location.substr(6);
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0) return bad("no registry host");
  OciReference ref;
  ref.host = std::string(rest.substr(0, slash));
  for (char c : ref.host) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
          c == ':' || c == '[' || c == ']')) {
      return bad(absl::StrCat("bad character '", std::string(1, c), "' in the host"));
    }
  }
  std::string_view name = rest.substr(slash + 1);
  size_t at = name.find('@');
  if (at != std::string_view::npos) {
    std::string_view digest = name.substr(at + 1);
    if (!absl::StartsWith(Sv(digest), "sha256:") || !IsSha256Hex(digest.substr(7))) {
      return bad("the digest must be sha256: and 64 lowercase hex digits");
    }
    ref.digest = std::string(digest);
    name = name.substr(0, at);
  }
  // A ':' after the last '/' starts the tag (a ':' before it is part of HOST:PORT,
  // which was split off above).
  size_t last_slash = name.rfind('/');
  size_t colon = name.find(':', last_slash == std::string_view::npos ? 0 : last_slash);
  if (colon != std::string_view::npos) {
    ref.tag = std::string(name.substr(colon + 1));
    name = name.substr(0, colon);
    if (!ValidTag(ref.tag)) return bad(absl::StrCat("bad tag '", ref.tag, "'"));
  } else if (ref.digest.empty()) {
    ref.tag = "latest";
  }
  if (!ValidRepository(name)) {
    return bad(absl::StrCat("bad repository name '", Sv(name),
                            "' (lowercase letters, digits, '.', '_', '-' between slashes)"));
  }
  ref.repository = std::string(name);
  ref.plain_http = (IsLoopbackHost(ref.host) && !ListedIn("CUBIST_REGISTRY_HTTPS", ref.host)) ||
                   ListedIn("CUBIST_REGISTRY_PLAIN_HTTP", ref.host);
  return ref;
}

std::string OciReference::RepositoryUrl() const {
  return absl::StrCat(plain_http ? "http://" : "https://", host, "/v2/", repository, "/");
}

std::string OciReference::ToString() const {
  std::string s = absl::StrCat("oci://", host, "/", repository);
  if (!tag.empty()) absl::StrAppend(&s, ":", tag);
  if (!digest.empty()) absl::StrAppend(&s, "@", digest);
  return s;
}

std::string MirrorRepositoryUrl(std::string_view mirror_base, const OciReference& ref) {
  std::string base(mirror_base);
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (absl::EndsWith(base, "/v2")) base.resize(base.size() - 3);
  return absl::StrCat(base, "/v2/", ref.repository, "/");
}

}  // namespace cubist
