#include "artifacts/partial_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace cubist {
namespace {

// Opens `path` for the writer. Non-blocking, so that a FIFO planted there cannot stall
// the open (or later writes). A symlink, directory or FIFO where the partial file
// belongs is never used but replaced: only the lock holder writes here, so removing it
// races with nobody.
UniqueFd OpenRegular(const std::string& path) {
  UniqueFd fd(
      ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644));
  struct stat st;
  bool replace = !fd.valid() && (errno == ELOOP || errno == EISDIR);
  if (fd.valid() && ::fstat(fd.get(), &st) == 0 && !S_ISREG(st.st_mode)) replace = true;
  if (replace) {
    fd.Reset();
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    fd.Reset(::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  }
  return fd;
}

}  // namespace

absl::Status PartialFile::Open(std::string path, std::optional<uint64_t> complete_size) {
  path_ = std::move(path);
  UniqueFd fd = OpenRegular(path_);
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("open ", path_));
  struct stat st;
  if (::fcntl(fd.get(), F_SETFL, 0) != 0 || ::fstat(fd.get(), &st) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("stat ", path_));
  }
  hasher_.Finish();
  size_ = 0;
  const uint64_t existing = static_cast<uint64_t>(st.st_size);
  if (existing > 0 && (!complete_size.has_value() || existing < *complete_size) &&
      Rehash(fd.get(), existing)) {
    size_ = existing;
  }
  if (size_ == 0 && existing > 0 && ::ftruncate(fd.get(), 0) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("truncate ", path_));
  }
  if (::lseek(fd.get(), static_cast<off_t>(size_), SEEK_SET) < 0) {
    return ErrnoToStatus(errno, absl::StrCat("seek ", path_));
  }
  fd_ = std::move(fd);
  return absl::OkStatus();
}

bool PartialFile::Rehash(int fd, uint64_t existing) {
  std::vector<char> buf(1 << 20);
  uint64_t done = 0;
  while (done < existing) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(done));
    if (n <= 0) break;
    hasher_.Update(buf.data(), static_cast<size_t>(n));
    done += static_cast<uint64_t>(n);
  }
  if (done == existing) return true;
  hasher_.Finish();  // a short read: start from byte 0 instead
  return false;
}

absl::Status PartialFile::Append(const char* data, size_t size) {
  size_t off = 0;
  while (off < size) {
    ssize_t w = ::write(fd_.get(), data + off, size - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat("write ", path_));
    }
    off += static_cast<size_t>(w);
  }
  hasher_.Update(data, size);
  size_ += size;
  return absl::OkStatus();
}

absl::Status PartialFile::Reset() {
  hasher_.Finish();
  size_ = 0;
  if (::ftruncate(fd_.get(), 0) != 0 || ::lseek(fd_.get(), 0, SEEK_SET) < 0) {
    return ErrnoToStatus(errno, absl::StrCat("truncate ", path_));
  }
  return absl::OkStatus();
}

void PartialFile::Discard() {
  if (fd_.valid()) {
    fd_.Reset();
    ::unlink(path_.c_str());
  }
  hasher_.Finish();
  size_ = 0;
}

std::string PartialFile::FinishSha256() { return ToHex(hasher_.Finish()); }

UniqueFd PartialFile::ReleaseFd() {
  size_ = 0;
  return std::move(fd_);
}

}  // namespace cubist
