// Pieces shared by the subcommands that read a manifest and the cache: the store from
// --cache, the manifest through artifacts/manifest_source.h with the trust flags, and
// human-readable sizes. Header-only so that each subcommand stays one file.
#ifndef CUBIST_CLI_COMMON_H_
#define CUBIST_CLI_COMMON_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "artifacts/cache_dir.h"
#include "artifacts/manifest_source.h"
#include "artifacts/store.h"
#include "base/status_macros.h"
#include "cli/trust_flags.h"
#include "dispatch/runtime.h"

namespace cubist::cli {

// Opens the cache named by --cache (or the environment). `create` false for read-only
// commands, which then report a missing cache as NotFound.
inline absl::StatusOr<Store> OpenStore(const std::string& cache_flag, bool create) {
  CUBIST_ASSIGN_OR_RETURN(std::string root, ResolveCacheDir(cache_flag));
  return Store::Open(root, create);
}

// `pack_artifacts`: OpenManifestOptions::pack_artifacts (fetch, whose warm path may need
// no Artifact built); `stall`: OpenManifestOptions::stall (fetch --stall-seconds).
inline absl::StatusOr<OpenedManifest> OpenManifestForCommand(
    const std::string& location, const TrustFlags& trust, const Store* store, bool offline,
    bool record_version, bool pack_artifacts = false, absl::Duration stall = kDefaultStall) {
  OpenManifestOptions options;
  options.stall = stall;
  CUBIST_ASSIGN_OR_RETURN(options.trust, trust.Policy());
  options.offline = offline;
  options.store = store;
  options.record_version = record_version;
  options.pack_artifacts = pack_artifacts;
  return OpenManifest(location, options);
}

// Runtime options shared by the commands that run kernels (run, tune): the manifest, the
// cache, the device, offline, and the trust policy from the flags. Nothing is prefetched:
// only the kernels a problem needs are fetched.
inline absl::StatusOr<RuntimeOptions> RuntimeOptionsForCommand(const std::string& manifest,
                                                               const std::string& cache,
                                                               int device, bool offline,
                                                               const TrustFlags& trust) {
  RuntimeOptions ro;
  ro.manifest = manifest;
  ro.cache_dir = cache;
  ro.device = device;
  ro.offline = offline;
  ro.prefetch = false;
  CUBIST_ASSIGN_OR_RETURN(ro.trust, trust.Policy());
  return ro;
}

inline std::string HumanBytes(uint64_t n) {
  if (n < 1000) return absl::StrFormat("%d B", n);
  if (n < 1000 * 1000) return absl::StrFormat("%.1f kB", n / 1e3);
  if (n < uint64_t{1000} * 1000 * 1000) return absl::StrFormat("%.1f MB", n / 1e6);
  return absl::StrFormat("%.2f GB", n / 1e9);
}

}  // namespace cubist::cli

#endif  // CUBIST_CLI_COMMON_H_
