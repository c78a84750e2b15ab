// Transport: moves the bytes of one GET, and says how it went in the fetch policy's
// terms (fetch_policy.h) so that what to do next is decided in one place. The curl
// implementation (curl_transport.h) serves manifests and signatures; the fetcher's
// parallel transfers use the same option builder and classification on libcurl's multi
// interface. Tests hand in a fake and run every retry case without a server.
#ifndef CUBIST_ARTIFACTS_TRANSPORT_H_
#define CUBIST_ARTIFACTS_TRANSPORT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "artifacts/fetch_policy.h"

namespace cubist {

struct TransportRequest {
  std::string url;
  uint64_t max_bytes = 0;  // a longer body stops there: TransportResponse::too_large
  absl::Duration timeout = absl::Minutes(1);  // the whole transfer
  // Sent as If-None-Match when not empty: a server whose copy still has this ETag
  // answers 304 with no body (TransportResponse::facts.http_status).
  std::string if_none_match;
  // A transfer slower than low_speed_bytes per second for low_speed_time is a stall: it
  // ends as a timeout (kTransient), as the fetcher's do (0 bytes: no such check).
  int64_t low_speed_bytes = 0;
  absl::Duration low_speed_time = absl::Seconds(20);
};

struct TransportResponse {
  TransferFacts facts;       // how the transfer ended, and the HTTP status
  std::string body;          // of a 2xx (or file) answer
  bool too_large = false;    // the body passed max_bytes
  std::string error;         // the transport's words when facts.result is not kOk
  std::optional<absl::Duration> retry_after;  // the server's Retry-After, if any
  std::string etag;          // the final response's ETag, verbatim; empty when none
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Thread-safe in every implementation: one Transport serves concurrent callers.
  virtual TransportResponse Get(const TransportRequest& request) = 0;
};

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_TRANSPORT_H_
