#include "artifacts/curl_handles.h"

#include "artifacts/curl_library.h"

namespace cubist {

void CurlEasyDeleter::operator()(CURL* h) const {
  if (absl::StatusOr<const CurlApi*> curl = LoadCurl(); curl.ok()) (*curl)->easy_cleanup(h);
}

void CurlMultiDeleter::operator()(CURLM* h) const {
  if (absl::StatusOr<const CurlApi*> curl = LoadCurl(); curl.ok()) (*curl)->multi_cleanup(h);
}

void CurlSlistDeleter::operator()(curl_slist* l) const {
  if (absl::StatusOr<const CurlApi*> curl = LoadCurl(); curl.ok()) (*curl)->slist_free_all(l);
}

}  // namespace cubist
