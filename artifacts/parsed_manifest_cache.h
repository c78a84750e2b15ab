// Parsed manifests, kept in the cache so that a warm fetch of a large set does not parse
// and validate its manifest again: for FlashInfer's 13,453-file checksums.txt that was
// as long as stat()ing every object.
//
// An entry is the manifest parsed from some bytes, stored under
//   manifests/parsed/<sha256 of the bytes>                 (a JSON manifest)
//   manifests/parsed/<sha256 of the bytes>.<manifest name> (a checksums.txt, whose name
//                                                           comes from where it was read)
// in manifest_binary.h's self-checking form. The key is the digest of the exact bytes
// the caller verified (signature, size cap) the same way it would before parsing them,
// so a changed or tampered manifest has another key and is parsed afresh; an entry is
// only used when it is intact and names that digest (and that name) inside, so a damaged,
// truncated or misfiled entry is ignored and rewritten. Entries are written to a temp
// file and renamed, so processes that write one entry at once leave one whole entry.
// Expiry and rollback are checks on the manifest, not on its parse: callers make them on
// a cached manifest as on a freshly parsed one (manifest_source.h does).
//
// Thread-safe: no state beyond the store's root.
#ifndef CUBIST_ARTIFACTS_PARSED_MANIFEST_CACHE_H_
#define CUBIST_ARTIFACTS_PARSED_MANIFEST_CACHE_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "artifacts/store.h"
#include "manifest/manifest.h"
#include "manifest/manifest_binary.h"

namespace cubist {

class ParsedManifestCache {
 public:
  explicit ParsedManifestCache(const Store& store);

  // What ParseManifestOrChecksums(bytes, source) returns (with default options), when an
  // intact entry holds it; nullopt when there is none, or it is damaged or stale.
  // `digest` is the SHA-256 (hex) of `bytes`, which the caller has computed already.
  // With `packed`, the artifacts are left in the entry, read through `*packed`
  // (manifest_binary.h), and the returned manifest has none.
  std::optional<Manifest> Find(std::string_view bytes, std::string_view digest,
                               std::string_view source,
                               PackedArtifacts* packed = nullptr) const;

  // Remembers `manifest`, parsed from `bytes` read from `source` (manifest.digest is
  // their SHA-256). Atomic; a failure leaves no partial entry.
  [[nodiscard]] absl::Status Put(const Manifest& manifest, std::string_view bytes,
                                 std::string_view source) const;
  // The same for a manifest whose artifacts are packed (`artifacts`; it has none).
  [[nodiscard]] absl::Status Put(const Manifest& manifest, const PackedArtifacts& artifacts,
                                 std::string_view bytes, std::string_view source) const;

  // The directory of the entries (for gc).
  const std::string& dir() const { return dir_; }

 private:
  // The entry's path, and the name the manifest must have ("" for JSON).
  std::string EntryPath(std::string_view bytes, std::string_view digest,
                        std::string_view source, std::string* name) const;
  absl::Status Write(const Manifest& manifest, const PackedArtifacts* artifacts,
                     std::string_view bytes, std::string_view source) const;

  std::string dir_;
};

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_PARSED_MANIFEST_CACHE_H_
