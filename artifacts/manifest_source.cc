#include "artifacts/manifest_source.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <vector>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "artifacts/curl_transport.h"
#include "artifacts/http_headers.h"
#include "artifacts/fetch_policy.h"
#include "artifacts/parsed_manifest_cache.h"
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

// Beside the copy of a URL manifest (<copy>.etag): the ETag the server sent with those
// bytes, and their SHA-256, so that a copy and a tag written by different processes (each
// file is replaced atomically, the pair is not) are never taken for each other:
//   cubist.etag/1
//   <sha256 of the copy>
//   <etag>
constexpr std::string_view kEtagHeader = "cubist.etag/1";

struct EtagRecord {
  std::string sha256;
  std::string etag;
};

std::optional<EtagRecord> ReadEtagRecord(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path, 4096);
  if (!text.ok()) return std::nullopt;
  std::vector<std::string_view> lines;
  for (size_t start = 0; start < text->size();) {
    size_t nl = text->find('\n', start);
    if (nl == std::string::npos) return std::nullopt;  // torn
    lines.push_back(std::string_view(*text).substr(start, nl - start));
    start = nl + 1;
  }
  if (lines.size() != 3 || lines[0] != kEtagHeader || !IsSha256Hex(lines[1])) {
    return std::nullopt;
  }
  std::optional<std::string> etag = EtagFromHeaderLine(absl::StrCat("ETag: ", Sv(lines[2])));
  if (!etag.has_value() || *etag != lines[2]) return std::nullopt;
  return EtagRecord{std::string(lines[1]), *std::move(etag)};
}

std::string EtagRecordText(std::string_view sha256, std::string_view etag) {
  return absl::StrCat(Sv(kEtagHeader), "\n", Sv(sha256), "\n", Sv(etag), "\n");
}

// A URL read through the copy remembered for it (the manifest, or its signature).
struct RememberedRead {
  std::string bytes;
  std::string digest;  // SHA-256 of bytes, when known without hashing (a 304's copy)
  std::string etag;    // the tag that came with bytes
  bool not_modified = false;
};

// Conditional GET: when `copy` holds the bytes an ETag came with (its record says so),
// the request carries If-None-Match and a server that still has them answers 304; the
// copy is then the answer. Without a usable copy (or with `copy` empty) a plain GET.
absl::StatusOr<RememberedRead> ReadThroughCopy(std::string_view url, const std::string& copy,
                                               uint64_t max_bytes,
                                               const OpenManifestOptions& options) {
  RememberedRead out;
  std::optional<std::string> cached;
  std::string if_none_match;
  if (!copy.empty()) {
    if (std::optional<EtagRecord> rec = ReadEtagRecord(copy + ".etag"); rec.has_value()) {
      auto bytes = ReadFileToString(copy, max_bytes);
      if (bytes.ok() && Sha256Hex(*bytes) == rec->sha256) {
        cached = *std::move(bytes);
        out.digest = rec->sha256;
        if_none_match = rec->etag;
      }
    }
  }
  CUBIST_ASSIGN_OR_RETURN(LocationRead read,
                          ReadLocationIfChanged(url, if_none_match, max_bytes,
                                                options.timeout, options.attempts, {},
                                                options.stall));
  if (read.not_modified) {
    out.bytes = *std::move(cached);
    out.etag = std::move(if_none_match);
    out.not_modified = true;
  } else {
    out.bytes = std::move(read.bytes);
    out.etag = std::move(read.etag);
    out.digest.clear();
  }
  return out;
}

// Remembers `bytes`, what ReadThroughCopy read (`read`, its bytes moved out), at `copy`
// with its tag record, for --offline and the next conditional GET. After a 304 both are
// what they should be already. Best effort; false when the copy could not be written.
bool RememberCopy(const std::string& copy, std::string_view bytes,
                  const RememberedRead& read) {
  if (read.not_modified) return true;
  if (!MakeDirs(DirName(copy)).ok() || !WriteFileIfChanged(copy, bytes).ok()) return false;
  if (read.etag.empty()) {
    ::unlink((copy + ".etag").c_str());
  } else {
    const std::string digest = read.digest.empty() ? Sha256Hex(bytes) : read.digest;
    (void)WriteFileIfChanged(copy + ".etag", EtagRecordText(digest, read.etag));
  }
  return true;
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
  CUBIST_ASSIGN_OR_RETURN(LocationRead read, ReadLocationIfChanged(location, "", max_bytes,
                                                                   timeout, attempts, seams));
  return std::move(read.bytes);
}

absl::StatusOr<LocationRead> ReadLocationIfChanged(std::string_view location,
                                                   std::string_view etag, uint64_t max_bytes,
                                                   absl::Duration timeout, int attempts,
                                                   const ReadSeams& seams,
                                                   absl::Duration stall) {
  LocationRead out;
  CUBIST_RETURN_IF_ERROR(CheckFileUrlIsRegular(location));
  if (!IsUrl(location)) {
    CUBIST_ASSIGN_OR_RETURN(out.bytes, ReadFileToString(std::string(location), max_bytes));
    return out;
  }
  Transport* transport = seams.transport;
  if (transport == nullptr) {
    absl::StatusOr<Transport*> curl = DefaultTransport();
    if (!curl.ok()) return Annotate(curl.status(), location);
    transport = *curl;
  }
  Clock& clock = seams.clock != nullptr ? *seams.clock : Clock::Real();
  RetryPolicy policy = seams.retry;
  policy.attempts_per_source = std::max(1, attempts);
  std::mt19937_64 rng(seams.seed != 0 ? seams.seed : std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.0, 1.0);
  const std::string url(location);
  AttemptState state;
  for (;;) {
    TransportResponse r = transport->Get(
        {url, max_bytes, timeout, std::string(etag), kStallBytesPerSecond, stall});
    if (r.too_large) {
      return absl::InvalidArgumentError(absl::StrCat(
          url, ": larger than the limit of ", max_bytes, " bytes; is this a manifest?"));
    }
    // A 304 is an answer only to the question we asked; unasked, it is an odd status.
    if (!etag.empty() && r.facts.result == TransportResult::kOk && !r.facts.is_file &&
        r.facts.http_status == 304) {
      out.not_modified = true;
      return out;
    }
    const FetchEvent event = ClassifyTransfer(r.facts);
    if (event == FetchEvent::kBodyComplete) {
      out.bytes = std::move(r.body);
      out.etag = std::move(r.etag);
      return out;
    }
    std::string why = r.facts.result != TransportResult::kOk
                          ? r.error
                          : absl::StrCat("HTTP ", r.facts.http_status);
    if (event == FetchEvent::kNotFound) {
      return absl::NotFoundError(absl::StrCat(
          url, ": ", r.facts.result == TransportResult::kFileMissing ? "no such file"
                                                                    : why + " (not found)"));
    }
    if (event == FetchEvent::kUntrusted) {
      return absl::PermissionDeniedError(absl::StrCat(url, ": ", why, ": ", kUntrustedServerFix));
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

void OpenedManifest::UnpackArtifacts() {
  if (!packed_artifacts.has_value()) return;
  manifest.artifacts = packed_artifacts->Unpack();
  packed_artifacts.reset();
}

namespace {

// The bytes of a manifest and of its signature, as read, with what remembering them
// for --offline runs and the next conditional GETs needs.
struct ManifestRead {
  std::string bytes;
  std::optional<std::string> signature;
  // The SHA-256 of bytes once known (the cached copy's, checked against its record).
  std::string digest;
  bool from_offline_copy = false;
  std::optional<RememberedRead> read;      // the manifest, read online by URL
  std::optional<RememberedRead> sig_read;  // its signature, likewise
};

// With --offline, a network manifest is its copy in the cache (and its signature's).
absl::StatusOr<ManifestRead> ReadOfflineCopy(std::string_view location,
                                             const std::string& copy,
                                             const std::string& sig_copy,
                                             const OpenManifestOptions& options) {
  if (options.store == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        Sv(location), ": --offline and the manifest is a URL; pass a local path"));
  }
  auto bytes = ReadFileToString(copy, options.max_bytes);
  if (!bytes.ok()) {
    return absl::NotFoundError(absl::StrCat(
        Sv(location), ": --offline, and the cache holds no copy of this manifest; "
        "fetch it once with the network, or pass a local path"));
  }
  ManifestRead out;
  out.bytes = *std::move(bytes);
  out.from_offline_copy = true;
  if (!options.trust.trusted_keys.empty()) {
    auto sig = ReadFileToString(sig_copy, 64 << 10);
    if (sig.ok()) out.signature = *std::move(sig);
  }
  return out;
}

// Conditional GETs (ReadThroughCopy) of the manifest and, with trusted keys, of its
// signature: an unchanged pair costs two 304s and no body. A path is read as a file.
absl::StatusOr<ManifestRead> ReadOnline(std::string_view location, const std::string& copy,
                                        const std::string& sig_copy,
                                        const OpenManifestOptions& options) {
  ManifestRead out;
  CUBIST_ASSIGN_OR_RETURN(out.read, ReadThroughCopy(location, copy, options.max_bytes, options));
  out.bytes = std::move(out.read->bytes);
  out.digest = out.read->digest;
  if (!options.trust.trusted_keys.empty()) {
    auto sig = ReadThroughCopy(SignatureLocation(location), sig_copy, 64 << 10, options);
    if (sig.ok()) {
      out.signature = std::move(sig->bytes);
      out.sig_read = *std::move(sig);
    } else if (sig.status().code() != absl::StatusCode::kNotFound) {
      return Annotate(sig.status(), "read the manifest's signature");
    }
  }
  return out;
}

// Parses out->bytes (SHA-256 `digest`) into out->manifest: a parse of exactly these
// bytes from an earlier run (parsed_manifest_cache.h), else a parse now, remembered for
// the next run. Both give the same manifest; every check after is made on it either way.
absl::Status ParseThroughCache(const std::string& digest, const std::string& source,
                               const OpenManifestOptions& options, OpenedManifest* out) {
  std::optional<ParsedManifestCache> parsed;
  if (options.store != nullptr) parsed.emplace(*options.store);
  std::optional<Manifest> hit;
  PackedArtifacts packed;
  if (parsed.has_value()) {
    hit = parsed->Find(out->bytes, digest, source, options.pack_artifacts ? &packed : nullptr);
  }
  if (hit.has_value()) {
    out->manifest = *std::move(hit);
    if (options.pack_artifacts) out->packed_artifacts = std::move(packed);
  } else if (options.pack_artifacts) {
    // Parsed straight into the packed form: a large manifest's artifacts are never all
    // built, on the first read as on the next (bench/manifest_memory.py).
    CUBIST_ASSIGN_OR_RETURN(out->manifest,
                            ParseManifestOrChecksumsPacked(out->bytes, source, {}, &packed));
    // Best effort: a cache that cannot be written costs the next run a parse, no more.
    if (parsed.has_value()) (void)parsed->Put(out->manifest, packed, out->bytes, source);
    out->packed_artifacts = std::move(packed);
  } else {
    CUBIST_ASSIGN_OR_RETURN(out->manifest, ParseManifestOrChecksums(out->bytes, source));
    if (parsed.has_value()) (void)parsed->Put(out->manifest, out->bytes, source);
  }
  return absl::OkStatus();
}

// The rollback guard (version_guard.h), for a named, versioned manifest read into a cache.
absl::Status GuardVersion(const Manifest& manifest, const OpenManifestOptions& options) {
  if (options.store == nullptr || manifest.name.empty() || manifest.version <= 0) {
    return absl::OkStatus();
  }
  VersionGuard guard(options.store->root());
  if (options.record_version) {
    return guard.CheckAndRecord(manifest, options.trust.allow_rollback);
  }
  return guard.Check(manifest, options.trust.allow_rollback);
}

}  // namespace

absl::StatusOr<OpenedManifest> OpenUrlOrPathManifest(std::string_view location,
                                                     const OpenManifestOptions& options) {
  const bool remembered = options.store != nullptr && IsNetworkUrl(location);
  const std::string copy = remembered ? OfflineCopyPath(*options.store, location) : "";
  // The signature's copy sits beside the manifest's, with a tag record of its own.
  const std::string sig_copy = remembered ? copy + ".sig" : "";
  ManifestRead read;
  if (IsNetworkUrl(location) && options.offline) {
    CUBIST_ASSIGN_OR_RETURN(read, ReadOfflineCopy(location, copy, sig_copy, options));
  } else {
    CUBIST_ASSIGN_OR_RETURN(read, ReadOnline(location, copy, sig_copy, options));
  }
  OpenedManifest out;
  out.bytes = std::move(read.bytes);
  out.from_offline_copy = read.from_offline_copy;
  std::string source(location);
  // Signature first: with trusted keys, not one byte is parsed before it verifies.
  CUBIST_RETURN_IF_ERROR(
      CheckManifestSignature(out.bytes, read.signature, options.trust, source));
  if (read.digest.empty()) read.digest = Sha256Hex(out.bytes);
  CUBIST_RETURN_IF_ERROR(ParseThroughCache(read.digest, source, options, &out));
  out.manifest.source = source;
  if (IsNetworkUrl(location)) {
    CUBIST_RETURN_IF_ERROR(CheckRemoteManifestSources(out.manifest, location));
  }
  CUBIST_RETURN_IF_ERROR(CheckManifestExpiry(out.manifest, options.trust, absl::Now()));
  CUBIST_RETURN_IF_ERROR(GuardVersion(out.manifest, options));
  if (remembered && read.read.has_value() && options.record_version) {
    // Remember them for --offline runs and the next conditional GETs. Best effort: a
    // failure here must not fail a fetch whose manifest is fine.
    read.read->digest = read.digest;
    if (RememberCopy(copy, out.bytes, *read.read) && read.sig_read.has_value()) {
      (void)RememberCopy(sig_copy, *read.signature, *read.sig_read);
    }
  }
  return out;
}

}  // namespace cubist
