#include "artifacts/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <cerrno>
#include <thread>

#include "absl/strings/str_cat.h"

namespace cubist {
namespace {

// One attempt: open (creating) the lock file, flock it, and confirm that the path still
// names the locked inode. Returns an invalid fd when the lock is busy (non-blocking) or
// the file was swapped underneath (caller retries).
absl::StatusOr<UniqueFd> LockOnce(const std::string& path, bool blocking, bool* busy) {
  *busy = false;
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd.valid() && errno == ELOOP) {
    // A symlink planted at the lock's path: never follow it. Removing it is safe, since a
    // real lock file is never a link; the next attempt creates a plain file.
    ::unlink(path.c_str());
    return UniqueFd();
  }
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("lock ", path));
  int op = LOCK_EX | (blocking ? 0 : LOCK_NB);
  while (::flock(fd.get(), op) != 0) {
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) {
      *busy = true;
      return UniqueFd();
    }
    return ErrnoToStatus(errno, absl::StrCat("flock ", path));
  }
  struct stat held, now;
  if (::fstat(fd.get(), &held) != 0) return ErrnoToStatus(errno, absl::StrCat("fstat ", path));
  if (::stat(path.c_str(), &now) != 0 || now.st_ino != held.st_ino ||
      now.st_dev != held.st_dev) {
    return UniqueFd();  // the previous holder unlinked it; try again with a fresh file
  }
  return fd;
}

}  // namespace

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    fd_ = std::move(other.fd_);
  }
  return *this;
}

absl::StatusOr<FileLock> FileLock::Acquire(const std::string& path, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(1);
  for (;;) {
    bool busy = false;
    // With a deadline we poll; without one a blocking flock is the cheapest wait.
    bool blocking = timeout == absl::InfiniteDuration();
    auto fd = LockOnce(path, blocking, &busy);
    if (!fd.ok()) return fd.status();
    if (fd->valid()) return FileLock(path, *std::move(fd));
    if (busy && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "lock ", path, ": still held by another process after ",
          absl::FormatDuration(timeout), "; if no cubist process is running, delete it"));
    }
    if (busy) {
      std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
      backoff = std::min(backoff * 2, absl::Milliseconds(50));
    }
  }
}

absl::StatusOr<FileLock> FileLock::TryAcquire(const std::string& path) {
  for (;;) {
    bool busy = false;
    auto fd = LockOnce(path, /*blocking=*/false, &busy);
    if (!fd.ok()) return fd.status();
    if (fd->valid()) return FileLock(path, *std::move(fd));
    if (busy) return FileLock();
  }
}

void FileLock::Release() {
  if (!fd_.valid()) return;
  // Unlink while still holding the lock: anyone who opened the old inode will see the
  // inode mismatch in LockOnce and retry on a fresh file.
  ::unlink(path_.c_str());
  fd_.Reset();
}

}  // namespace cubist
