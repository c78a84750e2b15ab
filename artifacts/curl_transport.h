// The libcurl Transport, and the mapping of libcurl's result codes to the fetch
// policy's TransportResult that the fetcher's multi loop shares with it.
//
// Internal to the library (not installed): it exposes libcurl types.
#ifndef CUBIST_ARTIFACTS_CURL_TRANSPORT_H_
#define CUBIST_ARTIFACTS_CURL_TRANSPORT_H_

#include <curl/curl.h>

#include "absl/status/statusor.h"
#include "artifacts/curl_library.h"
#include "artifacts/curl_options.h"
#include "artifacts/fetch_policy.h"
#include "artifacts/transport.h"

namespace cubist {

// CURLE_OK -> kOk; a missing file:// source -> kFileMissing; range and resume errors
// -> kRangeError; connect, resolve, timeout, reset, short-body, HTTP/2 and TLS
// handshake errors -> kTransient; anything else -> kFatal.
TransportResult TransportResultOf(CURLcode rc);

// One easy handle per call, configured by ApplyCurlOptions (curl_options.h), with the
// CA variables read at each call (a manifest read is one request; the environment may
// have changed since the last). Protocols http, https and file.
class CurlTransport final : public Transport {
 public:
  explicit CurlTransport(const CurlApi& curl) : curl_(curl) {}
  TransportResponse Get(const TransportRequest& request) override;

 private:
  const CurlApi& curl_;
};

// A process-wide CurlTransport over LoadCurl()'s libcurl, created on first use (the
// first read of a URL loads libcurl). Errors: LoadCurl()'s.
[[nodiscard]] absl::StatusOr<Transport*> DefaultTransport();

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_CURL_TRANSPORT_H_
