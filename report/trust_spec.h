// The trust part of a request that reads a manifest, as its front end (a command's
// flags, the Python package's keyword arguments) collected it: trusted keys, and the
// deliberate overrides of expiry and rollback.
#ifndef CUBIST_REPORT_TRUST_SPEC_H_
#define CUBIST_REPORT_TRUST_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "manifest/trust.h"

namespace cubist::report {

struct TrustSpec {
  std::vector<std::string> keys;       // 'ed25519:<base64>' or a file of keys
  std::vector<std::string> key_files;  // files of keys
  bool allow_expired = false;
  bool allow_rollback = false;

  // Loads the keys named here and in CUBIST_TRUSTED_KEYS (manifest/trust.h).
  [[nodiscard]] absl::StatusOr<TrustPolicy> Policy() const;
};

}  // namespace cubist::report

#endif  // CUBIST_REPORT_TRUST_SPEC_H_
