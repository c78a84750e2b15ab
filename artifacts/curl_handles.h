// Move-only owners for libcurl handles, and libcurl's one-time global initialisation.
#ifndef CUBIST_ARTIFACTS_CURL_HANDLES_H_
#define CUBIST_ARTIFACTS_CURL_HANDLES_H_

#include <curl/curl.h>

#include <memory>

namespace cubist {

struct CurlEasyDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};
struct CurlMultiDeleter {
  void operator()(CURLM* h) const { curl_multi_cleanup(h); }
};
struct CurlSlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using CurlEasy = std::unique_ptr<CURL, CurlEasyDeleter>;
using CurlMulti = std::unique_ptr<CURLM, CurlMultiDeleter>;
using CurlSlist = std::unique_ptr<curl_slist, CurlSlistDeleter>;

// curl_global_init, exactly once per process, before any other libcurl call. It is
// not thread-safe in libcurl versions we support, hence call_once.
void EnsureCurlInitialized();

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_CURL_HANDLES_H_
