// Garbage collection of the store: objects that no kept manifest references, partial
// downloads whose writer is gone, and lock files nobody holds.
//
// Kept manifests are the copies under manifests/<name>.json that `fetch` writes (the
// newest fetched per name), plus any the caller passes. If one of them cannot be
// parsed, nothing is deleted: a collector that guesses deletes what a user needed.
// An object or partial file whose lock another process holds right now is skipped.
// Cached parses (parsed_manifest_cache.h) of manifests that are not kept are removed.
#ifndef CUBIST_ARTIFACTS_GC_H_
#define CUBIST_ARTIFACTS_GC_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "artifacts/store.h"
#include "manifest/manifest.h"

namespace cubist {

struct GcOptions {
  bool dry_run = false;
  std::vector<Manifest> extra_keep;  // e.g. --keep MANIFEST
};

struct GcReport {
  int kept_manifests = 0;
  int objects_kept = 0;
  int objects_removed = 0;
  uint64_t bytes_freed = 0;
  int temps_removed = 0;
  int locks_removed = 0;
  int parsed_removed = 0;  // cached parses of manifests no longer kept (dry run: would be)
  int busy_skipped = 0;
};

[[nodiscard]] absl::StatusOr<GcReport> CollectGarbage(const Store& store,
                                                      const GcOptions& options);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_GC_H_
