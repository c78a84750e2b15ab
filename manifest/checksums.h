// FlashInfer's checksums.txt as a manifest source.
//
// Format: one `<sha256> <relative path>` per line (what FlashInfer publishes next to each
// cubin folder). sha256sum's own forms `<hex>  <path>` (text mode) and `<hex> *<path>`
// (binary mode) are accepted too. Blank lines are skipped; CRLF line ends are accepted.
// The hex must be 64 lowercase characters and each path must satisfy path_rules.h; a
// path may appear once. sha256sum's backslash-escaped names and BSD "--tag" lines are
// not accepted. At least one entry is required.
//
// The result is a Manifest with artifacts only: no size (the fetcher caps such
// downloads), no kernels, name and version from the caller (ManifestParseOptions::
// checksums_name / checksums_version; an empty name is derived from `source`).
//
// Errors are InvalidArgument and name the line:
//   checksums.txt:7: expected '<64 hex> <path>', got "d41d8cd9 a.cubin"
//   checksums.txt:9: duplicate path "a.cubin" (also line 3)
//
// Thread-safe (no shared state).
#ifndef CUBIST_MANIFEST_CHECKSUMS_H_
#define CUBIST_MANIFEST_CHECKSUMS_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "manifest/manifest.h"
#include "manifest/manifest_parser.h"

namespace cubist {

// Parses a checksums.txt (format above). Manifest::source is `source`, Manifest::digest
// the SHA-256 of `bytes`. Input over options.max_bytes is refused unread.
[[nodiscard]] absl::StatusOr<Manifest> ParseChecksums(std::string_view bytes,
                                                      std::string_view source,
                                                      const ManifestParseOptions& options = {});

// True when ParseManifestOrChecksums reads `bytes` as JSON: the first byte that is not
// whitespace (after an optional UTF-8 byte order mark) is '{'.
bool LooksLikeJsonManifest(std::string_view bytes);

// JSON (ParseManifest) when LooksLikeJsonManifest, else checksums.txt (ParseChecksums).
[[nodiscard]] absl::StatusOr<Manifest> ParseManifestOrChecksums(
    std::string_view bytes, std::string_view source, const ManifestParseOptions& options = {});

// ParseManifestOrChecksums with the artifacts packed into `*artifacts` (as
// ParseManifestPacked packs them); the returned manifest has none. A checksums.txt is
// parsed whole first: it holds no more than a path and a hash per line.
[[nodiscard]] absl::StatusOr<Manifest> ParseManifestOrChecksumsPacked(
    std::string_view bytes, std::string_view source, const ManifestParseOptions& options,
    PackedArtifacts* artifacts);

// The manifest name for a checksums.txt read from `source` when the caller gives none:
// the file's stem, or its directory's name when the file is called checksums.*
// ("https://h/cubins/abc123/checksums.txt" -> "abc123"), with characters outside
// [A-Za-z0-9._-] replaced by '-' and cut to 128; "checksums" when nothing is left.
std::string ChecksumsNameFromSource(std::string_view source);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_CHECKSUMS_H_
