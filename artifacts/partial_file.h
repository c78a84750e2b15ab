// PartialFile: the temp file a download is written to before it is published, with the
// SHA-256 of what it holds so far. It owns the three things that must move together -
// the bytes on disk, the hasher that covers exactly them, and their count - so that a
// resume, a restart from byte 0 and a drop cannot leave one of them behind.
//
// Only the holder of the object's lock (store.h) opens an object's partial file: nobody
// else writes it, and a partial file a killed process left is this process's to resume.
#ifndef CUBIST_ARTIFACTS_PARTIAL_FILE_H_
#define CUBIST_ARTIFACTS_PARTIAL_FILE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "base/sha256.h"
#include "base/unique_fd.h"

namespace cubist {

class PartialFile {
 public:
  PartialFile() = default;
  PartialFile(PartialFile&&) noexcept = default;
  PartialFile& operator=(PartialFile&&) noexcept = default;
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;

  // Opens `path`, creating it. Bytes already there are kept and hashed again when they
  // are fewer than `complete_size` (any count when that is unknown): size() then says
  // where the transfer resumes. Otherwise the file is emptied. A symlink, directory or
  // FIFO at `path` is removed and replaced by a fresh file, never opened through.
  // Errors: ErrnoToStatus of the failed open, stat, truncate or seek.
  absl::Status Open(std::string path, std::optional<uint64_t> complete_size);

  // Writes `data` at the end and hashes it. Errors: ErrnoToStatus of the write.
  absl::Status Append(const char* data, size_t size);

  // Empties the file and restarts the hash; it stays open. Errors: ErrnoToStatus of the
  // truncate or seek (the file's state is then unknown: drop it).
  absl::Status Reset();

  // Closes and removes the file and forgets its bytes. Nothing when it is not open.
  void Discard();

  // Lowercase hex SHA-256 of the bytes written; once, when the file is complete.
  std::string FinishSha256();

  // Hands over the descriptor (to the group committer, which publishes the file); this
  // object is closed afterwards and Discard no longer removes the file.
  UniqueFd ReleaseFd();

  bool is_open() const { return fd_.valid(); }
  int fd() const { return fd_.get(); }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  // Hashes the first `existing` bytes of `fd` into hasher_; false (and hasher_ empty)
  // on a short read.
  bool Rehash(int fd, uint64_t existing);

  std::string path_;
  UniqueFd fd_;
  Sha256 hasher_;      // covers exactly the file's first size_ bytes
  uint64_t size_ = 0;
};

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_PARTIAL_FILE_H_
