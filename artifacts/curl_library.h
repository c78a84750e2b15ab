// libcurl, reached at run time.
//
// cubist has no link-time dependency on libcurl: LoadCurl() dlopens "libcurl.so.4" the
// first time a transfer is about to start. Loading and relocating libcurl and what it
// pulls in (OpenSSL's libssl, GnuTLS, nghttp2, Kerberos, LDAP, SASL, ssh2, ...: about 45
// libraries) cost each process about 6 ms before main() here, which a warm fetch, whose
// artifacts are all cached and whose manifest is a local file, never needs
// (docs/benchmarks.md, "Warm fetch of large sets").
//
// Every libcurl function cubist calls is a member of CurlApi, typed from <curl/curl.h>
// (the declarations of the version built against), and resolved by name; callers get
// the table from LoadCurl() and call through it. Types and constants still come from
// the header.
//
// Internal to the library (not installed): it exposes libcurl types.
//
// Thread safety: LoadCurl() may be called from any thread; the table is immutable once
// returned.
#ifndef CUBIST_ARTIFACTS_CURL_LIBRARY_H_
#define CUBIST_ARTIFACTS_CURL_LIBRARY_H_

#include <curl/curl.h>

#include <string>

#include "absl/status/statusor.h"
#include "base/shared_library.h"

namespace cubist {

// The library LoadCurl() opens unless CUBIST_LIBCURL names another.
inline constexpr char kDefaultLibcurl[] = "libcurl.so.4";

// The oldest libcurl whose options cubist relies on: CURLOPT_PROTOCOLS_STR and
// CURLOPT_REDIR_PROTOCOLS_STR (7.85.0) restrict the protocols a transfer and its
// redirects may use; an older library would ignore them.
inline constexpr unsigned kMinLibcurlVersion = 0x075500;  // 7.85.0

// Members are named after the function without its "curl_" prefix.
struct CurlApi {
  decltype(&curl_global_init) global_init = nullptr;
  decltype(&curl_version_info) version_info = nullptr;
  decltype(&curl_easy_init) easy_init = nullptr;
  decltype(&curl_easy_setopt) easy_setopt = nullptr;
  decltype(&curl_easy_getinfo) easy_getinfo = nullptr;
  decltype(&curl_easy_perform) easy_perform = nullptr;
  decltype(&curl_easy_reset) easy_reset = nullptr;
  decltype(&curl_easy_cleanup) easy_cleanup = nullptr;
  decltype(&curl_easy_strerror) easy_strerror = nullptr;
  decltype(&curl_slist_append) slist_append = nullptr;
  decltype(&curl_slist_free_all) slist_free_all = nullptr;
  decltype(&curl_multi_init) multi_init = nullptr;
  decltype(&curl_multi_setopt) multi_setopt = nullptr;
  decltype(&curl_multi_add_handle) multi_add_handle = nullptr;
  decltype(&curl_multi_remove_handle) multi_remove_handle = nullptr;
  decltype(&curl_multi_perform) multi_perform = nullptr;
  decltype(&curl_multi_poll) multi_poll = nullptr;
  decltype(&curl_multi_info_read) multi_info_read = nullptr;
  decltype(&curl_multi_cleanup) multi_cleanup = nullptr;
};

// A libcurl opened from an explicit name or path, with its table. Move-only; closes the
// library when destroyed (the process-wide table of LoadCurl() never is).
class CurlLibrary {
 public:
  // Opens `library` and resolves every CurlApi member, and checks its version against
  // kMinLibcurlVersion. Does not call curl_global_init. Errors (FailedPrecondition, each
  // naming the library and the fix: install libcurl4 (apt-get) or libcurl (dnf), or set
  // CUBIST_LIBCURL): the library cannot be loaded ("dlopen libcurl.so.4: <dlerror>"),
  // lacks one of the functions (naming it), or is older than 7.85.0.
  [[nodiscard]] static absl::StatusOr<CurlLibrary> Open(const std::string& library);

  const CurlApi& api() const { return api_; }

 private:
  CurlLibrary(SharedLibrary library, const CurlApi& api)
      : library_(std::move(library)), api_(api) {}

  SharedLibrary library_;
  CurlApi api_;
};

// libcurl for this process: CurlLibrary::Open of $CUBIST_LIBCURL when set and not
// empty, else of kDefaultLibcurl, then curl_global_init, all once (later calls return
// the same table or the same error). Errors: CurlLibrary::Open's, and
// FailedPrecondition when curl_global_init fails.
[[nodiscard]] absl::StatusOr<const CurlApi*> LoadCurl();

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_CURL_LIBRARY_H_
