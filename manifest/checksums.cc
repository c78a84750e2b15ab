#include "manifest/checksums.h"

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/manifest_binary.h"
#include "manifest/message_text.h"
#include "manifest/path_rules.h"

namespace cubist {
namespace {

bool IsBlank(std::string_view line) {
  return line.find_first_not_of(" \t") == std::string_view::npos;
}

absl::Status LineError(std::string_view source, size_t line, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(Sv(source), ":", line, ": ", Sv(what)));
}

}  // namespace

std::string ChecksumsNameFromSource(std::string_view source) {
  std::string_view s = source;
  if (s.find("://") != std::string_view::npos) {
    s = s.substr(0, s.find_first_of("?#"));
  }
  std::vector<std::string_view> parts;
  for (size_t start = 0; start <= s.size();) {
    size_t slash = s.find('/', start);
    if (slash == std::string_view::npos) slash = s.size();
    if (slash > start) parts.push_back(s.substr(start, slash - start));
    start = slash + 1;
  }
  std::string_view candidate;
  if (!parts.empty()) {
    std::string_view file = parts.back();
    const size_t dot = file.rfind('.');
    std::string_view stem = dot == std::string_view::npos || dot == 0 ? file : file.substr(0, dot);
    if (stem != "checksums") {
      candidate = stem;
    } else if (parts.size() >= 2 && parts[parts.size() - 2].find(':') == std::string_view::npos) {
      candidate = parts[parts.size() - 2];
    }
  }
  std::string name;
  for (char c : candidate.substr(0, 128)) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    name += ok ? c : '-';
  }
  if (name.empty() || name == "." || name == "..") return "checksums";
  return name;
}

absl::StatusOr<Manifest> ParseChecksums(std::string_view bytes, std::string_view source,
                                        const ManifestParseOptions& options) {
  if (bytes.size() > options.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(source), ": ", bytes.size(), " bytes is over the limit of ", options.max_bytes,
        " bytes; is this the right file? (raise ManifestParseOptions::max_bytes if so)"));
  }
  Manifest m;
  m.name = options.checksums_name.empty() ? ChecksumsNameFromSource(source)
                                          : options.checksums_name;
  if (absl::Status s = ValidateManifestName(m.name); !s.ok()) {
    return Annotate(s, absl::StrCat(Sv(source), ": manifest name"));
  }
  if (options.checksums_version < 1 || options.checksums_version > kMaxManifestInteger) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(source), ": manifest version: expected an integer from 1 to ",
                     kMaxManifestInteger, ", got ", options.checksums_version));
  }
  m.version = options.checksums_version;

  absl::flat_hash_map<std::string, size_t> lines_by_path;
  size_t line_no = 0;
  for (size_t start = 0; start < bytes.size();) {
    size_t nl = bytes.find('\n', start);
    if (nl == std::string_view::npos) nl = bytes.size();
    std::string_view line = bytes.substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (IsBlank(line)) continue;

    // `<64 hex> <path>`; sha256sum adds one more ' ' (text) or '*' (binary) before the
    // path. A FlashInfer path that itself starts with ' ' or '*' is therefore read
    // without it; neither occurs in practice.
    if (line.size() < 66 || !IsSha256Hex(line.substr(0, 64)) || line[64] != ' ') {
      return LineError(source, line_no,
                       absl::StrCat("expected '<64 hex> <path>', got ", QuoteForMessage(line)));
    }
    std::string_view path = line.substr(65);
    if (!path.empty() && (path.front() == ' ' || path.front() == '*')) path.remove_prefix(1);
    if (absl::Status s = ValidateArtifactPath(path); !s.ok()) {
      return LineError(source, line_no, Sv(s.message()));
    }
    auto [it, inserted] = lines_by_path.emplace(std::string(path), line_no);
    if (!inserted) {
      return LineError(source, line_no,
                       absl::StrCat("duplicate path ", QuoteForMessage(path), " (also line ",
                                    it->second, "); each file may be listed once"));
    }
    Artifact a;
    a.path = std::string(path);
    a.sha256 = std::string(line.substr(0, 64));
    m.artifacts.push_back(std::move(a));
  }
  for (const Artifact& a : m.artifacts) {
    std::string_view parent = ListedParentOf(
        a.path, [&](std::string_view p) { return lines_by_path.contains(Sv(p)); });
    if (!parent.empty()) {
      return LineError(source, lines_by_path.find(a.path)->second,
                       absl::StrCat(QuoteForMessage(a.path), " lies under ",
                                    QuoteForMessage(parent), " (line ",
                                    lines_by_path.find(Sv(parent))->second,
                                    "), which is listed as a file; a path cannot be both a "
                                    "file and a directory"));
    }
  }
  if (m.artifacts.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(source), ": no entries; expected lines '<64 hex> <path>' (is this a checksums.txt?)"));
  }
  m.source = std::string(source);
  m.digest = Sha256Hex(bytes);
  return m;
}

bool LooksLikeJsonManifest(std::string_view bytes) {
  std::string_view rest = bytes;
  if (rest.substr(0, 3) == "\xEF\xBB\xBF") rest.remove_prefix(3);
  const size_t first = rest.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && rest[first] == '{';
}

absl::StatusOr<Manifest> ParseManifestOrChecksums(std::string_view bytes,
                                                  std::string_view source,
                                                  const ManifestParseOptions& options) {
  if (LooksLikeJsonManifest(bytes)) return ParseManifest(bytes, source, options);
  return ParseChecksums(bytes, source, options);
}

absl::StatusOr<Manifest> ParseManifestOrChecksumsPacked(std::string_view bytes,
                                                        std::string_view source,
                                                        const ManifestParseOptions& options,
                                                        PackedArtifacts* artifacts) {
  if (LooksLikeJsonManifest(bytes)) return ParseManifestPacked(bytes, source, options, artifacts);
  CUBIST_ASSIGN_OR_RETURN(Manifest m, ParseChecksums(bytes, source, options));
  PackedArtifactsBuilder builder;
  for (const Artifact& a : m.artifacts) builder.Add(a);
  m.artifacts = {};
  *artifacts = std::move(builder).Finish();
  return m;
}

}  // namespace cubist
