// Steps shared by the code that builds files in a private place and then publishes them
// with renames (bundle create and import, export, an OCI set's offline copy): the place
// removed on every failure path, whole writes, one flush for a whole tree, and copies
// that hash what they write.
#ifndef CUBIST_ARTIFACTS_STAGING_H_
#define CUBIST_ARTIFACTS_STAGING_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "artifacts/tar_stream.h"

namespace cubist {

// Removes a path (a file or a whole tree) when it goes out of scope, unless released.
class RemoveOnExit {
 public:
  explicit RemoveOnExit(std::string path) : path_(std::move(path)) {}
  ~RemoveOnExit();
  RemoveOnExit(RemoveOnExit&& other) noexcept;
  RemoveOnExit(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(const RemoveOnExit&) = delete;
  RemoveOnExit& operator=(RemoveOnExit&&) = delete;
  const std::string& path() const { return path_; }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

// Writes all of `bytes` to `fd`, retrying short writes. An error reads
// "<context>write <path>: <strerror>".
[[nodiscard]] absl::Status WriteAll(int fd, std::string_view bytes, std::string_view context,
                                    const std::string& path);

// One syncfs() for the filesystem that holds the directory `dir`: flushes every file
// written below it in one call (an fdatasync each costs seconds for thousands of
// files). An error reads "<context>: flush <dir>: <strerror>".
[[nodiscard]] absl::Status FlushFilesystemOf(const std::string& dir, std::string_view context);

// Reads from `fd` (not owned), retrying EINTR; an error reads "<what>: <strerror>".
ByteSource FdSource(int fd, std::string what);

// What CopyHashing wrote.
struct HashedCopy {
  std::string sha256;  // hex, of every byte written
  uint64_t bytes = 0;
};

// Copies everything `in` yields (until it returns 0) to `out`, through `buffer`, hashing
// the bytes. Write errors read as WriteAll's; read errors are `in`'s own.
[[nodiscard]] absl::StatusOr<HashedCopy> CopyHashing(const ByteSource& in, int out,
                                                     std::vector<char>& buffer,
                                                     std::string_view context,
                                                     const std::string& out_path);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_STAGING_H_
