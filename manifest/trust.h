// Which manifests the user trusts: the public keys a manifest's detached signature must
// verify under, and the policy checks made on a manifest before and after parsing
// (signature before, expiry after; rollback lives with the cache, in
// artifacts/version_guard.h).
//
// Trusted keys come from three places, all used together (their union), so that during
// a key rotation the old and the new key can both be trusted:
//   --trusted-key VALUE     (repeatable) a key string or the path of a key file
//   --trusted-keys-file F   (repeatable) a key file
//   CUBIST_TRUSTED_KEYS     VALUEs separated by commas, semicolons or whitespace
// VALUE is "ed25519:<base64>" (see manifest/signature.h) or a path to a key file. A key
// file holds one key per line ("ed25519:<base64>", '#' starts a comment) and/or PEM
// PUBLIC KEY blocks. With no key from any source, signatures are not checked.
//
// Thread safety: everything here is a value or a pure function.
#ifndef CUBIST_MANIFEST_TRUST_H_
#define CUBIST_MANIFEST_TRUST_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "manifest/manifest.h"
#include "manifest/signature.h"

namespace cubist {

inline constexpr char kTrustedKeysEnv[] = "CUBIST_TRUSTED_KEYS";
// A key file larger than this is refused (it is not a key file).
inline constexpr size_t kMaxKeyFileSize = 1 << 20;

// Where to look for trusted keys. The CLI fills it from its flags.
struct TrustSources {
  std::vector<std::string> keys;       // --trusted-key: key strings or key file paths
  std::vector<std::string> key_files;  // --trusted-keys-file
  // The value of CUBIST_TRUSTED_KEYS; std::nullopt reads the environment.
  std::optional<std::string> env;
};

// Loads and de-duplicates the keys of every source. Errors name the source:
// InvalidArgument for a malformed key ("CUBIST_TRUSTED_KEYS entry 2: ..."), NotFound or
// PermissionDenied for an unreadable key file.
[[nodiscard]] absl::StatusOr<std::vector<PublicKey>> LoadTrustedKeys(
    const TrustSources& sources);

// Parses the text of a key file (format above). `source` names it in messages
// ("keys.txt:3: ..."). An empty file (no keys) is InvalidArgument: a trust file that
// trusts nobody is a mistake, not a policy.
[[nodiscard]] absl::StatusOr<std::vector<PublicKey>> ParseKeyFile(
    std::string_view text, std::string_view source);

// What a manifest must satisfy before cubist uses it.
struct TrustPolicy {
  // Empty: signatures are neither required nor checked.
  std::vector<PublicKey> trusted_keys;
  bool allow_expired = false;   // --allow-expired
  bool allow_rollback = false;  // --allow-rollback (checked by version_guard.h)
};

// Where the detached signature of a manifest at `manifest_location` (URL or path) lives.
std::string SignatureLocation(std::string_view manifest_location);

// The check made on a manifest's exact bytes BEFORE they are parsed. With no trusted
// keys: OK. Otherwise `signature_file` (the bytes of MANIFEST.sig, std::nullopt when it
// does not exist) must verify (VerifyDetachedSignature); a missing signature is
// PermissionDenied "<source>: unsigned manifest: ... ". `source` names the manifest.
[[nodiscard]] absl::Status CheckManifestSignature(
    std::string_view manifest_bytes, const std::optional<std::string>& signature_file,
    const TrustPolicy& policy, std::string_view source);

// The expiry check made AFTER parsing: a manifest whose `expires` is at or before `now`
// is FailedPrecondition "...expired at <time>...; pass --allow-expired ..." unless
// policy.allow_expired. A manifest without `expires` never expires.
[[nodiscard]] absl::Status CheckManifestExpiry(const Manifest& manifest,
                                               const TrustPolicy& policy, absl::Time now);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_TRUST_H_
