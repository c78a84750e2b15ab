// Move-only owners for libcurl handles.
//
// Internal to the library (not installed): it exposes libcurl types.
#ifndef CUBIST_ARTIFACTS_CURL_HANDLES_H_
#define CUBIST_ARTIFACTS_CURL_HANDLES_H_

#include <curl/curl.h>

#include <memory>

namespace cubist {

// The deleters call through the process's libcurl (LoadCurl, curl_library.h): a handle
// can only have come from that table, so it is loaded whenever there is one to free.
struct CurlEasyDeleter {
  void operator()(CURL* h) const;
};
struct CurlMultiDeleter {
  void operator()(CURLM* h) const;
};
struct CurlSlistDeleter {
  void operator()(curl_slist* l) const;
};
using CurlEasy = std::unique_ptr<CURL, CurlEasyDeleter>;
using CurlMulti = std::unique_ptr<CURLM, CurlMultiDeleter>;
using CurlSlist = std::unique_ptr<curl_slist, CurlSlistDeleter>;

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_CURL_HANDLES_H_
