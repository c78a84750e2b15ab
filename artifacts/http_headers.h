// What cubist reads from an HTTP response's header lines, in one place: the fetcher's
// streaming transfers and CurlTransport's whole-body GETs both feed libcurl's header
// callback lines to a ResponseHeaders, so that Retry-After, ETag and Content-Range are
// parsed by one implementation.
#ifndef CUBIST_ARTIFACTS_HTTP_HEADERS_H_
#define CUBIST_ARTIFACTS_HTTP_HEADERS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/time/time.h"

namespace cubist {

// The delay of a "Retry-After: <seconds>" header line (any case), else nullopt (other
// headers, and the HTTP-date form, which no server we know sends to clients like us).
std::optional<absl::Duration> RetryAfterFromHeaderLine(std::string_view line);

// The entity tag of an "ETag: <tag>" header line (any case), verbatim and trimmed, else
// nullopt (other headers, an empty tag, one over 1,024 bytes or holding control
// characters: it is sent back as an If-None-Match header line).
std::optional<std::string> EtagFromHeaderLine(std::string_view line);

// The first byte of a "Content-Range: bytes <first>-<last>/<total>" header line (any
// case), else nullopt (other headers, another unit, a first byte that is no number).
std::optional<uint64_t> ContentRangeStartFromHeaderLine(std::string_view line);

// The headers of the last response of a transfer. libcurl passes the header lines of
// every response it reads (a redirect's, a 100 Continue's, then the final one's); a
// status line ("HTTP/...") starts a new response and forgets what the previous said.
struct ResponseHeaders {
  std::optional<absl::Duration> retry_after;
  std::optional<std::string> etag;
  std::optional<uint64_t> content_range_start;

  // Takes one line as libcurl's CURLOPT_HEADERFUNCTION hands it (with its CRLF).
  void AddLine(std::string_view line);
};

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_HTTP_HEADERS_H_
