// The trust flags shared by every subcommand that reads a manifest (fetch, verify,
// list, sign --check): trusted keys, and the deliberate overrides of expiry and
// rollback, into a report::TrustSpec (report/trust_spec.h). Header-only so that each
// subcommand file stays one file:
//   report::TrustSpec trust;                // lives as long as the CLI::App
//   AddTrustFlags(sub, &trust);
//   ... in the callback:
//   absl::StatusOr<TrustPolicy> policy = trust.Policy();
#ifndef CUBIST_CLI_TRUST_FLAGS_H_
#define CUBIST_CLI_TRUST_FLAGS_H_

#include <CLI/CLI.hpp>

#include "report/trust_spec.h"

namespace cubist::cli {

// `overrides` false leaves out --allow-expired/--allow-rollback (for `sign --check`).
inline void AddTrustFlags(CLI::App* cmd, report::TrustSpec* flags,
                          bool overrides = true) {
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
