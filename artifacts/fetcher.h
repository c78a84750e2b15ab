// The fetcher: brings every artifact of a manifest into the store, verified.
//
// Per artifact (architecture.md, "Fetch"): present -> done, without hashing. Else take
// the object's lock, look again (another process may have finished it), download into
// tmp/ while hashing (never a whole file in memory, never more than the declared size),
// compare size and SHA-256, fsync, rename into objects/, fsync the directory, unlock.
// Waiters in other processes then find the object present and reuse it, so N ranks on a
// node cause one download per object (flashinfer#3507).
//
// Transfers run on libcurl multi event loops (a few threads, `jobs` transfers in all),
// with connection reuse and HTTP/2 multiplexing where the server offers it. Failures:
//   404/410 or a missing file:// source   -> next source
//   5xx, 429, 408, timeouts, resets, short bodies -> retry the same source with jittered
//        exponential backoff (honouring Retry-After), resuming with Range when the
//        server honours it; then the next source
//   size or hash mismatch, more bytes than declared -> delete, next source; never cached
//   disk full or unwritable cache          -> that artifact fails at once
// Every failed artifact is reported; the others still land. fsync()s are batched
// across artifacts (group commit) so that a thousand small files do not cost a
// thousand synchronous disk flushes.
//
// Thread safety: Fetch may be called from several threads and processes at once on the
// same cache; each call is independent.
#ifndef CUBIST_ARTIFACTS_FETCHER_H_
#define CUBIST_ARTIFACTS_FETCHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string_view>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "artifacts/store.h"
#include "base/clock.h"
#include "manifest/manifest.h"
#include "manifest/manifest_binary.h"

namespace cubist {

struct FetchOptions {
  // The manifest's name or location, for messages that blame it.
  std::string manifest;
  int jobs = 16;    // transfers in flight, all threads together
  int threads = 0;  // event loops; 0 picks min(cores, 4)
  // No network at all: artifacts not in the cache are reported as NotFound.
  bool offline = false;
  int attempts_per_source = 4;  // tries of one source before moving to the next
  absl::Duration connect_timeout = absl::Seconds(10);
  // A transfer slower than low_speed_bytes per second for low_speed_time is a stall.
  absl::Duration low_speed_time = absl::Seconds(20);
  int64_t low_speed_bytes = 1024;
  absl::Duration backoff_base = absl::Milliseconds(250);
  absl::Duration backoff_max = absl::Seconds(8);
  absl::Duration retry_after_max = absl::Seconds(30);  // cap on a server's Retry-After
  // How long to wait for another process that holds an object's lock.
  absl::Duration lock_timeout = absl::Minutes(30);
  // Cap for artifacts whose size the manifest does not declare (checksums.txt).
  uint64_t max_unknown_size = uint64_t{4} << 30;
  int max_redirects = 5;
  // Group commit of fsync; false only for benchmarks that measure the network part.
  bool durable = true;
  // The Authorization header line for a request to `url` ("Authorization: Bearer ..."),
  // or "" for none. Called from the fetch threads; must be thread-safe. Registries set
  // it (MakeOciAuthorizer); plain HTTP sources leave it empty.
  std::function<std::string(std::string_view url)> authorization;
  // Time and waiting (backoff, lock polls); null is the system clock. Tests pass a fake.
  Clock* clock = nullptr;
};

// Live counters, readable from another thread (the CLI's progress bar).
struct FetchProgress {
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> files_done{0};
  std::atomic<uint64_t> files_failed{0};
  // Set once before the downloads start; atomic because the reader may already run.
  std::atomic<uint64_t> files_total{0};
  std::atomic<uint64_t> bytes_total{0};     // declared sizes of the artifacts to download
  std::atomic<uint64_t> files_unsized{0};   // of those, how many declare no size
};

// One artifact to fetch and where it may come from, in order.
struct FetchItem {
  Artifact artifact;
  std::vector<std::string> urls;
};

enum class FetchOutcome {
  kCached,      // already in the store; nothing was read or sent
  kDownloaded,  // this call downloaded and published it
  kReused,      // another process published it while this one waited for the lock
  kFailed,
};
const char* FetchOutcomeName(FetchOutcome outcome);

struct ArtifactResult {
  std::string path;
  std::string sha256;
  FetchOutcome outcome = FetchOutcome::kFailed;
  absl::Status status;       // why it failed, "fetch <path>: ..."
  std::string url;           // the source that served it (downloaded only)
  uint64_t bytes_received = 0;  // body bytes received, all attempts
  int attempts = 0;             // HTTP transfers started
};

struct FetchReport {
  std::vector<ArtifactResult> results;  // same order as the items
  absl::Duration elapsed;
  uint64_t bytes_received = 0;
  int cached = 0, downloaded = 0, reused = 0, failed = 0;
  // OK when nothing failed; else the code of the most serious failure (DataLoss before
  // ResourceExhausted before PermissionDenied before Unavailable before NotFound), with
  // a message that counts the failures and quotes the first.
  absl::Status status;
};

// Fetches `items` into `store`. Never returns early on one artifact's failure: every
// item gets a result. `progress` may be null.
FetchReport FetchArtifacts(const Store& store, const std::vector<FetchItem>& items,
                           const FetchOptions& options, FetchProgress* progress = nullptr);

// The all-cached check of a warm fetch: probes every artifact of `manifest` that
// `filters` selects (as PlanFetch selects them) exactly as FetchArtifacts' first pass
// does (presence and size, one fstatat each), and builds nothing per artifact: no
// FetchItem, no URL, no ArtifactResult: for a set of 13,000 cached files, building and
// freeing those was a third of the fetch (issue 12). It stops at the first artifact that
// is not present; the caller then plans and fetches as usual, which probes again (one
// more stat per artifact, next to downloads).
struct CacheCheck {
  bool all_present = false;  // every selected artifact is in the store, of its size
  size_t selected = 0;       // how many the filters select; complete only when all_present
};
CacheCheck CheckAllCached(const Store& store, const Manifest& manifest,
                          const std::vector<std::string>& filters);
// The same check of artifacts still packed in a parsed-manifest entry (manifest_binary.h,
// OpenManifestOptions::pack_artifacts): not even an Artifact is built per artifact.
CacheCheck CheckAllCached(const Store& store, const PackedArtifacts& artifacts,
                          const std::vector<std::string>& filters);

// Whether `path` matches one of `filters` (fnmatch globs); an empty list selects all.
bool SelectedByFilters(std::string_view path, const std::vector<std::string>& filters);

// Builds the items for a manifest: each artifact whose path matches one of `filters`
// (fnmatch globs; empty = all), with its URLs from ArtifactBases; for a manifest
// read from an OCI registry (source oci://...), its blob URLs (OciBlobBases).
std::vector<FetchItem> PlanFetch(const Manifest& manifest,
                                 const std::vector<std::string>& mirrors,
                                 const std::vector<std::string>& filters);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_FETCHER_H_
