// Cross-process exclusive locks on files under the cache's locks/ directory.
//
// Lock files are removed by their holder on release, so they do not pile up. That is
// only safe with the re-check that Acquire does: after flock() succeeds it verifies that
// the path still names the inode it locked (a releaser may have unlinked it meanwhile),
// and retries otherwise. flock() locks are released by the kernel when the holder dies,
// so a process killed with SIGKILL never leaves a lock held.
#ifndef CUBIST_ARTIFACTS_FILE_LOCK_H_
#define CUBIST_ARTIFACTS_FILE_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"

namespace cubist {

// A held lock. Move-only; unlinks the lock file and unlocks on destruction.
class FileLock {
 public:
  FileLock() = default;
  FileLock(FileLock&&) noexcept = default;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() { Release(); }

  // Blocks until the lock is held or `timeout` passes (DeadlineExceeded naming the
  // path). Creates the lock file.
  [[nodiscard]] static absl::StatusOr<FileLock> Acquire(
      const std::string& path, absl::Duration timeout = absl::InfiniteDuration());
  // Returns the lock if it is free now, or a FileLock with held() == false if another
  // process holds it. Errors only for I/O failures.
  [[nodiscard]] static absl::StatusOr<FileLock> TryAcquire(const std::string& path);

  bool held() const { return fd_.valid(); }
  const std::string& path() const { return path_; }
  // Unlinks and unlocks; idempotent.
  void Release();

 private:
  FileLock(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  std::string path_;
  UniqueFd fd_;
};

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_FILE_LOCK_H_
