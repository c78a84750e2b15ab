// Garbage collection of the store: objects that no kept manifest or root in use
// references, partial downloads and bundle staging directories whose writer is gone,
// roots whose process is gone, and lock files nobody holds (keep.h has the scheme).
//
// Kept manifests are the copies under manifests/ that `fetch` and `bundle import` write
// (one per name and digest: every version and pin fetched), minus those `drop` names,
// plus any the caller passes; roots in use are the pending roots a live process holds
// (a fetch or import in flight, a Runtime). If one of them cannot be parsed, nothing is
// deleted: a collector that guesses deletes what a user needed. An object or partial
// file whose lock another process holds right now is skipped. Cached parses
// (parsed_manifest_cache.h) of manifests that are not kept are removed.
//
// gc holds gc.lock exclusively while it runs, so no root is added meanwhile; it refuses
// (FailedPrecondition) a cache whose layout file names a layout newer than kCacheLayout.
#ifndef CUBIST_ARTIFACTS_GC_H_
#define CUBIST_ARTIFACTS_GC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "artifacts/store.h"
#include "manifest/manifest.h"

namespace cubist {

struct GcOptions {
  bool dry_run = false;
  std::vector<Manifest> extra_keep;  // e.g. --keep MANIFEST
  // Kept manifests to forget (--drop): "NAME" (every kept version of it), "NAME@VERSION"
  // or "NAME@DIGEST-PREFIX" (8 or more hex digits). One that matches no kept manifest
  // is NotFound, and nothing is deleted.
  std::vector<std::string> drop;
  absl::Duration lock_timeout = absl::Minutes(10);  // for gc.lock
};

struct GcReport {
  int kept_manifests = 0;
  std::vector<std::string> dropped;  // "name vN (file)" of each kept manifest dropped
  int roots_in_use = 0;      // pending roots a live process holds (their objects kept)
  int roots_removed = 0;     // pending roots of processes that are gone
  int objects_kept = 0;
  int objects_removed = 0;
  uint64_t bytes_freed = 0;
  int temps_removed = 0;  // partial downloads and abandoned bundle staging directories
  int locks_removed = 0;
  int parsed_removed = 0;  // cached parses of manifests no longer kept (dry run: would be)
  int busy_skipped = 0;
};

[[nodiscard]] absl::StatusOr<GcReport> CollectGarbage(const Store& store,
                                                      const GcOptions& options);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_GC_H_
