#include "artifacts/curl_handles.h"

#include <cstdlib>
#include <mutex>

namespace cubist {

void EnsureCurlInitialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) std::abort();
  });
}

}  // namespace cubist
