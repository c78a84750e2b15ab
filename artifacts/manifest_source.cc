#include "artifacts/manifest_source.h"

#include <algorithm>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "artifacts/curl_transport.h"
#include "artifacts/fetch_policy.h"
#include "artifacts/oci_manifest_source.h"
#include "artifacts/sources.h"
#include "artifacts/version_guard.h"
#include "base/clock.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/checksums.h"

namespace cubist {
namespace {

std::string OfflineCopyPath(const Store& store, std::string_view url) {
  return absl::StrCat(store.ManifestsDir(), "/by-url/", Sha256Hex(url));
}

}  // namespace

absl::StatusOr<std::string> ReadLocation(std::string_view location, uint64_t max_bytes,
                                         absl::Duration timeout, int attempts) {
  ReadSeams seams;
  return ReadLocation(location, max_bytes, timeout, attempts, seams);
}

absl::StatusOr<std::string> ReadLocation(std::string_view location, uint64_t max_bytes,
                                         absl::Duration timeout, int attempts,
                                         const ReadSeams& seams) {
  if (!IsUrl(location)) return ReadFileToString(std::string(location), max_bytes);
  Transport& transport = seams.transport != nullptr ? *seams.transport : DefaultTransport();
  Clock& clock = seams.clock != nullptr ? *seams.clock : Clock::Real();
  RetryPolicy policy = seams.retry;
  policy.attempts_per_source = std::max(1, attempts);
  std::mt19937_64 rng(seams.seed != 0 ? seams.seed : std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.0, 1.0);
  const std::string url(location);
  AttemptState state;
  for (;;) {
    TransportResponse r = transport.Get({url, max_bytes, timeout});
    if (r.too_large) {
      return absl::InvalidArgumentError(absl::StrCat(
          url, ": larger than the limit of ", max_bytes, " bytes; is this a manifest?"));
    }
    const FetchEvent event = ClassifyTransfer(r.facts);
    if (event == FetchEvent::kBodyComplete) return std::move(r.body);
    std::string why = r.facts.result != TransportResult::kOk
                          ? r.error
                          : absl::StrCat("HTTP ", r.facts.http_status);
    if (event == FetchEvent::kNotFound) {
      return absl::NotFoundError(absl::StrCat(
          url, ": ", r.facts.result == TransportResult::kFileMissing ? "no such file"
                                                                    : why + " (not found)"));
    }
    const FetchDecision d = Decide(event, state, policy, r.retry_after, jitter(rng));
    if (d.action == FetchAction::kRetry || d.action == FetchAction::kRestartRetry) {
      ++state.failed_attempts;
      clock.SleepFor(d.delay);
      continue;
    }
    // One source: giving it up is the end.
    return absl::UnavailableError(
        d.attempts_exhausted ? absl::StrCat(url, ": ", why, " (", policy.attempts_per_source,
                                            " attempts)")
                             : absl::StrCat(url, ": ", why));
  }
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
