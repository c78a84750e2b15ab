#include "artifacts/curl_options.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/version.h"

namespace cubist {

CaSettings CaSettings::FromEnvironment() {
  CaSettings ca;
  for (const char* v : {"CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
    const char* s = std::getenv(v);
    if (s != nullptr && *s != '\0') {
      ca.bundle = s;
      break;
    }
  }
  if (const char* dir = std::getenv("SSL_CERT_DIR"); dir != nullptr) ca.directory = dir;
  return ca;
}

void ApplyCurlOptions(const CurlApi& curl, CURL* e, const CurlOptions& options) {
  // One user agent for the process; libcurl copies the string.
  static const std::string* const user_agent =
      new std::string(absl::StrCat("cubist/", Version()));
  curl.easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl.easy_setopt(e, CURLOPT_PROTOCOLS_STR, options.protocols);
  curl.easy_setopt(e, CURLOPT_FOLLOWLOCATION, options.follow_redirects ? 1L : 0L);
  curl.easy_setopt(e, CURLOPT_MAXREDIRS, static_cast<long>(options.max_redirects));
  curl.easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl.easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options.connect_timeout)));
  if (options.total_timeout != absl::InfiniteDuration()) {
    curl.easy_setopt(e, CURLOPT_TIMEOUT_MS,
                     static_cast<long>(absl::ToInt64Milliseconds(options.total_timeout)));
  }
  if (options.low_speed_bytes > 0) {
    curl.easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, static_cast<long>(options.low_speed_bytes));
    curl.easy_setopt(e, CURLOPT_LOW_SPEED_TIME,
                     static_cast<long>(std::max<int64_t>(
                         1, absl::ToInt64Seconds(options.low_speed_time))));
  }
  curl.easy_setopt(e, CURLOPT_USERAGENT, user_agent->c_str());
  if (!options.ca.bundle.empty()) curl.easy_setopt(e, CURLOPT_CAINFO, options.ca.bundle.c_str());
  if (!options.ca.directory.empty()) {
    curl.easy_setopt(e, CURLOPT_CAPATH, options.ca.directory.c_str());
  }
}

}  // namespace cubist
