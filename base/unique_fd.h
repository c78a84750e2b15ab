// Move-only owner of a POSIX file descriptor, and errno -> absl::Status mapping.
#ifndef CUBIST_BASE_UNIQUE_FD_H_
#define CUBIST_BASE_UNIQUE_FD_H_

#include <unistd.h>

#include <string_view>
#include <utility>

#include "absl/status/status.h"

namespace cubist {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  bool valid() const { return fd_ >= 0; }
  int get() const { return fd_; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Maps an errno value to the absl code a caller should act on ("context: strerror").
// ENOENT -> NotFound, EACCES/EPERM/EROFS -> PermissionDenied, ENOSPC/EDQUOT ->
// ResourceExhausted, everything else -> Internal.
absl::Status ErrnoToStatus(int err, std::string_view context);

}  // namespace cubist

#endif  // CUBIST_BASE_UNIQUE_FD_H_
