// Writes a manifest as JSON in one stable form, so that the same manifest always gives
// the same bytes (and the same digest and signature):
//   - keys in the order of manifest.h's comment: schema, name, version, expires,
//     base_urls, artifacts, kernels; in an artifact path, sha256, size; in a kernel name,
//     artifact, function, arch, op, abi, weight_format, activation_format, activation,
//     tile_m, tile_n, tile_k, cluster, stages, threads, shared_mem_bytes;
//   - extras after the known keys, sorted by key (an extra that reuses a known key's
//     name is not written); their nested objects keep their own key order;
//   - optional fields only when set (expires, base_urls when non-empty, size);
//   - 2-space indentation, arrays of numbers on one line ("cluster": [1, 1, 1]), UTF-8
//     kept as is, a trailing newline;
//   - expires in UTC as "2027-01-01T00:00:00Z" (fractional seconds when non-zero).
//
// Round trip: for any manifest ParseManifest accepts, ParseManifest(WriteManifest(m))
// equals m (SameContent), and writing that again gives identical bytes. Extras must hold
// JSON text (as the parser stores them); text that does not parse is written as a JSON
// string holding it, so the output is always valid JSON.
//
// Thread-safe (no shared state).
#ifndef CUBIST_MANIFEST_MANIFEST_WRITER_H_
#define CUBIST_MANIFEST_MANIFEST_WRITER_H_

#include <string>

#include "absl/status/status.h"
#include "manifest/manifest.h"

namespace cubist {

std::string WriteManifest(const Manifest& manifest);

// Writes WriteManifest(manifest) to `path` atomically (temporary file in the same
// directory, fsync, rename, fsync of the directory), mode 0644. On failure `path` is
// untouched and no temporary file is left. Errors as base/file_util.h's
// WriteFileAtomically (PermissionDenied, ResourceExhausted, NotFound, Internal).
[[nodiscard]] absl::Status WriteManifestFile(const Manifest& manifest, const std::string& path);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_MANIFEST_WRITER_H_
