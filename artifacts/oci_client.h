// Talking to an OCI registry (distribution spec v1.1): one HTTP request at a time on a
// kept-alive connection, with the registry's authentication answered on the way.
//
// Authentication, in the order registries use it:
//   anonymous   - no header until the registry asks;
//   basic       - a 401 with `WWW-Authenticate: Basic realm=...` is answered with the
//                 credentials below;
//   bearer      - a 401 with `WWW-Authenticate: Bearer realm=R,service=S,scope=X` sends
//                 GET R?service=S&scope=X (with basic credentials when there are any,
//                 anonymously otherwise) and uses the token it returns.
// Credentials for HOST come from CUBIST_REGISTRY_USERNAME and CUBIST_REGISTRY_PASSWORD,
// else from a docker-style config file: $REGISTRY_AUTH_FILE, else
// $DOCKER_CONFIG/config.json, else ~/.docker/config.json: the credential helper that
// "credHelpers": {HOST: NAME} or "credsStore": NAME names (docker-credential-NAME,
// credential_helper.h), else "auths": {HOST: {"auth": base64(user:password)}}. Secrets
// never appear in a message, a log or a URL.
//
// A failed login is PermissionDenied (exit 7) naming the registry, the user and where
// the credentials came from; the fix is in the message.
#ifndef CUBIST_ARTIFACTS_OCI_CLIENT_H_
#define CUBIST_ARTIFACTS_OCI_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "artifacts/curl_handles.h"
#include "artifacts/curl_library.h"
#include "artifacts/oci_reference.h"

namespace cubist {

struct RegistryCredentials {
  std::string username;
  std::string password;
  std::string origin;  // where they came from, for messages: "CUBIST_REGISTRY_USERNAME"
  bool empty() const { return username.empty() && password.empty(); }
};

// The credentials for `host` from the environment or a config file (empty when none).
// InvalidArgument when a config file exists but cannot be read as JSON;
// FailedPrecondition when the credential helper it names is missing or fails.
[[nodiscard]] absl::StatusOr<RegistryCredentials> LookUpRegistryCredentials(
    std::string_view host);

// One parsed WWW-Authenticate challenge: scheme ("basic", "bearer"; lowercase) and its
// parameters (realm, service, scope, ...).
struct AuthChallenge {
  std::string scheme;
  std::map<std::string, std::string> params;
};
[[nodiscard]] absl::StatusOr<AuthChallenge> ParseAuthChallenge(std::string_view header);

// The Authorization header for one repository, shared by the clients (threads) that
// work on it. Thread-safe.
class RegistryAuth {
 public:
  // `scope` is what bearer tokens are asked for: "repository:REPO:pull" (fetch) or
  // "repository:REPO:pull,push" (push).
  RegistryAuth(OciReference ref, RegistryCredentials credentials, std::string scope);

  // "Authorization: ..." for a request to `url`, or "" (anonymous so far, or a URL on
  // another host: credentials never go to mirrors or redirect targets).
  std::string HeaderFor(std::string_view url) const;

  // Answers a 401 whose request carried `sent_header`. When another thread has already
  // renewed the header since, returns OK at once. PermissionDenied when the registry
  // refuses what we have and there is nothing better to try.
  [[nodiscard]] absl::Status Answer(std::string_view www_authenticate,
                                    const std::string& sent_header);

  const OciReference& ref() const { return ref_; }

 private:
  absl::StatusOr<std::string> FetchToken(const AuthChallenge& challenge);
  std::string RefusedMessage(std::string_view what) const;

  const OciReference ref_;
  const RegistryCredentials credentials_;
  const std::string scope_;
  const std::string origin_;  // "http(s)://HOST/"
  mutable absl::Mutex mu_;
  std::string header_ ABSL_GUARDED_BY(mu_);
  int answers_ ABSL_GUARDED_BY(mu_) = 0;
};

struct HttpResponse {
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // lowercase names, last value wins
  std::string Header(std::string_view name) const;
};

// A request body: bytes in memory, or a range of an open file (uploads stream from
// disk; a 1 GB cubin is never held in memory).
struct HttpBody {
  std::string_view data;
  int fd = -1;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool from_file() const { return fd >= 0; }
  uint64_t size() const { return from_file() ? length : data.size(); }
};

// One connection to a registry. Not thread-safe: one per thread, sharing a
// RegistryAuth.
class RegistryClient {
 public:
  explicit RegistryClient(std::shared_ptr<RegistryAuth> auth,
                          absl::Duration timeout = absl::Minutes(10));

  // Sends METHOD url (absolute, or relative to the repository: "blobs/sha256:..."),
  // answering authentication challenges (at most twice) and retrying connection
  // failures and 5xx/429 up to `attempts` times with backoff. Any HTTP status comes
  // back as a response; only transport failures are errors (Unavailable).
  // `max_body` caps the response body kept (InvalidArgument beyond).
  [[nodiscard]] absl::StatusOr<HttpResponse> Send(
      std::string_view method, std::string_view url,
      const std::vector<std::string>& headers = {}, HttpBody body = {},
      uint64_t max_body = uint64_t{8} << 20, int attempts = 4);

  // GET /v2/: learns the authentication the registry wants before real work, so that
  // uploads are not sent twice. OK when the registry answers 200.
  [[nodiscard]] absl::Status Ping();

  std::string Url(std::string_view relative) const;
  RegistryAuth& auth() { return *auth_; }

 private:
  absl::StatusOr<HttpResponse> SendOnce(std::string_view method, const std::string& url,
                                        const std::vector<std::string>& headers,
                                        const HttpBody& body, uint64_t max_body,
                                        std::string* sent_auth);
  std::shared_ptr<RegistryAuth> auth_;
  absl::Duration timeout_;
  const CurlApi* curl_ = nullptr;  // loaded by the first request
  CurlEasy easy_;
};

// "<registry> answered HTTP <code> to <what>: <the registry's error code and message>"
// for a response that was not what the caller expected; the code follows the HTTP
// status (404 NotFound, 401/403 PermissionDenied, 5xx/429 Unavailable, else
// FailedPrecondition).
absl::Status RegistryError(const HttpResponse& response, std::string_view what);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_OCI_CLIENT_H_
