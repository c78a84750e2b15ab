// The one place that configures a libcurl handle for cubist: allowed protocols, the
// CA variables, redirects, timeouts and the user agent. Artifacts (fetcher), manifests
// (manifest_source) and registries (oci_client) all go through ApplyCurlOptions, so a
// variable the README promises (CURL_CA_BUNDLE, SSL_CERT_FILE, SSL_CERT_DIR) works for
// every request or for none. Proxies need nothing here: libcurl reads https_proxy,
// no_proxy and friends itself for every handle.
//
// Internal to the library (not installed): it exposes libcurl types.
#ifndef CUBIST_ARTIFACTS_CURL_OPTIONS_H_
#define CUBIST_ARTIFACTS_CURL_OPTIONS_H_

#include <curl/curl.h>

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "artifacts/curl_library.h"

namespace cubist {

// CA settings from the environment, read once (getenv is not safe against a
// concurrent setenv, so worker threads get a copy instead of reading it again).
struct CaSettings {
  std::string bundle;     // CURL_CA_BUNDLE, else SSL_CERT_FILE; "" = libcurl's default
  std::string directory;  // SSL_CERT_DIR; "" = libcurl's default
  static CaSettings FromEnvironment();
};

struct CurlOptions {
  // "http,https" for registries; sources of artifacts and manifests add "file".
  const char* protocols = "http,https,file";
  bool follow_redirects = true;  // to http and https only, whatever `protocols` says
  int max_redirects = 5;
  absl::Duration connect_timeout = absl::Seconds(10);
  absl::Duration total_timeout = absl::InfiniteDuration();  // whole transfer
  // A transfer slower than low_speed_bytes per second for low_speed_time is a stall
  // (0 bytes: no such check).
  int64_t low_speed_bytes = 0;
  absl::Duration low_speed_time = absl::Seconds(20);
  CaSettings ca;
};

// Sets the options above, NOSIGNAL and the user agent ("cubist/<version>") on `easy`,
// through `curl` (the table `easy` came from). Callers set the URL, callbacks and
// method-specific options after it.
void ApplyCurlOptions(const CurlApi& curl, CURL* easy, const CurlOptions& options);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_CURL_OPTIONS_H_
