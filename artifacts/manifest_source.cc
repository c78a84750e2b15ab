#include "artifacts/manifest_source.h"

#include <algorithm>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "artifacts/curl_handles.h"
#include "artifacts/curl_options.h"
#include "artifacts/oci_manifest_source.h"
#include "artifacts/sources.h"
#include "artifacts/version_guard.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/checksums.h"

namespace cubist {
namespace {

struct Body {
  std::string data;
  uint64_t max_bytes = 0;
  bool too_large = false;
};

size_t OnBody(char* p, size_t size, size_t n, void* user) {
  auto* body = static_cast<Body*>(user);
  size_t len = size * n;
  if (body->data.size() + len > body->max_bytes) {
    body->too_large = true;
    return 0;
  }
  body->data.append(p, len);
  return len;
}

absl::StatusOr<std::string> ReadUrlOnce(const std::string& url, uint64_t max_bytes,
                                        absl::Duration timeout, bool* retryable) {
  *retryable = false;
  EnsureCurlInitialized();
  CurlEasy easy(curl_easy_init());
  Body body;
  body.max_bytes = max_bytes;
  char errbuf[CURL_ERROR_SIZE] = {0};
  CURL* e = easy.get();
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
  CurlOptions options;
  options.total_timeout = timeout;
  options.ca = CaSettings::FromEnvironment();  // SSL_CERT_DIR too, as the README says
  ApplyCurlOptions(e, options);
  CURLcode rc = curl_easy_perform(e);
  long code = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &code);
  if (body.too_large) {
    return absl::InvalidArgumentError(absl::StrCat(
        url, ": larger than the limit of ", max_bytes, " bytes; is this a manifest?"));
  }
  if (rc == CURLE_FILE_COULDNT_READ_FILE) {
    return absl::NotFoundError(absl::StrCat(url, ": no such file"));
  }
  if (rc != CURLE_OK) {
    *retryable = rc != CURLE_UNSUPPORTED_PROTOCOL && rc != CURLE_URL_MALFORMAT &&
                 rc != CURLE_TOO_MANY_REDIRECTS;
    return absl::UnavailableError(
        absl::StrCat(url, ": ", errbuf[0] ? errbuf : curl_easy_strerror(rc)));
  }
  bool is_file = absl::StartsWithIgnoreCase(Sv(url), "file://");
  if (!is_file && (code == 404 || code == 410)) {
    return absl::NotFoundError(absl::StrCat(url, ": HTTP ", code, " (not found)"));
  }
  if (!is_file && (code < 200 || code >= 300)) {
    *retryable = code == 408 || code == 429 || code >= 500;
    return absl::UnavailableError(absl::StrCat(url, ": HTTP ", code));
  }
  return std::move(body.data);
}

std::string OfflineCopyPath(const Store& store, std::string_view url) {
  return absl::StrCat(store.ManifestsDir(), "/by-url/", Sha256Hex(url));
}

}  // namespace

absl::StatusOr<std::string> ReadLocation(std::string_view location, uint64_t max_bytes,
                                         absl::Duration timeout, int attempts) {
  if (!IsUrl(location)) return ReadFileToString(std::string(location), max_bytes);
  std::string url(location);
  std::mt19937_64 rng(std::random_device{}());
  absl::Status last;
  for (int i = 0; i < std::max(1, attempts); ++i) {
    if (i > 0) {
      std::uniform_int_distribution<int> jitter(100, 250);
      std::this_thread::sleep_for(std::chrono::milliseconds(jitter(rng) << std::min(i, 5)));
    }
    bool retryable = false;
    auto body = ReadUrlOnce(url, max_bytes, timeout, &retryable);
    if (body.ok() || !retryable) return body;
    last = body.status();
  }
  return absl::Status(last.code(), absl::StrCat(last.message(), " (", attempts, " attempts)"));
}

absl::StatusOr<OpenedManifest> OpenManifest(std::string_view location,
                                            const OpenManifestOptions& options) {
  if (IsOciReference(location)) return OpenOciManifest(location, options);
  OpenedManifest out;
  std::optional<std::string> signature;
  bool want_signature = !options.trust.trusted_keys.empty();
  std::string sig_location = SignatureLocation(location);
  if (IsNetworkUrl(location) && options.offline) {
    if (options.store == nullptr) {
      return absl::NotFoundError(absl::StrCat(
          Sv(location), ": --offline and the manifest is a URL; pass a local path"));
    }
    std::string copy = OfflineCopyPath(*options.store, location);
    auto bytes = ReadFileToString(copy, options.max_bytes);
    if (!bytes.ok()) {
      return absl::NotFoundError(absl::StrCat(
          Sv(location), ": --offline, and the cache holds no copy of this manifest; "
          "fetch it once with the network, or pass a local path"));
    }
    out.bytes = *std::move(bytes);
    out.from_offline_copy = true;
    if (want_signature) {
      auto sig = ReadFileToString(copy + ".sig", 64 << 10);
      if (sig.ok()) signature = *std::move(sig);
    }
  } else {
    CUBIST_ASSIGN_OR_RETURN(
        out.bytes, ReadLocation(location, options.max_bytes, options.timeout, options.attempts));
    if (want_signature) {
      auto sig = ReadLocation(sig_location, 64 << 10, options.timeout, options.attempts);
      if (sig.ok()) {
        signature = *std::move(sig);
      } else if (sig.status().code() != absl::StatusCode::kNotFound) {
        return Annotate(sig.status(), "read the manifest's signature");
      }
    }
  }
  std::string source(location);
  // Signature first: with trusted keys, not one byte is parsed before it verifies.
  CUBIST_RETURN_IF_ERROR(
      CheckManifestSignature(out.bytes, signature, options.trust, source));
  CUBIST_ASSIGN_OR_RETURN(out.manifest, ParseManifestOrChecksums(out.bytes, source));
  out.manifest.source = source;
  CUBIST_RETURN_IF_ERROR(CheckManifestExpiry(out.manifest, options.trust, absl::Now()));
  if (options.store != nullptr && !out.manifest.name.empty() && out.manifest.version > 0) {
    VersionGuard guard(options.store->root());
    if (options.record_version) {
      CUBIST_RETURN_IF_ERROR(guard.CheckAndRecord(out.manifest, options.trust.allow_rollback));
    } else {
      CUBIST_RETURN_IF_ERROR(guard.Check(out.manifest, options.trust.allow_rollback));
    }
  }
  if (options.store != nullptr && IsNetworkUrl(location) && !out.from_offline_copy &&
      options.record_version) {
    // Remember it for --offline runs. Best effort: a failure here must not fail a fetch
    // whose manifest is fine.
    std::string copy = OfflineCopyPath(*options.store, location);
    if (MakeDirs(DirName(copy)).ok() && WriteFileAtomically(copy, out.bytes).ok() &&
        signature.has_value()) {
      (void)WriteFileAtomically(copy + ".sig", *signature);
    }
  }
  return out;
}

}  // namespace cubist
