#include "report/open_request.h"

#include "artifacts/cache_dir.h"
#include "base/status_macros.h"

namespace cubist::report {

absl::StatusOr<Store> OpenStore(const std::string& cache, bool create) {
  CUBIST_ASSIGN_OR_RETURN(std::string root, ResolveCacheDir(cache));
  return Store::Open(root, create);
}

absl::StatusOr<OpenedManifest> OpenManifestForRequest(const std::string& location,
                                                      const TrustSpec& trust,
                                                      const Store* store, bool offline,
                                                      bool record_version,
                                                      bool pack_artifacts,
                                                      absl::Duration stall) {
  OpenManifestOptions options;
  options.stall = stall;
  CUBIST_ASSIGN_OR_RETURN(options.trust, trust.Policy());
  options.offline = offline;
  options.store = store;
  options.record_version = record_version;
  options.pack_artifacts = pack_artifacts;
  return OpenManifest(location, options);
}

}  // namespace cubist::report
