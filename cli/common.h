// Pieces shared by the subcommands that read a manifest and the cache: the runtime's
// options from the flags and human-readable sizes (opening the cache and the manifest
// is report/open_request.h's). Header-only so that each subcommand stays one file.
#ifndef CUBIST_CLI_COMMON_H_
#define CUBIST_CLI_COMMON_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "dispatch/runtime.h"
#include "report/open_request.h"
#include "report/trust_spec.h"

namespace cubist::cli {

// Runtime options shared by the commands that run kernels (run, tune): the manifest, the
// cache, the device, offline, and the trust policy from the flags. Nothing is prefetched:
// only the kernels a problem needs are fetched.
inline absl::StatusOr<RuntimeOptions> RuntimeOptionsForCommand(const std::string& manifest,
                                                               const std::string& cache,
                                                               int device, bool offline,
                                                               const report::TrustSpec& trust) {
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
