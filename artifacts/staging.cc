#include "artifacts/staging.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"

namespace cubist {

RemoveOnExit::~RemoveOnExit() {
  if (!path_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
}

RemoveOnExit::RemoveOnExit(RemoveOnExit&& other) noexcept
    : path_(std::exchange(other.path_, {})) {}

absl::Status WriteAll(int fd, std::string_view bytes, std::string_view context,
                      const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat(Sv(context), "write ", path));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status FlushFilesystemOf(const std::string& dir, std::string_view context) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || ::syncfs(fd.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat(Sv(context), ": flush ", dir));
  }
  return absl::OkStatus();
}

ByteSource FdSource(int fd, std::string what) {
  return [fd, what = std::move(what)](char* buffer, size_t size) -> absl::StatusOr<size_t> {
    for (;;) {
      ssize_t n = ::read(fd, buffer, size);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoToStatus(errno, what);
      return static_cast<size_t>(n);
    }
  };
}

absl::StatusOr<HashedCopy> CopyHashing(const ByteSource& in, int out,
                                       std::vector<char>& buffer, std::string_view context,
                                       const std::string& out_path) {
  Sha256 hasher;
  HashedCopy copy;
  for (;;) {
    CUBIST_ASSIGN_OR_RETURN(size_t n, in(buffer.data(), buffer.size()));
    if (n == 0) break;
    hasher.Update(buffer.data(), n);
    copy.bytes += n;
    CUBIST_RETURN_IF_ERROR(
        WriteAll(out, std::string_view(buffer.data(), n), context, out_path));
  }
  copy.sha256 = ToHex(hasher.Finish());
  return copy;
}

}  // namespace cubist
