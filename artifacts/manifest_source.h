// Reading a manifest from where the user says it is, and every check made on it before
// cubist acts on it: size cap, detached signature (before parsing), parse and
// validation, expiry, rollback. One function so that `fetch`, `verify`, `list`, the
// engine Runtime and every other consumer apply the same rules.
#ifndef CUBIST_ARTIFACTS_MANIFEST_SOURCE_H_
#define CUBIST_ARTIFACTS_MANIFEST_SOURCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "artifacts/fetch_policy.h"
#include "artifacts/store.h"
#include "artifacts/transport.h"
#include "base/clock.h"
#include "manifest/manifest.h"
#include "manifest/manifest_binary.h"
#include "manifest/trust.h"

namespace cubist {

// Reads of manifests and signatures slower than this many bytes per second for the
// stall window (OpenManifestOptions::stall, ReadLocationIfChanged) are stalled: the
// fetcher's floor for artifacts (FetchOptions::low_speed_bytes).
inline constexpr int64_t kStallBytesPerSecond = 1024;
inline constexpr absl::Duration kDefaultStall = absl::Seconds(20);

struct OpenManifestOptions {
  // No network: a URL manifest is read from the copy the cache kept at the last online
  // read (NotFound naming the URL when there is none).
  bool offline = false;
  TrustPolicy trust;
  uint64_t max_bytes = uint64_t{64} << 20;
  absl::Duration timeout = absl::Seconds(60);
  // A read of the manifest or its signature slower than kStallBytesPerSecond for this
  // long is abandoned as stalled and retried like a timeout: `fetch --stall-seconds`,
  // which bounds the artifacts' transfers the same way.
  absl::Duration stall = kDefaultStall;
  int attempts = 4;  // for 5xx, timeouts and resets
  // Optional: where URL manifests are remembered (for offline use, and with their ETag
  // for a conditional GET next time), where parsed manifests are kept
  // (parsed_manifest_cache.h) and where the rollback record lives. Without a store none
  // of that happens.
  const Store* store = nullptr;
  // Record the version as the highest verified (fetch does; read-only commands don't,
  // they only compare).
  bool record_version = false;
  // Leave the artifacts packed (OpenedManifest::packed_artifacts) instead of building
  // manifest.artifacts: in the cached entry when the parse comes from the cache, else
  // packed as they are parsed. For fetch, whose warm path needs no more than a look at
  // each (manifest_binary.h), and whose first read of a large manifest then never holds
  // them all built.
  bool pack_artifacts = false;
};

struct OpenedManifest {
  Manifest manifest;
  std::string bytes;          // the exact bytes that were verified and parsed
  bool from_offline_copy = false;
  // Things the user should hear about that are not errors (an OCI tag that moved).
  std::vector<std::string> notices;
  // Set only with OpenManifestOptions::pack_artifacts: the artifacts, packed (read in
  // place from the cache's parse, or packed as they were parsed), and
  // manifest.artifacts empty until UnpackArtifacts().
  std::optional<PackedArtifacts> packed_artifacts;

  // Moves packed artifacts, if any, into manifest.artifacts.
  void UnpackArtifacts();
};

// Reads `location` (http(s):// or file:// URL, an oci:// reference (oci_manifest_source.h),
// or a local path; a JSON manifest or a
// FlashInfer checksums.txt), checks and parses it. Errors: NotFound (404, no such
// file), Unavailable (network, after retries), InvalidArgument (malformed, too large),
// PermissionDenied (signature), FailedPrecondition (expired, rollback).
// Defined in open_manifest.cc, above both sources: an oci:// reference goes to
// OpenOciManifest, anything else to OpenUrlOrPathManifest.
[[nodiscard]] absl::StatusOr<OpenedManifest> OpenManifest(std::string_view location,
                                                          const OpenManifestOptions& options);

// OpenManifest of a location that is not an oci:// reference: an http(s):// or file://
// URL or a local path. The OCI source hands the blobs it verified to it as files, so
// that signature, schema, expiry and rollback are checked by this one function.
[[nodiscard]] absl::StatusOr<OpenedManifest> OpenUrlOrPathManifest(
    std::string_view location, const OpenManifestOptions& options);

// Reads the bytes at a URL or path, at most `max_bytes` (InvalidArgument beyond).
// NotFound for HTTP 404/410 and missing files; Unavailable for other failures after
// `attempts` tries with backoff.
[[nodiscard]] absl::StatusOr<std::string> ReadLocation(std::string_view location,
                                                       uint64_t max_bytes,
                                                       absl::Duration timeout,
                                                       int attempts);

// What ReadLocationIfChanged read.
struct LocationRead {
  std::string bytes;          // empty when not_modified
  std::string etag;           // the server's ETag for `bytes`, if it sent one
  bool not_modified = false;  // the server answered 304 to If-None-Match: `etag` given
};

// What ReadLocation talks to, for tests: a fake transport and a clock that only
// pretends to sleep run every retry and backoff case in microseconds. Null members
// mean the real ones; `seed` 0 draws the backoff jitter from std::random_device.
struct ReadSeams {
  Transport* transport = nullptr;
  Clock* clock = nullptr;
  RetryPolicy retry;  // attempts_per_source is ReadLocation's `attempts`
  uint64_t seed = 0;
};
[[nodiscard]] absl::StatusOr<std::string> ReadLocation(std::string_view location,
                                                       uint64_t max_bytes,
                                                       absl::Duration timeout, int attempts,
                                                       const ReadSeams& seams);

// ReadLocation, conditional: with `etag` non-empty and an http(s) URL, the request
// carries If-None-Match: `etag`, and a 304 comes back as not_modified (no bytes). A 304
// to a request without it is an error like any other unexpected status. Paths and
// file:// URLs are read as ReadLocation reads them. A transfer slower than
// kStallBytesPerSecond for `stall` is a stall, retried like a timeout (ReadLocation
// reads with kDefaultStall).
[[nodiscard]] absl::StatusOr<LocationRead> ReadLocationIfChanged(
    std::string_view location, std::string_view etag, uint64_t max_bytes,
    absl::Duration timeout, int attempts, const ReadSeams& seams = {},
    absl::Duration stall = kDefaultStall);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_MANIFEST_SOURCE_H_
