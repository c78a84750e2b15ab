// Bundles: one tar file that carries artifact sets to a node without network access.
//
//   on a connected machine:  cubist fetch ...; cubist bundle create --manifest M -o s.tar
//   on the air-gapped node:  cubist bundle import s.tar [--cache DIR] [--trusted-key K]
//
// Layout (tar_stream.h's ustar subset; members in this order):
//   cubist-bundle                         "cubist.bundle/1\n"
//   manifests/<name>.json                 a manifest's exact bytes (or <name>.checksums.txt
//   manifests/<name>.json.sig             for a FlashInfer one), its detached signature
//   objects/sha256/<2 hex>/<64 hex>       every object the manifests name, once, sorted
// Deterministic: the same manifests and cache give the same bytes (no times, owners or
// modes from the machine). Streaming: objects are copied through a fixed buffer.
//
// Import trusts nothing in the file. Manifests come first, so they are checked (the
// signature against the trust policy, parsed) before any object is read; an object must
// be one those manifests name, hashes to its name while it is staged under the cache's
// tmp/, and becomes visible in objects/ only after the whole bundle has been read and
// every artifact of every manifest is accounted for (in the bundle or already cached).
// A truncated or tampered bundle therefore imports nothing. Names come from outside: a
// member that is not a regular file, or whose name is not one of the forms above, is
// refused naming it (tar_stream.h refuses "..", absolute paths, links, devices, FIFOs);
// nothing is written outside the cache and the optional manifests directory, whose file
// names are single path segments checked by path_rules.h.
#ifndef CUBIST_ARTIFACTS_BUNDLE_H_
#define CUBIST_ARTIFACTS_BUNDLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "artifacts/store.h"
#include "artifacts/tar_stream.h"
#include "manifest/manifest.h"
#include "manifest/trust.h"

namespace cubist {

inline constexpr char kBundleMarker[] = "cubist.bundle/1\n";

struct BundleInput {
  Manifest manifest;
  std::string bytes;                     // exactly what was verified and parsed
  std::optional<std::string> signature;  // MANIFEST.sig, when there is one
};

struct BundleReport {
  std::vector<std::string> manifests;  // member names
  uint64_t objects = 0;                // objects written / staged and published
  uint64_t objects_already_cached = 0; // import: present before
  uint64_t bytes = 0;                  // object bytes
};

// Writes the bundle to `output` atomically (a temporary file beside it, flushed and
// renamed). Every artifact must be in `store` (NotFound naming the first missing one and
// the fix). Two manifests with one name are InvalidArgument.
[[nodiscard]] absl::StatusOr<BundleReport> CreateBundle(const Store& store,
                                                        const std::vector<BundleInput>& inputs,
                                                        const std::string& output);

struct ImportBundleOptions {
  TrustPolicy trust;
  // When set, each manifest (and signature) is also written here under its member's
  // file name, so that `cubist fetch --offline --manifest DIR/<name>.json` finds it.
  std::string manifests_dir;
  uint64_t max_manifest_bytes = uint64_t{64} << 20;
  uint64_t max_object_bytes = uint64_t{4} << 30;
};

[[nodiscard]] absl::StatusOr<BundleReport> ImportBundle(const Store& store,
                                                        const std::string& bundle,
                                                        const ImportBundleOptions& options);

// The same from any byte source (`name` in messages): for tests and the fuzzer.
[[nodiscard]] absl::StatusOr<BundleReport> ImportBundleFrom(const Store& store, ByteSource source,
                                                            const std::string& name,
                                                            const ImportBundleOptions& options);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_BUNDLE_H_
