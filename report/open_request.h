// Opening what a request names: the cache (--cache or the environment) and the manifest
// (through artifacts/manifest_source.h, with the request's trust). Shared by the reports
// and the commands that work on the cache directly.
#ifndef CUBIST_REPORT_OPEN_REQUEST_H_
#define CUBIST_REPORT_OPEN_REQUEST_H_

#include <string>

#include "absl/status/statusor.h"
#include "artifacts/manifest_source.h"
#include "artifacts/store.h"
#include "report/trust_spec.h"

namespace cubist::report {

// Opens the cache named by `cache` (empty: the environment's, artifacts/cache_dir.h).
// `create` false for read-only work, which then reports a missing cache as NotFound.
[[nodiscard]] absl::StatusOr<Store> OpenStore(const std::string& cache, bool create);

// `pack_artifacts`: OpenManifestOptions::pack_artifacts (fetch, whose warm path may need
// no Artifact built); `stall`: OpenManifestOptions::stall (fetch --stall-seconds).
[[nodiscard]] absl::StatusOr<OpenedManifest> OpenManifestForRequest(
    const std::string& location, const TrustSpec& trust, const Store* store, bool offline,
    bool record_version, bool pack_artifacts = false, absl::Duration stall = kDefaultStall);

}  // namespace cubist::report

#endif  // CUBIST_REPORT_OPEN_REQUEST_H_
