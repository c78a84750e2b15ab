#include "artifacts/fetcher.h"

#include <fcntl.h>
#include <fnmatch.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "artifacts/curl_handles.h"
#include "artifacts/curl_library.h"
#include "artifacts/curl_options.h"
#include "artifacts/curl_transport.h"
#include "artifacts/fetch_policy.h"
#include "artifacts/group_commit.h"
#include "artifacts/http_headers.h"
#include "artifacts/oci_manifest_source.h"
#include "artifacts/partial_file.h"
#include "artifacts/sources.h"
#include "artifacts/verify.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {

const char* FetchOutcomeName(FetchOutcome outcome) {
  switch (outcome) {
    case FetchOutcome::kCached: return "cached";
    case FetchOutcome::kDownloaded: return "downloaded";
    case FetchOutcome::kReused: return "reused";
    case FetchOutcome::kFailed: return "failed";
  }
  return "?";
}

bool SelectedByFilters(std::string_view path, const std::vector<std::string>& filters) {
  if (filters.empty()) return true;
  const std::string terminated(path);  // fnmatch wants a C string
  return std::any_of(filters.begin(), filters.end(), [&](const std::string& g) {
    return ::fnmatch(g.c_str(), terminated.c_str(), 0) == 0;
  });
}

namespace {

// CheckAllCached over whatever `for_each` walks: it calls its argument on each
// artifact's (path, sha256, size) until that returns false.
template <typename ForEach>
CacheCheck CheckEach(const Store& store, const std::vector<std::string>& filters,
                     ForEach for_each) {
  CacheCheck out;
  const Store::BatchProbe probe(store);
  const bool all = for_each([&](std::string_view path, std::string_view sha256,
                                std::optional<uint64_t> size) {
    if (!SelectedByFilters(path, filters)) return true;
    if (probe.Probe(sha256, size) != ObjectState::kPresent) return false;
    ++out.selected;
    return true;
  });
  out.all_present = all;
  return out;
}

}  // namespace

CacheCheck CheckAllCached(const Store& store, const Manifest& manifest,
                          const std::vector<std::string>& filters) {
  return CheckEach(store, filters, [&](auto visit) {
    for (const Artifact& a : manifest.artifacts) {
      if (!visit(a.path, a.sha256, a.size)) return false;
    }
    return true;
  });
}

CacheCheck CheckAllCached(const Store& store, const PackedArtifacts& artifacts,
                          const std::vector<std::string>& filters) {
  return CheckEach(store, filters, [&](auto visit) {
    return artifacts.ForEach(
        [&](const ArtifactRef& a) { return visit(a.path, a.sha256, a.size); });
  });
}

std::vector<FetchItem> PlanFetch(const Manifest& manifest,
                                 const std::vector<std::string>& mirrors,
                                 const std::vector<std::string>& filters) {
  // Artifacts of a set in an OCI registry are blobs named by their digest.
  std::optional<OciReference> oci;
  if (IsOciReference(manifest.source)) {
    if (auto ref = ParseOciReference(manifest.source); ref.ok()) oci = *std::move(ref);
  }
  std::vector<std::string> bases =
      oci.has_value() ? OciBlobBases(*oci, mirrors) : ArtifactBases(manifest, mirrors);
  std::vector<FetchItem> items;
  items.reserve(manifest.artifacts.size());
  for (const Artifact& a : manifest.artifacts) {
    if (!SelectedByFilters(a.path, filters)) continue;
    FetchItem item;
    item.artifact = a;
    for (const std::string& b : bases) {
      item.urls.push_back(oci.has_value() ? absl::StrCat(b, "sha256:", a.sha256)
                                          : JoinUrl(b, a.path));
    }
    items.push_back(std::move(item));
  }
  return items;
}

namespace {

// Ranks failure codes for the report: the first listed is the most serious.
int Severity(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kDataLoss: return 6;
    case absl::StatusCode::kResourceExhausted: return 5;
    case absl::StatusCode::kPermissionDenied: return 4;
    case absl::StatusCode::kDeadlineExceeded: return 3;
    case absl::StatusCode::kUnavailable: return 2;
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kInvalidArgument: return 1;
    default: return 0;
  }
}

// One artifact's state across all its attempts. Owned by the worker that took it.
struct Job {
  const FetchItem* item = nullptr;
  ArtifactResult* result = nullptr;
  size_t source = 0;          // index into item->urls
  int attempts_here = 0;      // failed attempts on the current source
  std::vector<std::string> source_errors;
  absl::StatusCode worst = absl::StatusCode::kOk;
  FileLock lock;
  PartialFile partial;        // the temp file and the hash of what it holds
  bool resumed = false;       // some bytes came from an earlier attempt
  bool restarted = false;     // already retried from byte 0 after a resumed mismatch
  bool waited_for_lock = false;
  absl::Time ready_at = absl::InfinitePast();
  absl::Time lock_wait_started = absl::InfinitePast();
  absl::Duration lock_poll = absl::Milliseconds(5);
};

// One HTTP(S) or file transfer of a Job.
struct Transfer {
  Job* job = nullptr;
  const CurlApi* curl = nullptr;  // the table `easy` came from
  CurlEasy easy;
  std::string url;
  uint64_t start_offset = 0;
  uint64_t received = 0;
  uint64_t limit = 0;  // most bytes the whole file may have
  bool status_checked = false;
  bool discard = false;      // an error body
  bool oversize = false;
  bool bad_range = false;
  bool range_ignored = false;
  absl::Status write_error;  // our disk failed: no other source helps
  ResponseHeaders headers;
  char errbuf[CURL_ERROR_SIZE] = {0};
  FetchProgress* progress = nullptr;
  CurlSlist request_headers;  // FetchOptions::authorization's header, when there is one
};

bool IsFileUrl(std::string_view url) { return absl::StartsWithIgnoreCase(Sv(url), "file://"); }

// libcurl's header callback: every line goes to the one header parser.
size_t OnHeader(char* data, size_t size, size_t n, void* user) {
  static_cast<Transfer*>(user)->headers.AddLine(std::string_view(data, size * n));
  return size * n;
}

// Decides, at the first body byte (or at the end for an empty body), what the
// response is: an error page to discard, a range answer to check, or data.
bool CheckStatus(Transfer* t) {
  if (t->status_checked) return true;
  t->status_checked = true;
  long code = 0;
  t->curl->easy_getinfo(t->easy.get(), CURLINFO_RESPONSE_CODE, &code);
  const bool is_file = IsFileUrl(t->url);
  if (!is_file && (code < 200 || code >= 300)) {
    t->discard = true;
    return true;
  }
  PartialFile& file = t->job->partial;
  if (file.size() == 0 || is_file) return true;
  if (code == 200) {
    // The server ignored Range and sends the whole file: start over.
    t->range_ignored = true;
    t->start_offset = 0;
    t->write_error = file.Reset();
    return t->write_error.ok();
  }
  if (code == 206 && t->headers.content_range_start != file.size()) {
    t->bad_range = true;  // answered a range we did not ask for
    return false;
  }
  return true;
}

// libcurl's write callback: checks the response once, then appends to the partial file.
size_t OnWrite(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t len = size * n;
  if (!CheckStatus(t)) return 0;
  if (t->discard) return len;
  PartialFile& file = t->job->partial;
  if (file.size() + len > t->limit) {
    t->oversize = true;  // stop at the declared size + 1 byte: never store more
    return 0;
  }
  t->write_error = file.Append(data, len);
  if (!t->write_error.ok()) return 0;
  t->received += len;
  if (t->progress != nullptr) t->progress->bytes_received.fetch_add(len);
  return len;
}

struct Shared {
  const Store& store;
  const FetchOptions& options;
  std::vector<Job>& jobs;  // one per artifact that was not cached
  std::atomic<size_t> next{0};
  GroupCommitter& committer;
  FetchProgress* progress;
  int per_worker;
  const CurlApi* curl;  // null with --offline: nothing is transferred, libcurl not loaded
};

RetryPolicy PolicyOf(const FetchOptions& options) {
  RetryPolicy policy;
  policy.attempts_per_source = options.attempts_per_source;
  policy.backoff_base = options.backoff_base;
  policy.backoff_max = options.backoff_max;
  policy.retry_after_max = options.retry_after_max;
  return policy;
}

CurlOptions CurlOptionsOf(const FetchOptions& options) {
  CurlOptions curl;
  curl.max_redirects = options.max_redirects;
  curl.connect_timeout = options.connect_timeout;
  curl.low_speed_bytes = options.low_speed_bytes;
  curl.low_speed_time = options.low_speed_time;
  curl.ca = CaSettings::FromEnvironment();
  return curl;
}

// One thread's share of the jobs. A job goes: first look at the store -> the object's
// cross-process lock (polled, with a timeout) -> second look -> partial file (resumed
// where one was left) -> transfers on this worker's libcurl multi handle, retried and
// moved to the next source as the fetch policy decides -> verify -> group commit.
class Worker {
 public:
  explicit Worker(Shared& shared)
      : s_(shared),
        clock_(shared.options.clock != nullptr ? *shared.options.clock : Clock::Real()),
        policy_(PolicyOf(shared.options)),
        curl_(shared.curl),
        rng_(std::random_device{}()),
        curl_options_(CurlOptionsOf(shared.options)) {
    if (curl_ != nullptr) {
      multi_.reset(curl_->multi_init());
      curl_->multi_setopt(multi_.get(), CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX);
    }
  }

  // The event loop: starts what is due, drives the transfers, waits for the next event.
  void Run() {
    for (;;) {
      StartDueJobs();
      if (active_ == 0 && waiting_.empty() && s_.next.load() >= s_.jobs.size()) return;
      // Without libcurl (--offline) no transfer was started: nothing to drive.
      if (curl_ != nullptr) DriveTransfers();
      const int timeout_ms = WaitMilliseconds();
      if (active_ > 0) {
        curl_->multi_poll(multi_.get(), nullptr, 0, timeout_ms, nullptr);
      } else if (!waiting_.empty() && timeout_ms > 0) {
        // Nothing in flight and every remaining job is waiting (backoff or another
        // process's lock): sleep until the first is due. With nothing waiting either,
        // go straight back and take the next job.
        clock_.SleepFor(absl::Milliseconds(timeout_ms));
      }
    }
  }

 private:
  const Artifact& A(const Job* job) const { return job->item->artifact; }

  // Steps the waiting jobs whose backoff or lock poll is due, then takes new jobs, up to
  // this worker's share of transfers in flight.
  void StartDueJobs() {
    const absl::Time now = clock_.Now();
    for (size_t i = 0; i < waiting_.size() && active_ < s_.per_worker;) {
      if (waiting_[i]->ready_at <= now) {
        Job* job = waiting_[i];
        waiting_.erase(waiting_.begin() + static_cast<long>(i));
        Step(job);
      } else {
        ++i;
      }
    }
    while (active_ < s_.per_worker) {
      size_t k = s_.next.fetch_add(1);
      if (k >= s_.jobs.size()) break;
      Step(&s_.jobs[k]);
    }
  }

  // How long the loop may wait for the network: until the first waiting job is due,
  // and never more than 100 ms.
  int WaitMilliseconds() const {
    if (waiting_.empty()) return 100;
    absl::Time soonest = absl::InfiniteFuture();
    for (const Job* j : waiting_) soonest = std::min(soonest, j->ready_at);
    return static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(soonest - clock_.Now()), 0, 100));
  }

  // One turn of the multi handle: moves data, then handles every finished transfer.
  void DriveTransfers() {
    int running = 0;
    curl_->multi_perform(multi_.get(), &running);
    int queued = 0;
    while (CURLMsg* msg = curl_->multi_info_read(multi_.get(), &queued)) {
      if (msg->msg != CURLMSG_DONE) continue;
      Transfer* t = nullptr;
      curl_->easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, reinterpret_cast<char**>(&t));
      CURLcode rc = msg->data.result;
      curl_->multi_remove_handle(multi_.get(), msg->easy_handle);
      --active_;
      std::unique_ptr<Transfer> owned(t);
      OnDone(*owned, rc);
    }
  }

  void Finish(Job* job, FetchOutcome outcome) {
    job->result->outcome = outcome;
    job->result->status = absl::OkStatus();
    job->lock.Release();
    if (s_.progress != nullptr) s_.progress->files_done.fetch_add(1);
  }

  void DropTemp(Job* job) {
    job->partial.Discard();
    job->resumed = false;
  }

  void Fail(Job* job, absl::Status status) {
    DropTemp(job);
    job->lock.Release();
    job->result->outcome = FetchOutcome::kFailed;
    job->result->status = std::move(status);
    if (s_.progress != nullptr) s_.progress->files_failed.fetch_add(1);
  }

  // Combines the per-source errors into the artifact's final error.
  void FailAllSources(Job* job) {
    std::string msg;
    if (job->source_errors.size() == 1) {
      msg = absl::StrCat("fetch ", A(job).path, " ", job->source_errors[0]);
    } else {
      msg = absl::StrCat("fetch ", A(job).path, ": all ", job->source_errors.size(),
                         " sources failed: ", absl::StrJoin(job->source_errors, "; "));
    }
    absl::StatusCode code =
        job->worst == absl::StatusCode::kOk ? absl::StatusCode::kUnavailable : job->worst;
    Fail(job, absl::Status(code, msg));
  }

  void NextSource(Job* job, absl::StatusCode code, std::string error) {
    job->source_errors.push_back(std::move(error));
    if (Severity(code) > Severity(job->worst)) job->worst = code;
    job->source++;
    job->attempts_here = 0;
    if (job->source >= job->item->urls.size()) {
      FailAllSources(job);
      return;
    }
    job->ready_at = clock_.Now();
    waiting_.push_back(job);
  }

  // Carries out the policy's decision (fetch_policy.h) after a failed transfer whose
  // error is `error`. The temp file's bytes were already dropped where it said so.
  void Apply(Job* job, const FetchDecision& d, const std::string& error) {
    switch (d.action) {
      case FetchAction::kRetry:
      case FetchAction::kRestartRetry:
        job->attempts_here++;
        job->ready_at = clock_.Now() + d.delay;
        waiting_.push_back(job);
        return;
      case FetchAction::kRestartNow:
        job->restarted = true;
        job->ready_at = clock_.Now();
        waiting_.push_back(job);
        return;
      case FetchAction::kNextSource:
      case FetchAction::kDropNextSource:
        NextSource(job, d.code,
                   d.attempts_exhausted
                       ? absl::StrCat(error, " (", job->attempts_here + 1, " attempts)")
                       : error);
        return;
      case FetchAction::kVerify:
      case FetchAction::kPublish:
        return;  // not failures; OnDone handles them
    }
  }

  // Advances a job: cached check, lock, second look, temp file, transfer.
  void Step(Job* job) {
    if (!job->lock.held()) {
      if (!FirstLook(job) || !TakeLock(job) || !SecondLook(job) || !OpenPartial(job)) {
        return;
      }
    }
    StartTransfer(job);
  }

  // Before the lock: false when the job is done (present in the store) or failed.
  bool FirstLook(Job* job) {
    const Artifact& a = A(job);
    const ObjectState state = s_.store.Probe(a.sha256, a.size);
    if (state == ObjectState::kPresent) {
      Finish(job, job->waited_for_lock ? FetchOutcome::kReused : FetchOutcome::kCached);
      return false;
    }
    if (FailedOnManifestSize(job, state)) return false;
    if (s_.options.offline && state != ObjectState::kUnconfirmed) {
      Fail(job, absl::NotFoundError(absl::StrCat(
                    "fetch ", a.path, ": not in the cache, and --offline forbids the "
                    "network; fetch it where the network is reachable, or copy the "
                    "cache directory to this node")));
      return false;
    }
    return true;
  }

  // Takes the object's cross-process lock without blocking. Another process holding it
  // is polled for (5 ms doubling to 100 ms, the job waiting meanwhile) until
  // FetchOptions::lock_timeout. False when the job waits or failed.
  bool TakeLock(Job* job) {
    const Artifact& a = A(job);
    auto lock = s_.store.TryLockObject(a.sha256);
    if (!lock.ok()) {
      Fail(job, Annotate(lock.status(), absl::StrCat("fetch ", a.path)));
      return false;
    }
    if (lock->held()) {
      job->lock = *std::move(lock);
      return true;
    }
    const absl::Time now = clock_.Now();
    if (!job->waited_for_lock) {
      job->waited_for_lock = true;
      job->lock_wait_started = now;
    } else if (now - job->lock_wait_started > s_.options.lock_timeout) {
      Fail(job, absl::DeadlineExceededError(absl::StrCat(
                    "fetch ", a.path, ": another process has held ",
                    s_.store.LockPath(a.sha256), " for ",
                    absl::FormatDuration(s_.options.lock_timeout),
                    "; if no cubist process is running, delete that file")));
      return false;
    }
    job->ready_at = now + job->lock_poll;
    job->lock_poll = std::min(job->lock_poll * 2, absl::Milliseconds(100));
    waiting_.push_back(job);
    return false;
  }

  // Under the lock: another process may have published while we took it. False when the
  // job is done or failed; true when the object must be downloaded.
  bool SecondLook(Job* job) {
    const Artifact& a = A(job);
    ObjectState state = s_.store.Probe(a.sha256, a.size);
    absl::Status changed;
    if (state == ObjectState::kUnconfirmed) {
      // Changed since it was published, or published unstamped: hashed once here
      // (store.h, "the publish record"); kept and stamped when it is still right.
      changed = s_.store.Confirm(a.sha256);
      if (changed.ok()) state = ObjectState::kPresent;
    }
    if (state == ObjectState::kPresent) {
      Finish(job, job->waited_for_lock ? FetchOutcome::kReused : FetchOutcome::kCached);
      return false;
    }
    if (FailedOnManifestSize(job, state)) return false;
    if (state == ObjectState::kMissing) return true;
    // Wrong size or something planted there: never trust it, replace it.
    absl::Status rm = s_.store.Remove(a.sha256);
    if (!rm.ok()) {
      Fail(job, Annotate(rm, absl::StrCat("fetch ", a.path)));
      return false;
    }
    if (s_.options.offline) {
      Fail(job, absl::DataLossError(absl::StrCat(
                    "fetch ", a.path, ": ", changed.message(),
                    "; removed from the cache, and --offline forbids the network: "
                    "fetch it where the network is reachable")));
      return false;
    }
    return true;
  }

  // An object of another size than the manifest says that hashes to its name is right,
  // and the manifest entry is not: the object is kept (another set may need it) and the
  // artifact fails with DataLoss naming the manifest. Published objects never change, so
  // hashing one needs no lock.
  bool FailedOnManifestSize(Job* job, ObjectState state) {
    const Artifact& a = A(job);
    uint64_t object_size = 0;
    if (state != ObjectState::kWrongSize ||
        !ObjectHashesToName(s_.store, a.sha256, &object_size)) {
      return false;
    }
    absl::Status wrong =
        ManifestSizeWrong(s_.options.manifest, a.path, a.sha256, *a.size, object_size);
    Fail(job, absl::Status(wrong.code(), absl::StrCat("fetch ", wrong.message())));
    return true;
  }

  // Opens the object's partial file; one a killed process left is resumed. False (and
  // the job failed) when it cannot be opened.
  bool OpenPartial(Job* job) {
    const Artifact& a = A(job);
    absl::Status s = job->partial.Open(s_.store.TempPath(a.sha256), a.size);
    if (!s.ok()) {
      Fail(job, Annotate(s, absl::StrCat("fetch ", a.path)));
      return false;
    }
    if (job->partial.size() > 0) job->resumed = true;
    return true;
  }

  void StartTransfer(Job* job) {
    // libcurl opens a file:// source blocking: a FIFO there would hang this worker.
    if (absl::Status regular = CheckFileUrlIsRegular(job->item->urls[job->source]);
        !regular.ok()) {
      NextSource(job, regular.code(), absl::StrCat("from ", regular.message()));
      return;
    }
    auto t = std::make_unique<Transfer>();
    t->job = job;
    t->url = job->item->urls[job->source];
    t->start_offset = job->partial.size();
    t->progress = s_.progress;
    const Artifact& a = A(job);
    t->limit = a.size.has_value() ? *a.size : s_.options.max_unknown_size;
    t->curl = curl_;
    t->easy.reset(curl_->easy_init());
    ConfigureEasy(*t);
    job->result->attempts++;
    if (curl_->multi_add_handle(multi_.get(), t->easy.get()) != CURLM_OK) {
      Fail(job, absl::InternalError(absl::StrCat("fetch ", a.path, ": curl_multi_add_handle")));
      return;
    }
    ++active_;
    t.release();  // owned by the multi handle until CURLMSG_DONE
  }

  // Sets the transfer's easy handle up: URL, callbacks, shared options, the
  // authorization header, and the resume offset.
  void ConfigureEasy(Transfer& t) const {
    CURL* e = t.easy.get();
    curl_->easy_setopt(e, CURLOPT_URL, t.url.c_str());
    curl_->easy_setopt(e, CURLOPT_PRIVATE, &t);
    curl_->easy_setopt(e, CURLOPT_WRITEFUNCTION, &OnWrite);
    curl_->easy_setopt(e, CURLOPT_WRITEDATA, &t);
    curl_->easy_setopt(e, CURLOPT_HEADERFUNCTION, &OnHeader);
    curl_->easy_setopt(e, CURLOPT_HEADERDATA, &t);
    curl_->easy_setopt(e, CURLOPT_ERRORBUFFER, t.errbuf);
    ApplyCurlOptions(*curl_, e, curl_options_);
    curl_->easy_setopt(e, CURLOPT_BUFFERSIZE, 256L * 1024L);
    if (s_.options.authorization) {
      std::string header = s_.options.authorization(t.url);
      if (!header.empty()) {
        t.request_headers.reset(curl_->slist_append(nullptr, header.c_str()));
        curl_->easy_setopt(e, CURLOPT_HTTPHEADER, t.request_headers.get());
      }
    }
    if (t.start_offset > 0) {
      curl_->easy_setopt(e, CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(t.start_offset));
    }
  }

  // A transfer ended: classify it, verify a complete body, then commit it or ask the
  // policy and act.
  void OnDone(Transfer& t, CURLcode rc) {
    Job* job = t.job;
    job->result->bytes_received += t.received;
    if (rc == CURLE_OK || t.received > 0) CheckStatus(&t);
    if (!t.write_error.ok()) {  // our disk, not the source: no other source helps
      Fail(job, Annotate(t.write_error, absl::StrCat("fetch ", A(job).path)));
      return;
    }
    if (!t.oversize && !t.bad_range && t.received > 0 && t.start_offset > 0) {
      job->resumed = true;
    }
    std::string error;
    const FetchEvent event = Verify(t, rc, &error);
    if (event == FetchEvent::kVerified) {
      Commit(job, t.url);
      return;
    }
    AttemptState state{job->attempts_here, job->resumed, job->restarted};
    const FetchDecision d =
        Decide(event, state, policy_, t.headers.retry_after, jitter_(rng_));
    if (!DropBytes(job, event, d.action)) return;  // the job failed on our disk
    Apply(job, d, error);
  }

  // What the transfer came to (fetch_policy.h's event), a complete body's size and hash
  // checked against the manifest; `error` gets the words for any other outcome.
  FetchEvent Verify(const Transfer& t, CURLcode rc, std::string* error) {
    const Artifact& a = A(t.job);
    TransferFacts facts;
    facts.result = TransportResultOf(rc);
    facts.is_file = IsFileUrl(t.url);
    curl_->easy_getinfo(t.easy.get(), CURLINFO_RESPONSE_CODE, &facts.http_status);
    facts.oversize = t.oversize;
    facts.bad_range = t.bad_range;
    const std::string from = absl::StrCat("from ", t.url);
    const FetchEvent event = ClassifyTransfer(facts);
    if (event != FetchEvent::kBodyComplete) {
      *error = TransferError(event, facts, from, t, rc);
      return event;
    }
    const uint64_t total = t.job->partial.size();
    if (a.size.has_value() && total != *a.size) {
      *error = absl::StrCat(from, ": size mismatch: expected ", *a.size, " bytes, got ",
                            total, "; the source serves a different file, try --mirror "
                            "or report it");
      return FetchEvent::kSizeMismatch;
    }
    const std::string got = t.job->partial.FinishSha256();
    if (got != a.sha256) {
      *error = absl::StrCat(from, ": sha256 mismatch: expected ", a.sha256, ", got ", got,
                            " (", total, " bytes); the mirror serves a different file, "
                            "try --mirror or report it");
      return FetchEvent::kHashMismatch;
    }
    return FetchEvent::kVerified;
  }

  // The words for a transfer that did not bring a complete body.
  std::string TransferError(FetchEvent event, const TransferFacts& facts,
                            const std::string& from, const Transfer& t, CURLcode rc) const {
    switch (event) {
      case FetchEvent::kOversize:
        return absl::StrCat(from, ": the server sent more than the declared ", t.limit,
                            " bytes; stopped there; the source serves a different file, "
                            "try --mirror or report it");
      case FetchEvent::kRangeRefused:
        return t.bad_range
                   ? absl::StrCat(from, ": answered a different byte range than requested")
                   : HttpOrTransportError(facts, from, t, rc);
      case FetchEvent::kUntrusted:
        return absl::StrCat(HttpOrTransportError(facts, from, t, rc), ": ",
                            kUntrustedServerFix);
      default:
        return rc == CURLE_OPERATION_TIMEDOUT && Connected(t)
                   ? TooSlowError(from, t)
                   : HttpOrTransportError(facts, from, t, rc);
    }
  }

  // Verified: hand over to the group committer, which publishes and unlocks. Start the
  // write-back now (without waiting) so that the committer's flush finds most of the
  // data already on its way to the disk.
  void Commit(Job* job, const std::string& url) {
    const Artifact& a = A(job);
    if (s_.options.durable) {
      ::sync_file_range(job->partial.fd(), 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    job->result->url = url;
    GroupCommitter::Pending p;
    p.sha256 = a.sha256;
    p.temp_path = job->partial.path();
    p.fd = job->partial.ReleaseFd();
    p.lock = std::move(job->lock);
    ArtifactResult* result = job->result;
    FetchProgress* progress = s_.progress;
    std::string path = a.path;
    p.done = [result, progress, path](absl::Status st) {
      if (st.ok()) {
        result->outcome = FetchOutcome::kDownloaded;
        result->status = absl::OkStatus();
        if (progress != nullptr) progress->files_done.fetch_add(1);
      } else {
        result->outcome = FetchOutcome::kFailed;
        result->status = Annotate(st, absl::StrCat("fetch ", path));
        if (progress != nullptr) progress->files_failed.fetch_add(1);
      }
    };
    s_.committer.Submit(std::move(p));
  }

  bool Connected(const Transfer& t) const {
    curl_off_t connect_us = 0;
    curl_->easy_getinfo(t.easy.get(), CURLINFO_CONNECT_TIME_T, &connect_us);
    return connect_us > 0;
  }

  // A transfer that had connected and then timed out is a stall: the low-speed limit
  // ended it, there being no total timeout. Said in cubist's words, with
  // the rate it got, instead of libcurl's.
  std::string TooSlowError(const std::string& from, const Transfer& t) const {
    curl_off_t rate = 0;
    curl_->easy_getinfo(t.easy.get(), CURLINFO_SPEED_DOWNLOAD_T, &rate);
    return absl::StrCat(from, ": too slow (", static_cast<int64_t>(rate), " B/s for ",
                        absl::ToInt64Seconds(curl_options_.low_speed_time),
                        " s; the floor is ", curl_options_.low_speed_bytes,
                        " B/s): the source or the network is stalled");
  }

  // "from URL: HTTP 503", "from URL: HTTP 404 (not found)", "from URL: <curl's words>".
  static std::string HttpOrTransportError(const TransferFacts& f, const std::string& from,
                                          const Transfer& t, CURLcode rc) {
    if (f.result != TransportResult::kOk &&
        !(f.result == TransportResult::kRangeError && !f.is_file &&
          (f.http_status < 200 || f.http_status >= 300))) {
      return absl::StrCat(from, ": ", t.errbuf[0] != '\0' ? t.errbuf
                                                          : t.curl->easy_strerror(rc));
    }
    const bool not_found = f.http_status == 404 || f.http_status == 410;
    return absl::StrCat(from, ": HTTP ", f.http_status, not_found ? " (not found)" : "");
  }

  // Drops the temp file's bytes where the decision says so: emptied in place after a
  // range problem (the file stays open for the retry), removed and reopened empty after
  // a mismatch or an oversized answer. False when that failed and the job with it.
  bool DropBytes(Job* job, FetchEvent event, FetchAction action) {
    const bool restart = action == FetchAction::kRestartRetry ||
                         action == FetchAction::kRestartNow ||
                         (action == FetchAction::kDropNextSource &&
                          event == FetchEvent::kRangeRefused);
    if (restart) {
      job->resumed = false;
      if (absl::Status reset = job->partial.Reset(); !reset.ok()) {
        Fail(job, Annotate(reset, absl::StrCat("fetch ", A(job).path)));
        return false;
      }
      return true;
    }
    if (action == FetchAction::kDropNextSource) {
      DropTemp(job);
      return OpenPartial(job);  // the next source starts a fresh file
    }
    return true;
  }

  Shared& s_;
  Clock& clock_;
  RetryPolicy policy_;
  const CurlApi* curl_;
  CurlMulti multi_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> jitter_{0.0, 1.0};
  std::deque<Job*> waiting_;
  int active_ = 0;
  CurlOptions curl_options_;
};

// Pass one, on the caller's thread: what is already present needs no lock, no thread and
// no network (a warm start of an engine takes only this path: one lstat per artifact;
// Jobs, whose hashers cost an allocation each, exist only for the others). Returns the
// indices of the items still to fetch.
std::vector<size_t> TakeCached(const Store& store, const std::vector<FetchItem>& items,
                               FetchReport& report) {
  std::vector<size_t> todo;
  const Store::BatchProbe probe(store);
  for (size_t i = 0; i < items.size(); ++i) {
    const Artifact& a = items[i].artifact;
    ArtifactResult& r = report.results[i];
    r.path = a.path;
    r.sha256 = a.sha256;
    if (probe.Probe(a.sha256, a.size) == ObjectState::kPresent) {
      r.outcome = FetchOutcome::kCached;
    } else {
      todo.push_back(i);
    }
  }
  return todo;
}

void CountTodo(const std::vector<FetchItem>& items, const std::vector<size_t>& todo,
               FetchProgress& progress) {
  uint64_t bytes = 0;
  uint64_t unsized = 0;
  for (size_t i : todo) {
    bytes += items[i].artifact.size.value_or(0);
    unsized += !items[i].artifact.size.has_value();
  }
  progress.bytes_total = bytes;
  progress.files_unsized = unsized;
  progress.files_total = todo.size();
}

// Runs the workers over the items in `todo` and returns when every one is published or
// failed.
void FetchAll(const Store& store, const std::vector<FetchItem>& items,
              const std::vector<size_t>& todo, const FetchOptions& options,
              const CurlApi* curl, FetchProgress* progress, FetchReport& report) {
  std::vector<Job> jobs(todo.size());
  for (size_t k = 0; k < todo.size(); ++k) {
    jobs[k].item = &items[todo[k]];
    jobs[k].result = &report.results[todo[k]];
  }
  GroupCommitter committer(store, options.durable);
  int threads = options.threads > 0
                    ? options.threads
                    : static_cast<int>(std::min(4u, std::max(1u, std::thread::hardware_concurrency())));
  int jobs_total = std::max(1, options.jobs);
  threads = std::clamp(threads, 1, std::min<int>(jobs_total, static_cast<int>(todo.size())));
  Shared shared{store, options, jobs, {}, committer, progress,
                (jobs_total + threads - 1) / threads, curl};
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) {
    pool.emplace_back([&shared] { Worker(shared).Run(); });
  }
  for (auto& t : pool) t.join();
  // ~GroupCommitter publishes what is still queued before the caller reads the results.
}

// Counts the outcomes and states the report's status: the most serious failure's code,
// and the first failure's words.
void Summarize(size_t total, FetchReport& report) {
  absl::Status first_failure;
  absl::StatusCode worst = absl::StatusCode::kOk;
  for (const ArtifactResult& r : report.results) {
    report.bytes_received += r.bytes_received;
    switch (r.outcome) {
      case FetchOutcome::kCached: ++report.cached; break;
      case FetchOutcome::kDownloaded: ++report.downloaded; break;
      case FetchOutcome::kReused: ++report.reused; break;
      case FetchOutcome::kFailed:
        ++report.failed;
        if (first_failure.ok()) first_failure = r.status;
        if (Severity(r.status.code()) > Severity(worst) || worst == absl::StatusCode::kOk) {
          worst = r.status.code();
        }
        break;
    }
  }
  if (report.failed > 0) {
    report.status = absl::Status(
        worst, report.failed == 1
                   ? std::string(first_failure.message())
                   : absl::StrCat(report.failed, " of ", total,
                                  " artifacts failed; first: ", first_failure.message()));
  }
}

}  // namespace

FetchReport FetchArtifacts(const Store& store, const std::vector<FetchItem>& items,
                           const FetchOptions& options, FetchProgress* progress) {
  absl::Time start = absl::Now();
  FetchReport report;
  report.results.resize(items.size());
  const std::vector<size_t> todo = TakeCached(store, items, report);
  if (progress != nullptr) CountTodo(items, todo, *progress);
  // libcurl is loaded only now that something is to be transferred (curl_library.h),
  // and not at all --offline, where a missing artifact fails without a transfer.
  const CurlApi* curl = nullptr;
  absl::Status no_curl;
  if (!todo.empty() && !options.offline) {
    absl::StatusOr<const CurlApi*> loaded = LoadCurl();
    if (loaded.ok()) {
      curl = *loaded;
    } else {
      no_curl = loaded.status();
    }
  }
  if (!no_curl.ok()) {
    for (size_t i : todo) {
      ArtifactResult& r = report.results[i];
      r.outcome = FetchOutcome::kFailed;
      r.status = Annotate(no_curl, absl::StrCat("fetch ", items[i].artifact.path));
      if (progress != nullptr) progress->files_failed.fetch_add(1);
    }
  } else if (!todo.empty()) {
    FetchAll(store, items, todo, options, curl, progress, report);
  }
  Summarize(items.size(), report);
  report.elapsed = absl::Now() - start;
  return report;
}

}  // namespace cubist
