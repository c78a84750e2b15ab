// The trust flags shared by every subcommand that reads a manifest (fetch, verify,
// list, sign --check): trusted keys, and the deliberate overrides of expiry and
// rollback. Header-only so that each subcommand file stays one file:
//   TrustFlags trust;                       // lives as long as the CLI::App
//   AddTrustFlags(sub, &trust);
//   ... in the callback:
//   absl::StatusOr<TrustPolicy> policy = trust.Policy();
#ifndef CUBIST_CLI_TRUST_FLAGS_H_
#define CUBIST_CLI_TRUST_FLAGS_H_

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "manifest/trust.h"

namespace cubist::cli {

struct TrustFlags {
  std::vector<std::string> keys;
  std::vector<std::string> key_files;
  bool allow_expired = false;
  bool allow_rollback = false;

  // Loads the keys of the flags and of CUBIST_TRUSTED_KEYS (manifest/trust.h).
  [[nodiscard]] absl::StatusOr<TrustPolicy> Policy() const {
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
};

// `overrides` false leaves out --allow-expired/--allow-rollback (for `sign --check`).
inline void AddTrustFlags(CLI::App* cmd, TrustFlags* flags, bool overrides = true) {
  cmd->add_option("--trusted-key", flags->keys,
                  "Trust this public key ('ed25519:<base64>') or the keys in this file; "
                  "repeatable. Also read from CUBIST_TRUSTED_KEYS. With any trusted key, "
                  "unsigned or badly signed manifests are refused")
      ->type_name("KEY|FILE");
  cmd->add_option("--trusted-keys-file", flags->key_files,
                  "Trust the keys in this file (one 'ed25519:<base64>' per line or PEM "
                  "public keys); repeatable")
      ->type_name("FILE");
  if (!overrides) return;
  cmd->add_flag("--allow-expired", flags->allow_expired,
                "Use a manifest whose 'expires' time has passed");
  cmd->add_flag("--allow-rollback", flags->allow_rollback,
                "Use a manifest older than the newest version this cache has verified");
}

}  // namespace cubist::cli

#endif  // CUBIST_CLI_TRUST_FLAGS_H_
