// Reads a manifest from JSON bytes (format: manifest.h) and validates it strictly.
//
// Limits keep memory bounded whatever the input: bytes over ManifestParseOptions::max_bytes
// are refused before parsing, and nesting deeper than max_depth is refused before any
// value is built. The input must be UTF-8; objects must not repeat a key.
//
// Every error is InvalidArgument and names the source, the JSON path and what was
// expected, e.g.
//   manifest.json: artifacts[12].sha256: expected 64 lowercase hex characters, got 63
//   manifest.json: kernels[3].tile_m: expected a positive integer, got "64"
//   manifest.json:3:14: syntax error: while parsing object key - ...
// Validation rules (first failure wins, in document order):
//   schema       == "cubist.manifest/1"
//   name         [A-Za-z0-9._-]{1,128}
//   version      integer 1..2^53
//   expires      optional, RFC 3339 ("2027-01-01T00:00:00Z", offsets allowed)
//   base_urls    optional array of strings starting http://, https:// or file://
//   artifacts    required array; path (path_rules.h), sha256 (64 lowercase hex), size
//                (integer 0..2^53); no path twice
//   kernels      optional array; name (unique), artifact (one of the artifact paths),
//                function, arch (sm_NN[N] with optional 'a' or 'f'), op, abi (> 0),
//                weight_format, activation_format, activation (non-empty strings),
//                tile_m/n/k, stages, threads (> 0), shared_mem_bytes (>= 0),
//                cluster (optional [x, y, z] of positive integers, default [1, 1, 1])
// Unknown fields at any level are kept in `extras` (compact JSON text) and ignored.
//
// Thread-safe (no shared state).
#ifndef CUBIST_MANIFEST_MANIFEST_PARSER_H_
#define CUBIST_MANIFEST_MANIFEST_PARSER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "manifest/manifest.h"
#include "manifest/manifest_binary.h"

namespace cubist {

// Largest version and artifact size: integers a double (and so every JSON reader) holds
// exactly.
inline constexpr int64_t kMaxManifestInteger = int64_t{1} << 53;

struct ManifestParseOptions {
  // Input larger than this is refused unread (64 MiB holds ~200k artifacts).
  uint64_t max_bytes = uint64_t{64} << 20;
  // Deepest allowed nesting of arrays and objects (the format itself needs 4).
  int max_depth = 64;
  // A JSON manifest must give every artifact's size. False accepts a manifest without
  // them, as WriteManifest writes for one that came from a checksums.txt.
  bool require_artifact_size = true;
  // For checksums.txt input (checksums.h), which has no name or version of its own:
  // the manifest name (empty: derived from `source`) and version.
  std::string checksums_name;
  int64_t checksums_version = 1;
};

// Parses and validates a JSON manifest. `source` names it in messages and is stored in
// Manifest::source; Manifest::digest is the SHA-256 of `bytes`.
[[nodiscard]] absl::StatusOr<Manifest> ParseManifest(std::string_view bytes,
                                                     std::string_view source,
                                                     const ManifestParseOptions& options = {});

// ParseManifest, with the artifacts packed (manifest_binary.h) into `*artifacts` instead
// of built: the returned manifest has none. The same checks and messages. The artifacts
// list is never held as a JSON document or as Artifacts, so a large manifest's first read
// costs little more than its bytes and their packed form (bench/manifest_memory.py).
[[nodiscard]] absl::StatusOr<Manifest> ParseManifestPacked(std::string_view bytes,
                                                           std::string_view source,
                                                           const ManifestParseOptions& options,
                                                           PackedArtifacts* artifacts);

// Parses a kernels file: a JSON array of kernel objects, or an object with a "kernels"
// array (other keys ignored). Each kernel is validated as in a manifest, names must be
// unique; whether each kernel's artifact exists is left to the caller. Paths in messages
// are "[3].tile_m" for the array form and "kernels[3].tile_m" for the object form.
[[nodiscard]] absl::StatusOr<std::vector<KernelSpec>> ParseKernelList(
    std::string_view bytes, std::string_view source, const ManifestParseOptions& options = {});

// OK when `name` is a valid manifest name ([A-Za-z0-9._-]{1,128}); else InvalidArgument
// "expected 1 to 128 characters from [A-Za-z0-9._-], got \"...\"".
[[nodiscard]] absl::Status ValidateManifestName(std::string_view name);

// OK when `arch` reads sm_<2 or 3 digits>[a|f] ("sm_90a", "sm_100f", "sm_120").
[[nodiscard]] absl::Status ValidateArch(std::string_view arch);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_MANIFEST_PARSER_H_
