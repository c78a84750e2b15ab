#include "artifacts/curl_transport.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "artifacts/curl_handles.h"
#include "artifacts/http_headers.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {
namespace {

struct Sink {
  TransportResponse* response;
  uint64_t max_bytes;
};

size_t OnBody(char* p, size_t size, size_t n, void* user) {
  auto* sink = static_cast<Sink*>(user);
  size_t len = size * n;
  if (sink->response->body.size() + len > sink->max_bytes) {
    sink->response->too_large = true;
    return 0;
  }
  sink->response->body.append(p, len);
  return len;
}

// Header lines go to a ResponseHeaders (http_headers.h), the one parser of them.
size_t OnHeader(char* p, size_t size, size_t n, void* user) {
  static_cast<ResponseHeaders*>(user)->AddLine(std::string_view(p, size * n));
  return size * n;
}

}  // namespace

TransportResult TransportResultOf(CURLcode rc) {
  switch (rc) {
    case CURLE_OK:
      return TransportResult::kOk;
    case CURLE_FILE_COULDNT_READ_FILE:
      return TransportResult::kFileMissing;
    case CURLE_RANGE_ERROR:
    case CURLE_BAD_DOWNLOAD_RESUME:
      return TransportResult::kRangeError;
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_WEIRD_SERVER_REPLY:
      return TransportResult::kTransient;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
      return TransportResult::kUntrusted;
    default:
      return TransportResult::kFatal;
  }
}

TransportResponse CurlTransport::Get(const TransportRequest& request) {
  TransportResponse response;
  CurlEasy easy(curl_.easy_init());
  CURL* e = easy.get();
  CurlOptions options;
  options.total_timeout = request.timeout;
  options.low_speed_bytes = request.low_speed_bytes;
  options.low_speed_time = request.low_speed_time;
  options.ca = CaSettings::FromEnvironment();
  ApplyCurlOptions(curl_, e, options);
  Sink sink{&response, request.max_bytes};
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_.easy_setopt(e, CURLOPT_URL, request.url.c_str());
  curl_.easy_setopt(e, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_.easy_setopt(e, CURLOPT_WRITEDATA, &sink);
  curl_.easy_setopt(e, CURLOPT_HEADERFUNCTION, &OnHeader);
  ResponseHeaders headers;
  curl_.easy_setopt(e, CURLOPT_HEADERDATA, &headers);
  curl_.easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  CurlSlist request_headers;
  if (!request.if_none_match.empty()) {
    const std::string header = absl::StrCat("If-None-Match: ", request.if_none_match);
    request_headers.reset(curl_.slist_append(nullptr, header.c_str()));
    curl_.easy_setopt(e, CURLOPT_HTTPHEADER, request_headers.get());
  }
  CURLcode rc = curl_.easy_perform(e);
  response.retry_after = headers.retry_after;
  response.etag = headers.etag.value_or("");
  curl_.easy_getinfo(e, CURLINFO_RESPONSE_CODE, &response.facts.http_status);
  response.facts.is_file = absl::StartsWithIgnoreCase(Sv(request.url), "file://");
  response.facts.result = TransportResultOf(rc);
  if (rc != CURLE_OK) response.error = errbuf[0] != '\0' ? errbuf : curl_.easy_strerror(rc);
  return response;
}

absl::StatusOr<Transport*> DefaultTransport() {
  CUBIST_ASSIGN_OR_RETURN(const CurlApi* curl, LoadCurl());
  static CurlTransport* const transport = new CurlTransport(*curl);
  return transport;
}

}  // namespace cubist
