// Rollback protection: the cache remembers, per manifest name, the highest `version`
// that passed every check in effect (the signature, when trusted keys are configured),
// and refuses an older one. This is TUF's rule against a mirror or an attacker serving
// a stale, once-valid manifest (with known-bad kernels) to a node that has seen a newer.
//
// State, under the cache root:
//   state/versions/<name>        "cubist.version-state/1", then "name <name>",
//                                "version <n>", "digest <hex>" lines; written atomically
//   locks/version-<name>.lock    taken around check-and-record (FileLock)
// <name> is the manifest name with every byte outside [A-Za-z0-9._-] (and a leading
// '.') percent-encoded; a name whose encoded form would pass 200 bytes (a long name, or
// one of 67 or more bytes that each take three) uses "sha256-<hex of the name>", so that
// "version-<name>.lock" stays within NAME_MAX (255) whatever the name.
//
// Call CheckAndRecord only after the manifest's bytes verified and parsed: the record
// must never hold a version nobody trusted. A version equal to the recorded one is
// accepted (re-fetching the same release is normal). With allow_rollback an older
// version is accepted but the record keeps the higher one, so protection resumes as
// soon as the flag is dropped.
//
// Thread and process safety: CheckAndRecord serialises on the per-name lock file, so
// concurrent processes sharing a cache agree; Highest reads without the lock (the
// record is replaced by rename, so a reader sees the old or the new one, whole).
#ifndef CUBIST_ARTIFACTS_VERSION_GUARD_H_
#define CUBIST_ARTIFACTS_VERSION_GUARD_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cubist {

struct Manifest;

struct VersionRecord {
  std::string name;
  int64_t version = 0;
  std::string digest;  // SHA-256 hex of the manifest bytes recorded; may be empty
};

class VersionGuard {
 public:
  // `cache_root` as from ResolveCacheDir; nothing is created until CheckAndRecord.
  explicit VersionGuard(std::string cache_root, absl::Duration lock_timeout = absl::Seconds(60))
      : root_(std::move(cache_root)), lock_timeout_(lock_timeout) {}

  // The record for `name`, std::nullopt when none. DataLoss when the state file is
  // corrupt (message names it and how to reset it); PermissionDenied when unreadable.
  [[nodiscard]] absl::StatusOr<std::optional<VersionRecord>> Highest(
      std::string_view name) const;

  // Under the name's lock: FailedPrecondition when manifest.version is below the record
  // and !allow_rollback ("... version 6 is older than version 7 already verified ...;
  // pass --allow-rollback ..."); otherwise records manifest.version (and digest) when it
  // is higher. Errors writing the state (PermissionDenied, ResourceExhausted) name the
  // path; DeadlineExceeded when the lock is held past the timeout.
  [[nodiscard]] absl::Status CheckAndRecord(const Manifest& manifest,
                                            bool allow_rollback) const;

  // The same comparison without the lock and without recording, for read-only commands
  // (`cubist verify`, `list`) that must not write to the cache.
  [[nodiscard]] absl::Status Check(const Manifest& manifest, bool allow_rollback) const;

  std::string StatePath(std::string_view name) const;
  std::string LockPath(std::string_view name) const;

 private:
  absl::Status Compare(const Manifest& manifest, const std::optional<VersionRecord>& rec,
                       bool allow_rollback) const;
  std::string root_;
  absl::Duration lock_timeout_;
};

// The file-name form of a manifest name (see above). Exposed for tests and `doctor`.
std::string VersionStateFileName(std::string_view name);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_VERSION_GUARD_H_
