#include "artifacts/keep.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "artifacts/store.h"
#include "artifacts/version_guard.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "manifest/manifest.h"

namespace cubist {
namespace {

constexpr char kLayoutPrefix[] = "cubist.cache/";

std::string LayoutPath(const std::string& root) { return root + "/layout"; }

// flock() with a deadline: polls a non-blocking lock, as FileLock::Acquire does.
absl::Status FlockWithin(int fd, int op, absl::Duration timeout, const std::string& path) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(1);
  for (;;) {
    if (::flock(fd, op | LOCK_NB) == 0) return absl::OkStatus();
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return ErrnoToStatus(errno, absl::StrCat("flock ", path));
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "lock ", path, ": held by another process (a 'cubist gc' in progress, or a fetch "
          "adding its root) after ", absl::FormatDuration(timeout), "; try again"));
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
    backoff = std::min(backoff * 2, absl::Milliseconds(50));
  }
}

std::string RandomHex() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x", rd(), rd());
}

}  // namespace

absl::Status EnsureCacheLayout(const std::string& root) {
  struct stat st;
  if (::stat(LayoutPath(root).c_str(), &st) == 0) return absl::OkStatus();
  return WriteFileAtomically(LayoutPath(root), absl::StrCat(kLayoutPrefix, kCacheLayout, "\n"),
                             0644);
}

absl::StatusOr<int> ReadCacheLayout(const std::string& root) {
  auto text = ReadFileToString(LayoutPath(root), 256);
  if (!text.ok() && absl::IsNotFound(text.status())) return 1;
  if (!text.ok()) return text.status();
  absl::string_view v = *text;
  int layout = 0;
  if (!absl::ConsumePrefix(&v, kLayoutPrefix) ||
      !absl::SimpleAtoi(absl::StripSuffix(v, "\n"), &layout) || layout < 1) {
    return absl::DataLossError(absl::StrCat(
        "cache ", root, ": ", LayoutPath(root), " does not say which layout the cache has (",
        kLayoutPrefix, "N); restore it, or write '", kLayoutPrefix, kCacheLayout,
        "' if only this cubist version uses the cache"));
  }
  return layout;
}

std::string KeptManifestFileName(const Manifest& manifest, std::string_view bytes) {
  const std::string digest = manifest.digest.empty() ? Sha256Hex(bytes) : manifest.digest;
  std::string name = VersionStateFileName(manifest.name);
  // With "@<64 hex>.json" the file name must stay within NAME_MAX (255): a long (or
  // much escaped) name is hashed. gc reads names from the files, never from their names.
  if (name.size() > 150) name = "sha256-" + Sha256Hex(manifest.name);
  return absl::StrCat(name, "@", digest, ".json");
}

absl::StatusOr<GcLock> GcLock::Acquire(const std::string& root, bool exclusive,
                                       absl::Duration timeout) {
  const std::string path = root + "/gc.lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd.valid() && errno == EACCES) {
    // A reader of a cache it may not write still orders itself against gc.
    fd = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  }
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
  CUBIST_RETURN_IF_ERROR(FlockWithin(fd.get(), exclusive ? LOCK_EX : LOCK_SH, timeout, path));
  return GcLock(std::move(fd));
}

RootLease& RootLease::operator=(RootLease&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    fd_ = std::move(other.fd_);
  }
  return *this;
}

void RootLease::Release() {
  if (!fd_.valid()) return;
  ::unlink(path_.c_str());
  fd_ = UniqueFd();
}

absl::StatusOr<RootLease> RootLease::Take(const Store& store, const Manifest& manifest,
                                          std::string_view bytes, absl::Duration timeout) {
  const std::string dir = store.ManifestsDir() + "/pending";
  CUBIST_RETURN_IF_ERROR(MakeDirs(dir));
  CUBIST_ASSIGN_OR_RETURN(GcLock gc, GcLock::Acquire(store.root(), /*exclusive=*/false, timeout));
  const std::string kept = absl::StrCat(store.ManifestsDir(), "/",
                                        KeptManifestFileName(manifest, bytes));
  for (int attempt = 0;; ++attempt) {
    const std::string path = absl::StrCat(dir, "/", RandomHex(), ".json");
    // A hard link to the kept copy costs nothing however large the manifest is.
    if (::link(kept.c_str(), path.c_str()) != 0) {
      if (errno == EEXIST && attempt < 8) continue;
      CUBIST_RETURN_IF_ERROR(WriteFileAtomically(path, bytes, 0444));
    }
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path));
    if (::flock(fd.get(), LOCK_SH) != 0) {
      absl::Status s = ErrnoToStatus(errno, absl::StrCat("flock ", path));
      ::unlink(path.c_str());
      return s;
    }
    return RootLease(path, std::move(fd));
  }
}

bool LockIfAbandoned(int fd) {
  for (;;) {
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return true;
    if (errno != EINTR) return false;
  }
}

}  // namespace cubist
