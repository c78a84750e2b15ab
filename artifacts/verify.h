// Verifying a manifest's artifacts in the store: presence and size (a stat each), or,
// with `deep`, a re-hash of every byte on all cores to catch disk rot.
//
// A deep check that finds a corrupt object removes it (under the object's lock): an
// object's presence promises verified content, so a corrupt one must not stay where a
// loader or a `fetch` would trust it. The next `cubist fetch` downloads it again.
//
// An object whose size differs from the manifest's is hashed (deep or not): when its
// bytes hash to its name the object is right and the manifest entry is wrong, so it is
// never removed (any unsigned manifest could otherwise evict another set's objects from
// a shared cache); that entry is DataLoss naming the manifest and both sizes.
#ifndef CUBIST_ARTIFACTS_VERIFY_H_
#define CUBIST_ARTIFACTS_VERIFY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "artifacts/store.h"
#include "manifest/manifest.h"

namespace cubist {

struct VerifyOptions {
  std::string manifest;         // its name or location, for messages that blame it
  bool deep = false;
  int threads = 0;              // 0: every core
  bool remove_corrupt = true;   // deep only
};

enum class VerifyState { kOk, kMissing, kSizeMismatch, kHashMismatch, kNotRegular, kUnreadable };
const char* VerifyStateName(VerifyState state);

struct VerifyEntry {
  std::string path;
  std::string expected_sha256;
  std::optional<uint64_t> expected_size;
  uint64_t actual_size = 0;
  std::string actual_sha256;  // deep only
  VerifyState state = VerifyState::kOk;
  bool removed = false;
  std::string message;        // empty when OK: "<path>: sha256 mismatch: expected .., got .."
};

struct VerifyReport {
  std::vector<VerifyEntry> entries;  // manifest order
  int ok = 0, missing = 0, corrupt = 0;
  uint64_t bytes_hashed = 0;
  absl::Duration elapsed;
  // OK only if every artifact is present (and, deep, hashes right). DataLoss when any is
  // corrupt (it wins over missing), else NotFound when any is missing.
  absl::Status status;
};

// True when the object `sha256` in `store` is a regular file whose bytes hash to its
// name; `size` receives its length. Reads the whole object.
bool ObjectHashesToName(const Store& store, std::string_view sha256, uint64_t* size);

// The DataLoss for a manifest entry whose size is wrong for an object that hashes right.
absl::Status ManifestSizeWrong(std::string_view manifest, std::string_view path,
                               std::string_view sha256, uint64_t manifest_size,
                               uint64_t object_size);

VerifyReport VerifyArtifacts(const Store& store, const std::vector<Artifact>& artifacts,
                             const VerifyOptions& options);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_VERIFY_H_
