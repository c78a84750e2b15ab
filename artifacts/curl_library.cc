#include "artifacts/curl_library.h"

#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace cubist {
namespace {

constexpr char kHowToFix[] =
    "install libcurl 7.85 or newer (Debian, Ubuntu: apt-get install libcurl4; RHEL, Fedora: "
    "dnf install libcurl) or set CUBIST_LIBCURL to the path of a libcurl.so.4";

// Resolves `name` into `*fn`; FailedPrecondition naming it when the library lacks it.
template <typename Fn>
absl::Status Resolve(const SharedLibrary& lib, const std::string& library, const char* name,
                     Fn* fn) {
  *fn = reinterpret_cast<Fn>(lib.Symbol(name));
  if (*fn == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot use ", library, " as libcurl: it has no ", name, "; ", kHowToFix));
  }
  return absl::OkStatus();
}

std::string LibraryToLoad() {
  const char* env = std::getenv("CUBIST_LIBCURL");
  return env != nullptr && *env != '\0' ? env : kDefaultLibcurl;
}

}  // namespace

absl::StatusOr<CurlLibrary> CurlLibrary::Open(const std::string& library) {
  absl::StatusOr<SharedLibrary> lib = SharedLibrary::Open(library);
  if (!lib.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "libcurl is needed to download and cannot be loaded: ", lib.status().message(),
        "; ", kHowToFix));
  }
  CurlApi api;
  const std::string& n = library;
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_global_init", &api.global_init));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_version_info", &api.version_info));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_easy_init", &api.easy_init));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_easy_setopt", &api.easy_setopt));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_easy_getinfo", &api.easy_getinfo));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_easy_perform", &api.easy_perform));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_easy_reset", &api.easy_reset));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_easy_cleanup", &api.easy_cleanup));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_easy_strerror", &api.easy_strerror));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_slist_append", &api.slist_append));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_slist_free_all", &api.slist_free_all));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_multi_init", &api.multi_init));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_multi_setopt", &api.multi_setopt));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_multi_add_handle", &api.multi_add_handle));
  CUBIST_RETURN_IF_ERROR(
      Resolve(*lib, n, "curl_multi_remove_handle", &api.multi_remove_handle));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_multi_perform", &api.multi_perform));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_multi_poll", &api.multi_poll));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_multi_info_read", &api.multi_info_read));
  CUBIST_RETURN_IF_ERROR(Resolve(*lib, n, "curl_multi_cleanup", &api.multi_cleanup));
  const curl_version_info_data* info = api.version_info(CURLVERSION_NOW);
  if (info == nullptr || info->version_num < kMinLibcurlVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        library, " is libcurl ", info != nullptr ? info->version : "of unknown version",
        ", too old for cubist; ", kHowToFix));
  }
  return CurlLibrary(*std::move(lib), api);
}

absl::StatusOr<const CurlApi*> LoadCurl() {
  // Leaked on purpose: handles and libcurl's own state must outlive every static
  // destructor that might still release one, as with the CUDA driver's table.
  static const absl::StatusOr<const CurlApi*>* const loaded =
      []() -> const absl::StatusOr<const CurlApi*>* {
    absl::StatusOr<CurlLibrary> opened = CurlLibrary::Open(LibraryToLoad());
    if (!opened.ok()) return new absl::StatusOr<const CurlApi*>(opened.status());
    const CurlApi& api = (new CurlLibrary(*std::move(opened)))->api();
    // Exactly once per process, before any other libcurl call: it is not thread-safe
    // in the libcurl versions we support, and the static initialisation above is.
    if (CURLcode rc = api.global_init(CURL_GLOBAL_DEFAULT); rc != CURLE_OK) {
      return new absl::StatusOr<const CurlApi*>(absl::FailedPreconditionError(
          absl::StrCat("libcurl: curl_global_init: ", api.easy_strerror(rc))));
    }
    return new absl::StatusOr<const CurlApi*>(&api);
  }();
  return *loaded;
}

}  // namespace cubist
