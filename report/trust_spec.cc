#include "report/trust_spec.h"

#include <utility>

namespace cubist::report {

absl::StatusOr<TrustPolicy> TrustSpec::Policy() const {
  TrustSources sources;
  sources.keys = keys;
  sources.key_files = key_files;
  absl::StatusOr<std::vector<PublicKey>> loaded = LoadTrustedKeys(sources);
  if (!loaded.ok()) return loaded.status();
  TrustPolicy policy;
  policy.trusted_keys = *std::move(loaded);
  policy.allow_expired = allow_expired;
  policy.allow_rollback = allow_rollback;
  return policy;
}

}  // namespace cubist::report
