// Publishing an artifact set to an OCI registry, as ORAS publishes non-image artifacts:
// every artifact is a blob whose digest is its sha256 (nothing is hashed again: the
// registry checks each digest as it stores the blob), the cubist manifest and its
// signature are blobs too, and one OCI image manifest ties them together:
//   artifactType  application/vnd.cubist.artifact-set.v1
//   config        the empty descriptor ({}; application/vnd.oci.empty.v1+json)
//   layers        the cubist manifest, its signature (when present), then one layer per
//                 distinct artifact, each annotated org.opencontainers.image.title =
//                 its path (so `oras pull` recreates the published directory)
// The image manifest's JSON is deterministic (sorted keys, no timestamps): pushing the
// same set twice gives the same digest.
//
// Blobs the registry already has are skipped after a HEAD, so an interrupted push is
// finished by running it again. Uploads are monolithic (POST, then one PUT) up to
// `monolithic_max` bytes and when the registry takes them; larger blobs, or a registry
// (or proxy) that answers 413 to a monolithic PUT, get chunked PATCH uploads.
#ifndef CUBIST_ARTIFACTS_OCI_PUSH_H_
#define CUBIST_ARTIFACTS_OCI_PUSH_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "artifacts/oci_reference.h"
#include "artifacts/store.h"
#include "manifest/manifest.h"

namespace cubist {

struct PushOptions {
  int jobs = 8;                                   // blobs in flight (one connection each)
  uint64_t monolithic_max = uint64_t{256} << 20;  // larger blobs are uploaded in chunks
  uint64_t chunk_size = uint64_t{64} << 20;
};

struct PushReport {
  std::string digest;         // "sha256:..." of the image manifest
  int blobs_uploaded = 0;
  int blobs_present = 0;      // skipped: the registry had them
  uint64_t bytes_uploaded = 0;
  absl::Duration elapsed;
};

// The set to push: the cubist manifest's exact bytes (what the signature signs), the
// parsed manifest, its detached signature when there is one, the directory its
// artifact paths are relative to ("" for none), and a cache to take an artifact from
// when it is not in that directory (a fetched set, mirrored into a site's registry).
struct PushSource {
  std::string manifest_bytes;
  Manifest manifest;
  std::optional<std::string> signature;
  std::string artifact_dir;
  const Store* cache = nullptr;
};

// The OCI image manifest for `source` whose blobs have the given sizes (exposed for
// tests; `sizes` in the order of source.manifest.artifacts).
std::string BuildOciImageManifest(const PushSource& source,
                                  const std::vector<uint64_t>& sizes);

// Pushes the set to `ref` (which must name a tag, not a digest). Errors: NotFound (an
// artifact file is missing), DataLoss (a file's size or digest differs from the
// manifest: the registry refuses the upload), PermissionDenied (login), Unavailable.
[[nodiscard]] absl::StatusOr<PushReport> PushArtifactSet(const OciReference& ref,
                                                         const PushSource& source,
                                                         const PushOptions& options);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_OCI_PUSH_H_
