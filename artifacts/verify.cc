#include "artifacts/verify.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/strings.h"
#include "base/unique_fd.h"

namespace cubist {

const char* VerifyStateName(VerifyState state) {
  switch (state) {
    case VerifyState::kOk: return "ok";
    case VerifyState::kMissing: return "missing";
    case VerifyState::kSizeMismatch: return "size-mismatch";
    case VerifyState::kHashMismatch: return "sha256-mismatch";
    case VerifyState::kNotRegular: return "not-a-file";
    case VerifyState::kUnreadable: return "unreadable";
  }
  return "?";
}

namespace {

// Hashes an object without following links; large reads keep the disk streaming.
absl::StatusOr<std::string> HashObject(const std::string& path, std::vector<char>& buf,
                                       uint64_t* size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  Sha256 h;
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    h.Update(buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
  }
  *size = total;
  return ToHex(h.Finish());
}

}  // namespace

bool ObjectHashesToName(const Store& store, std::string_view sha256, uint64_t* size) {
  std::vector<char> buf(1 << 20);
  auto got = HashObject(store.ObjectPath(sha256), buf, size);
  return got.ok() && *got == sha256;
}

absl::Status ManifestSizeWrong(std::string_view manifest, std::string_view path,
                               std::string_view sha256, uint64_t manifest_size,
                               uint64_t object_size) {
  return absl::DataLossError(absl::StrCat(
      Sv(path), ": the manifest ", Sv(manifest), " says ", manifest_size, " bytes, but the "
      "cached object sha256 ", Sv(sha256), " has ", object_size, " bytes and hashes to its name: the "
      "manifest entry is wrong, not the object (kept); fix the manifest or ask its publisher"));
}

namespace {

void CheckOne(const Store& store, const Artifact& a, const VerifyOptions& options,
              std::vector<char>& buf, VerifyEntry& e, std::atomic<uint64_t>& hashed) {
  e.path = a.path;
  e.expected_sha256 = a.sha256;
  e.expected_size = a.size;
  ObjectState st = store.Probe(a.sha256, a.size, &e.actual_size);
  switch (st) {
    case ObjectState::kMissing:
      e.state = VerifyState::kMissing;
      e.message = absl::StrCat(a.path, ": missing from the cache (sha256 ", a.sha256,
                               "); run 'cubist fetch'");
      return;
    case ObjectState::kNotRegular:
      e.state = VerifyState::kNotRegular;
      e.message = absl::StrCat(a.path, ": ", store.ObjectPath(a.sha256),
                               " is not a regular file (a planted link?); remove it and "
                               "run 'cubist fetch'");
      return;
    case ObjectState::kWrongSize: {
      e.state = VerifyState::kSizeMismatch;
      uint64_t size = 0;
      if (ObjectHashesToName(store, a.sha256, &size)) {
        hashed.fetch_add(size);
        e.actual_sha256 = a.sha256;
        e.message = std::string(
            ManifestSizeWrong(options.manifest, a.path, a.sha256, *a.size, size).message());
        return;  // the object is right: never removed
      }
      e.message = absl::StrCat(a.path, ": size mismatch: expected ", *a.size, " bytes, got ",
                               e.actual_size);
      break;
    }
    case ObjectState::kPresent:
      break;
  }
  if (e.state == VerifyState::kOk && options.deep) {
    uint64_t size = 0;
    auto got = HashObject(store.ObjectPath(a.sha256), buf, &size);
    if (!got.ok()) {
      e.state = VerifyState::kUnreadable;
      e.message = absl::StrCat(a.path, ": ", got.status().message());
      return;
    }
    hashed.fetch_add(size);
    e.actual_sha256 = *got;
    if (*got != a.sha256) {
      e.state = VerifyState::kHashMismatch;
      e.message = absl::StrCat(a.path, ": sha256 mismatch: expected ", a.sha256, ", got ",
                               *got, " (", size, " bytes)");
    }
  }
  if (e.state != VerifyState::kOk && options.deep && options.remove_corrupt) {
    // Under the lock, so that a concurrent fetch never sees a half-removed state.
    auto lock = store.LockObject(a.sha256, absl::Seconds(30));
    if (lock.ok() && store.Remove(a.sha256).ok()) {
      e.removed = true;
      absl::StrAppend(&e.message, "; removed from the cache, run 'cubist fetch' to repair");
    }
  }
}

}  // namespace

VerifyReport VerifyArtifacts(const Store& store, const std::vector<Artifact>& artifacts,
                             const VerifyOptions& options) {
  absl::Time start = absl::Now();
  VerifyReport report;
  report.entries.resize(artifacts.size());
  std::atomic<uint64_t> hashed{0};
  std::atomic<size_t> next{0};
  auto work = [&] {
    std::vector<char> buf(options.deep ? (1 << 20) : 0);
    for (size_t i; (i = next.fetch_add(1)) < artifacts.size();) {
      CheckOne(store, artifacts[i], options, buf, report.entries[i], hashed);
    }
  };
  int threads = 1;
  if (options.deep) {
    threads = options.threads > 0 ? options.threads
                                  : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::clamp<int>(threads, 1, std::max<size_t>(1, artifacts.size()));
  }
  if (threads == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  std::string first_corrupt, first_missing;
  for (const VerifyEntry& e : report.entries) {
    if (e.state == VerifyState::kOk) {
      ++report.ok;
    } else if (e.state == VerifyState::kMissing) {
      ++report.missing;
      if (first_missing.empty()) first_missing = e.message;
    } else {
      ++report.corrupt;
      if (first_corrupt.empty()) first_corrupt = e.message;
    }
  }
  report.bytes_hashed = hashed.load();
  if (report.corrupt > 0) {
    report.status = absl::DataLossError(absl::StrCat(
        report.corrupt, " of ", artifacts.size(), " artifacts corrupt; first: ", first_corrupt));
  } else if (report.missing > 0) {
    report.status = absl::NotFoundError(absl::StrCat(
        report.missing, " of ", artifacts.size(), " artifacts missing; first: ", first_missing));
  }
  report.elapsed = absl::Now() - start;
  return report;
}

}  // namespace cubist
