// File helpers shared by every stage: whole-file reads with a size cap, atomic writes
// (temp file in the same directory, fsync, rename, fsync the directory: a file at its
// final path is always whole), directory creation and fsync.
#ifndef CUBIST_BASE_FILE_UTIL_H_
#define CUBIST_BASE_FILE_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cubist {

// Reads a whole regular file. A file larger than `max_bytes` is InvalidArgument (read
// stops at max_bytes + 1, so memory stays bounded). NotFound when it does not exist;
// InvalidArgument for a directory, FIFO or device (opened non-blocking, so a FIFO
// never hangs the reader).
[[nodiscard]] absl::StatusOr<std::string> ReadFileToString(
    const std::string& path, uint64_t max_bytes = uint64_t{1} << 30);

// Writes `data` to `path` atomically with permissions `mode`. On any failure the
// temporary file is removed and `path` is untouched.
[[nodiscard]] absl::Status WriteFileAtomically(const std::string& path,
                                               std::string_view data, mode_t mode = 0644);
// The same for a file made of `parts`, written one after another: for a large file
// whose pieces lie in different places, without joining them in memory first.
[[nodiscard]] absl::Status WriteFileAtomically(const std::string& path,
                                               std::initializer_list<std::string_view> parts,
                                               mode_t mode = 0644);

// As WriteFileAtomically, but a file at `path` that already holds exactly `data` is left
// alone: no write, no fsync. Warm fetches keep the same manifest again and again, and
// two flushes of a few megabytes cost more than the rest of such a fetch.
[[nodiscard]] absl::Status WriteFileIfChanged(const std::string& path, std::string_view data,
                                              mode_t mode = 0644);

// mkdir -p with `mode` for the directories it creates.
[[nodiscard]] absl::Status MakeDirs(const std::string& path, mode_t mode = 0755);

// fsync()s a directory so that renames and creations inside it are durable.
[[nodiscard]] absl::Status SyncDir(const std::string& path);

// The directory part of a '/'-separated path ("." when there is none).
std::string DirName(std::string_view path);

}  // namespace cubist

#endif  // CUBIST_BASE_FILE_UTIL_H_
