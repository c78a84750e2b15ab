// Docker credential helpers: `docker-credential-NAME get` with the registry host on
// stdin answers {"ServerURL": ..., "Username": ..., "Secret": ...} on stdout. A docker
// config names them in "credHelpers" (per registry) or "credsStore" (for all); secrets
// then live in a keychain, pass, a cloud's token service, not in config.json.
//
// The secret is never part of a message: errors name the helper, the registry and the
// fix, and quote the helper's own output only when it exited with an error.
#ifndef CUBIST_ARTIFACTS_CREDENTIAL_HELPER_H_
#define CUBIST_ARTIFACTS_CREDENTIAL_HELPER_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace cubist {

struct HelperCredentials {
  std::string username;
  std::string secret;
};

// Runs `docker-credential-<helper> get` (found on PATH) with `server` on stdin.
// nullopt when the helper has no credentials for `server` (its "credentials not
// found" answer: anonymous access, as docker does). FailedPrecondition when the helper
// is not installed, fails, hangs past `timeout` (killed) or answers something that is
// not its JSON; InvalidArgument for a helper name that is not a plain word.
[[nodiscard]] absl::StatusOr<std::optional<HelperCredentials>> RunCredentialHelper(
    std::string_view helper, std::string_view server,
    absl::Duration timeout = absl::Seconds(30));

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_CREDENTIAL_HELPER_H_
