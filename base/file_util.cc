#include "base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/unique_fd.h"

namespace cubist {

absl::StatusOr<std::string> ReadFileToString(const std::string& path, uint64_t max_bytes) {
  // Non-blocking open: a FIFO at `path` must not wait for a writer forever.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  std::string out;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, absl::StrCat(path, ": stat"));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": is ",
        S_ISDIR(st.st_mode)    ? "a directory"
        : S_ISFIFO(st.st_mode) ? "a FIFO"
                               : "not a regular file",
        "; cubist reads manifests, signatures and keys only from regular files"));
  }
  if (static_cast<uint64_t>(st.st_size) <= max_bytes) {
    out.reserve(static_cast<size_t>(st.st_size));
  }
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat(path, ": read failed"));
    }
    if (n == 0) break;
    if (out.size() + static_cast<uint64_t>(n) > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": larger than the limit of ", max_bytes, " bytes; is this the right file?"));
    }
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

std::string DirName(std::string_view path) {
  size_t slash = path.rfind('/');
  if (slash == std::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

absl::Status SyncDir(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open directory ", path));
  if (::fsync(fd.get()) != 0 && errno != EINVAL) {
    return ErrnoToStatus(errno, absl::StrCat("fsync directory ", path));
  }
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path, mode_t mode) {
  if (path.empty()) return absl::OkStatus();
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": exists and is not a directory; move it away"));
  }
  std::string parent = DirName(path);
  if (parent != path && parent != "." && parent != "/") {
    absl::Status s = MakeDirs(parent, mode);
    if (!s.ok()) return s;
  }
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, absl::StrCat("create directory ", path));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view data,
                                 mode_t mode) {
  return WriteFileAtomically(path, std::initializer_list<std::string_view>{data}, mode);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<std::string_view> parts, mode_t mode) {
  std::string dir = DirName(path);
  std::random_device rd;
  std::string tmp = absl::StrCat(path, ".tmp.", ::getpid(), ".", rd());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("write ", path));
  auto fail = [&](int err, const char* what) {
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, absl::StrCat(what, " ", path));
  };
  for (std::string_view data : parts) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::write(fd.get(), data.data() + off, data.size() - off);
      if (n < 0) {
        if (errno == EINTR) continue;
        return fail(errno, "write");
      }
      off += static_cast<size_t>(n);
    }
  }
  if (::fchmod(fd.get(), mode) != 0) return fail(errno, "chmod");
  if (::fsync(fd.get()) != 0) return fail(errno, "fsync");
  fd.Reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(errno, "rename into");
  return SyncDir(dir);
}

namespace {

// Whether the file at `path` is a regular file holding exactly `data`. Compared through
// a buffer on the stack: a warm fetch asks this of a manifest of a few megabytes on
// every run, and a copy of it in memory would cost as much again as the comparison.
bool FileHolds(const std::string& path, std::string_view data) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) != data.size()) {
    return false;
  }
  char buf[1 << 16];
  size_t off = 0;
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return off == data.size();
    const size_t got = static_cast<size_t>(n);
    if (got > data.size() - off || std::memcmp(buf, data.data() + off, got) != 0) {
      return false;
    }
    off += got;
  }
}

}  // namespace

absl::Status WriteFileIfChanged(const std::string& path, std::string_view data, mode_t mode) {
  if (FileHolds(path, data)) return absl::OkStatus();
  return WriteFileAtomically(path, data, mode);
}

}  // namespace cubist
