#include "artifacts/fetcher.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "artifacts/curl_handles.h"
#include "artifacts/curl_library.h"
#include "artifacts/curl_options.h"
#include "artifacts/curl_transport.h"
#include "artifacts/fetch_policy.h"
#include "artifacts/group_commit.h"
#include "artifacts/oci_manifest_source.h"
#include "artifacts/sources.h"
#include "artifacts/verify.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"

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
  UniqueFd fd;                // the temp file
  Sha256 hasher;              // state covers the first `offset` bytes of the temp file
  uint64_t offset = 0;
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
  int write_errno = 0;
  std::optional<uint64_t> content_range_start;
  std::optional<absl::Duration> retry_after;
  char errbuf[CURL_ERROR_SIZE] = {0};
  FetchProgress* progress = nullptr;
  CurlSlist headers;  // FetchOptions::authorization's header, when there is one
};

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

class Worker {
 public:
  explicit Worker(Shared& shared)
      : s_(shared),
        clock_(shared.options.clock != nullptr ? *shared.options.clock : Clock::Real()),
        curl_(shared.curl),
        rng_(std::random_device{}()) {
    policy_.attempts_per_source = s_.options.attempts_per_source;
    policy_.backoff_base = s_.options.backoff_base;
    policy_.backoff_max = s_.options.backoff_max;
    policy_.retry_after_max = s_.options.retry_after_max;
    if (curl_ != nullptr) {
      multi_.reset(curl_->multi_init());
      curl_->multi_setopt(multi_.get(), CURLMOPT_PIPELINING, CURLPIPE_MULTIPLEX);
    }
    curl_options_.max_redirects = s_.options.max_redirects;
    curl_options_.connect_timeout = s_.options.connect_timeout;
    curl_options_.low_speed_bytes = s_.options.low_speed_bytes;
    curl_options_.low_speed_time = s_.options.low_speed_time;
    curl_options_.ca = CaSettings::FromEnvironment();
  }

  void Run() {
    for (;;) {
      absl::Time now = clock_.Now();
      // Jobs waiting for a backoff or a lock whose time has come.
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
      if (active_ == 0 && waiting_.empty() && s_.next.load() >= s_.jobs.size()) return;

      // Without libcurl (--offline) no transfer was started: nothing to drive.
      if (curl_ != nullptr) DriveTransfers();
      int timeout_ms = 100;
      if (!waiting_.empty()) {
        absl::Time soonest = absl::InfiniteFuture();
        for (Job* j : waiting_) soonest = std::min(soonest, j->ready_at);
        timeout_ms = static_cast<int>(std::clamp<int64_t>(
            absl::ToInt64Milliseconds(soonest - clock_.Now()), 0, 100));
      }
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
    if (job->fd.valid()) {
      job->fd.Reset();
      ::unlink(s_.store.TempPath(A(job).sha256).c_str());
    }
    job->hasher.Finish();
    job->offset = 0;
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
    const Artifact& a = A(job);
    if (!job->lock.held()) {
      ObjectState state = s_.store.Probe(a.sha256, a.size);
      if (state == ObjectState::kPresent) {
        Finish(job, job->waited_for_lock ? FetchOutcome::kReused : FetchOutcome::kCached);
        return;
      }
      if (FailedOnManifestSize(job, state)) return;
      if (s_.options.offline) {
        Fail(job, absl::NotFoundError(absl::StrCat(
                      "fetch ", a.path, ": not in the cache, and --offline forbids the "
                      "network; fetch it where the network is reachable, or copy the "
                      "cache directory to this node")));
        return;
      }
      auto lock = s_.store.TryLockObject(a.sha256);
      if (!lock.ok()) {
        Fail(job, Annotate(lock.status(), absl::StrCat("fetch ", a.path)));
        return;
      }
      if (!lock->held()) {
        absl::Time now = clock_.Now();
        if (!job->waited_for_lock) {
          job->waited_for_lock = true;
          job->lock_wait_started = now;
        } else if (now - job->lock_wait_started > s_.options.lock_timeout) {
          Fail(job, absl::DeadlineExceededError(absl::StrCat(
                        "fetch ", a.path, ": another process has held ",
                        s_.store.LockPath(a.sha256), " for ",
                        absl::FormatDuration(s_.options.lock_timeout),
                        "; if no cubist process is running, delete that file")));
          return;
        }
        job->ready_at = now + job->lock_poll;
        job->lock_poll = std::min(job->lock_poll * 2, absl::Milliseconds(100));
        waiting_.push_back(job);
        return;
      }
      job->lock = *std::move(lock);
      // The second look: another process may have published while we took the lock.
      state = s_.store.Probe(a.sha256, a.size);
      if (state == ObjectState::kPresent) {
        Finish(job, job->waited_for_lock ? FetchOutcome::kReused : FetchOutcome::kCached);
        return;
      }
      if (FailedOnManifestSize(job, state)) return;
      if (state != ObjectState::kMissing) {
        // Wrong size or something planted there: never trust it, replace it.
        absl::Status rm = s_.store.Remove(a.sha256);
        if (!rm.ok()) {
          Fail(job, Annotate(rm, absl::StrCat("fetch ", a.path)));
          return;
        }
      }
      absl::Status opened = OpenTemp(job);
      if (!opened.ok()) {
        Fail(job, Annotate(opened, absl::StrCat("fetch ", a.path)));
        return;
      }
    }
    StartTransfer(job);
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

  // Opens the object's temp file. A partial file left by a killed process is resumed:
  // its bytes are hashed again (the new hasher must cover them) and the transfer asks
  // for the rest. Only the lock holder gets here, so nobody else writes this file.
  absl::Status OpenTemp(Job* job) {
    const Artifact& a = A(job);
    std::string path = s_.store.TempPath(a.sha256);
    // Non-blocking, so that a FIFO planted there cannot stall the open (or later writes).
    UniqueFd fd(
        ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644));
    struct stat st;
    bool replace = !fd.valid() && (errno == ELOOP || errno == EISDIR);
    if (fd.valid() && ::fstat(fd.get(), &st) == 0 && !S_ISREG(st.st_mode)) replace = true;
    if (replace) {
      // A symlink, directory or FIFO where our partial file belongs: never use it,
      // replace it. Only the lock holder writes here, so removing it races with nobody.
      fd.Reset();
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
      fd.Reset(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
    }
    if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
    if (::fcntl(fd.get(), F_SETFL, 0) != 0 || ::fstat(fd.get(), &st) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("stat ", path));
    }
    uint64_t existing = static_cast<uint64_t>(st.st_size);
    job->hasher.Finish();
    job->offset = 0;
    if (existing > 0 && (!a.size.has_value() || existing < *a.size)) {
      std::vector<char> buf(1 << 20);
      uint64_t done = 0;
      while (done < existing) {
        ssize_t n = ::pread(fd.get(), buf.data(), buf.size(), static_cast<off_t>(done));
        if (n <= 0) break;
        job->hasher.Update(buf.data(), static_cast<size_t>(n));
        done += static_cast<uint64_t>(n);
      }
      if (done == existing) {
        job->offset = existing;
        job->resumed = true;
      } else {
        job->hasher.Finish();
      }
    }
    if (job->offset == 0 && existing > 0 && ::ftruncate(fd.get(), 0) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("truncate ", path));
    }
    if (::lseek(fd.get(), static_cast<off_t>(job->offset), SEEK_SET) < 0) {
      return ErrnoToStatus(errno, absl::StrCat("seek ", path));
    }
    job->fd = std::move(fd);
    return absl::OkStatus();
  }

  void Restart(Job* job) {
    job->hasher.Finish();
    job->offset = 0;
    job->resumed = false;
    if (::ftruncate(job->fd.get(), 0) != 0 || ::lseek(job->fd.get(), 0, SEEK_SET) < 0) {
      Fail(job, ErrnoToStatus(errno, absl::StrCat("fetch ", A(job).path, ": truncate")));
    }
  }

  static size_t OnHeader(char* data, size_t size, size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    std::string_view line(data, size * n);
    if (absl::StartsWith(Sv(line), "HTTP/")) {
      t->content_range_start.reset();
      t->retry_after.reset();
    } else if (absl::StartsWithIgnoreCase(Sv(line), "content-range:")) {
      // "Content-Range: bytes 100-199/200"
      std::string_view v = line.substr(14);
      size_t b = v.find("bytes");
      if (b != std::string_view::npos) {
        v = v.substr(b + 5);
        absl::string_view start = absl::StripAsciiWhitespace(Sv(v.substr(0, v.find('-'))));
        uint64_t x;
        if (absl::SimpleAtoi(start, &x)) t->content_range_start = x;
      }
    } else if (absl::StartsWithIgnoreCase(Sv(line), "retry-after:")) {
      int64_t secs;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(Sv(line.substr(12))), &secs) &&
          secs >= 0) {
        t->retry_after = absl::Seconds(secs);
      }
    }
    return size * n;
  }

  // Decides, at the first body byte (or at the end for an empty body), what the
  // response is: an error page to discard, a range answer to check, or data.
  static bool CheckStatus(Transfer* t) {
    if (t->status_checked) return true;
    t->status_checked = true;
    long code = 0;
    t->curl->easy_getinfo(t->easy.get(), CURLINFO_RESPONSE_CODE, &code);
    bool is_file = absl::StartsWithIgnoreCase(Sv(t->url), "file://");
    if (!is_file && (code < 200 || code >= 300)) {
      t->discard = true;
      return true;
    }
    Job* job = t->job;
    if (job->offset > 0 && !is_file) {
      if (code == 200) {
        // The server ignored Range and sends the whole file: start over.
        t->range_ignored = true;
        job->hasher.Finish();
        job->offset = 0;
        t->start_offset = 0;
        if (::ftruncate(job->fd.get(), 0) != 0 || ::lseek(job->fd.get(), 0, SEEK_SET) < 0) {
          t->write_errno = errno;
          return false;
        }
      } else if (code == 206 && t->content_range_start != job->offset) {
        t->bad_range = true;  // answered a range we did not ask for
        return false;
      }
    }
    return true;
  }

  static size_t OnWrite(char* data, size_t size, size_t n, void* user) {
    auto* t = static_cast<Transfer*>(user);
    size_t len = size * n;
    if (!CheckStatus(t)) return 0;
    if (t->discard) return len;
    Job* job = t->job;
    if (job->offset + t->received + len > t->limit) {
      t->oversize = true;  // stop at the declared size + 1 byte: never store more
      return 0;
    }
    size_t off = 0;
    while (off < len) {
      ssize_t w = ::write(job->fd.get(), data + off, len - off);
      if (w < 0) {
        if (errno == EINTR) continue;
        t->write_errno = errno;
        return 0;
      }
      off += static_cast<size_t>(w);
    }
    job->hasher.Update(data, len);
    t->received += len;
    if (t->progress != nullptr) t->progress->bytes_received.fetch_add(len);
    return len;
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
    t->start_offset = job->offset;
    t->progress = s_.progress;
    const Artifact& a = A(job);
    t->limit = a.size.has_value() ? *a.size : s_.options.max_unknown_size;
    t->curl = curl_;
    t->easy.reset(curl_->easy_init());
    CURL* e = t->easy.get();
    curl_->easy_setopt(e, CURLOPT_URL, t->url.c_str());
    curl_->easy_setopt(e, CURLOPT_PRIVATE, t.get());
    curl_->easy_setopt(e, CURLOPT_WRITEFUNCTION, &Worker::OnWrite);
    curl_->easy_setopt(e, CURLOPT_WRITEDATA, t.get());
    curl_->easy_setopt(e, CURLOPT_HEADERFUNCTION, &Worker::OnHeader);
    curl_->easy_setopt(e, CURLOPT_HEADERDATA, t.get());
    curl_->easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
    ApplyCurlOptions(*curl_, e, curl_options_);
    curl_->easy_setopt(e, CURLOPT_BUFFERSIZE, 256L * 1024L);
    if (s_.options.authorization) {
      std::string header = s_.options.authorization(t->url);
      if (!header.empty()) {
        t->headers.reset(curl_->slist_append(nullptr, header.c_str()));
        curl_->easy_setopt(e, CURLOPT_HTTPHEADER, t->headers.get());
      }
    }
    if (job->offset > 0) {
      curl_->easy_setopt(e, CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(job->offset));
    }
    job->result->attempts++;
    if (curl_->multi_add_handle(multi_.get(), e) != CURLM_OK) {
      Fail(job, absl::InternalError(absl::StrCat("fetch ", a.path, ": curl_multi_add_handle")));
      return;
    }
    ++active_;
    t.release();  // owned by the multi handle until CURLMSG_DONE
  }

  // A transfer ended: classify it, verify a complete body, ask the policy, act.
  void OnDone(Transfer& t, CURLcode rc) {
    Job* job = t.job;
    const Artifact& a = A(job);
    job->result->bytes_received += t.received;
    if (rc == CURLE_OK || t.received > 0) CheckStatus(&t);
    TransferFacts facts;
    facts.result = TransportResultOf(rc);
    facts.is_file = absl::StartsWithIgnoreCase(Sv(t.url), "file://");
    curl_->easy_getinfo(t.easy.get(), CURLINFO_RESPONSE_CODE, &facts.http_status);
    facts.oversize = t.oversize;
    facts.bad_range = t.bad_range;
    const std::string from = absl::StrCat("from ", t.url);

    if (t.write_errno != 0) {  // our disk, not the source: no other source helps
      Fail(job, ErrnoToStatus(t.write_errno,
                              absl::StrCat("fetch ", a.path, ": write ",
                                           s_.store.TempPath(a.sha256))));
      return;
    }
    if (!t.oversize && !t.bad_range) {
      job->offset += t.received;
      if (t.received > 0 && t.start_offset > 0) job->resumed = true;
    }
    FetchEvent event = ClassifyTransfer(facts);
    std::string error;
    uint64_t total = job->offset;
    std::string got;
    switch (event) {
      case FetchEvent::kBodyComplete:
        if (a.size.has_value() && total != *a.size) {
          event = FetchEvent::kSizeMismatch;
          error = absl::StrCat(from, ": size mismatch: expected ", *a.size, " bytes, got ",
                               total, "; the source serves a different file, try --mirror "
                               "or report it");
          break;
        }
        got = ToHex(job->hasher.Finish());
        if (got != a.sha256) {
          event = FetchEvent::kHashMismatch;
          error = absl::StrCat(from, ": sha256 mismatch: expected ", a.sha256, ", got ", got,
                               " (", total, " bytes); the mirror serves a different file, "
                               "try --mirror or report it");
          break;
        }
        event = FetchEvent::kVerified;
        break;
      case FetchEvent::kOversize:
        error = absl::StrCat(from, ": the server sent more than the declared ", t.limit,
                             " bytes; stopped there; the source serves a different file, "
                             "try --mirror or report it");
        break;
      case FetchEvent::kRangeRefused:
        error = t.bad_range
                    ? absl::StrCat(from, ": answered a different byte range than requested")
                    : HttpOrTransportError(facts, from, t, rc);
        break;
      case FetchEvent::kUntrusted:
        error = absl::StrCat(HttpOrTransportError(facts, from, t, rc), ": ", kUntrustedServerFix);
        break;
      default:
        error = rc == CURLE_OPERATION_TIMEDOUT && Connected(t)
                    ? TooSlowError(from, t)
                    : HttpOrTransportError(facts, from, t, rc);
        break;
    }
    if (event != FetchEvent::kVerified) {
      AttemptState state{job->attempts_here, job->resumed, job->restarted};
      const FetchDecision d = Decide(event, state, policy_, t.retry_after, jitter_(rng_));
      if (!DropBytes(job, event, d.action)) return;  // the job failed on our disk
      Apply(job, d, error);
      return;
    }
    // Verified: hand over to the group committer, which publishes and unlocks. Start
    // the write-back now (without waiting) so that the committer's flush finds most of
    // the data already on its way to the disk.
    if (s_.options.durable) {
      ::sync_file_range(job->fd.get(), 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    job->result->url = t.url;
    GroupCommitter::Pending p;
    p.sha256 = a.sha256;
    p.temp_path = s_.store.TempPath(a.sha256);
    p.fd = std::move(job->fd);
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

  // Drops the temp file's bytes where the decision says so: truncated in place after a
  // range problem (the file stays open for the retry), removed and reopened empty after
  // a mismatch or an oversized answer. False when that failed and the job with it.
  bool DropBytes(Job* job, FetchEvent event, FetchAction action) {
    const bool restart = action == FetchAction::kRestartRetry ||
                         action == FetchAction::kRestartNow ||
                         (action == FetchAction::kDropNextSource &&
                          event == FetchEvent::kRangeRefused);
    if (restart) {
      Restart(job);
      return job->lock.held();
    }
    if (action == FetchAction::kDropNextSource) {
      DropTemp(job);
      job->fd = UniqueFd();
      return ReopenAfterDrop(job);
    }
    return true;
  }

  // After a mismatch the temp file is gone; the next source starts a fresh one.
  // False (and the job failed) when the file cannot be opened again.
  bool ReopenAfterDrop(Job* job) {
    absl::Status s = OpenTemp(job);
    if (!s.ok()) {
      Fail(job, Annotate(s, absl::StrCat("fetch ", A(job).path)));
      return false;
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

}  // namespace

FetchReport FetchArtifacts(const Store& store, const std::vector<FetchItem>& items,
                           const FetchOptions& options, FetchProgress* progress) {
  absl::Time start = absl::Now();
  FetchReport report;
  report.results.resize(items.size());
  std::vector<size_t> todo;
  const Store::BatchProbe probe(store);
  // Pass one, on this thread: what is already present needs no lock, no thread and no
  // network (a warm start of an engine takes only this path: one lstat per artifact;
  // Jobs, whose hashers cost an allocation each, exist only for the others).
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
  if (progress != nullptr) {
    uint64_t bytes = 0;
    uint64_t unsized = 0;
    for (size_t i : todo) {
      bytes += items[i].artifact.size.value_or(0);
      unsized += !items[i].artifact.size.has_value();
    }
    progress->bytes_total = bytes;
    progress->files_unsized = unsized;
    progress->files_total = todo.size();
  }
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
    // ~GroupCommitter publishes what is still queued before we read the results.
  }
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
                   : absl::StrCat(report.failed, " of ", items.size(),
                                  " artifacts failed; first: ", first_failure.message()));
  }
  report.elapsed = absl::Now() - start;
  return report;
}

}  // namespace cubist
