// The subset of POSIX ustar that cubist bundles use, written and read as a stream.
//
// Writer: regular files only, deterministic headers (mode 0644, uid/gid 0, mtime 0, no
// user or group names), names up to 100 bytes or a '/'-split 155-byte prefix plus a
// 100-byte name, sizes below 8 GiB (11 octal digits). Whatever the caller writes is the
// order of the archive.
//
// Reader: a strict one for archives from outside. Each header must carry the ustar
// magic and a correct checksum; a member must be a regular file (type '0' or NUL) and
// its name must satisfy path_rules.h (no "..", no absolute path, no backslash, ...).
// Links, devices, FIFOs, directories, pax and GNU extension headers are refused with
// an error naming the member, before any of its data is read. The archive must end with
// the two zero blocks; running out of bytes anywhere before them is DataLoss
// ("truncated"). Errors: InvalidArgument (not a tar, refused member), DataLoss
// (truncated), and whatever the byte source returns.
//
// Neither class is thread-safe; each owns nothing but its buffer.
#ifndef CUBIST_ARTIFACTS_TAR_STREAM_H_
#define CUBIST_ARTIFACTS_TAR_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cubist {

inline constexpr size_t kTarBlock = 512;

// Appends bytes somewhere (a file descriptor, a string).
using ByteSink = std::function<absl::Status(std::string_view)>;
// Fills up to `size` bytes; returns how many (0 at the end of the input).
using ByteSource = std::function<absl::StatusOr<size_t>(char* buffer, size_t size)>;

class TarWriter {
 public:
  explicit TarWriter(ByteSink sink) : sink_(std::move(sink)) {}

  // A member header for a regular file of `size` bytes; follow it with exactly `size`
  // bytes of Data() calls, then EndMember() (which pads to the block).
  [[nodiscard]] absl::Status BeginMember(std::string_view name, uint64_t size);
  [[nodiscard]] absl::Status Data(std::string_view bytes);
  [[nodiscard]] absl::Status EndMember();
  // The end-of-archive marker (two zero blocks).
  [[nodiscard]] absl::Status Finish();

 private:
  ByteSink sink_;
  uint64_t remaining_ = 0;
  uint64_t member_size_ = 0;
};

struct TarMember {
  std::string name;
  uint64_t size = 0;
  uint64_t offset = 0;  // of its header in the archive, for messages
};

class TarReader {
 public:
  // `source_name` names the archive in messages; `max_member_size` caps a member.
  TarReader(ByteSource source, std::string source_name, uint64_t max_member_size);

  // The next member's header, or nullopt-like `false` in *more at the end-of-archive
  // marker. The previous member's data must have been read (or is skipped).
  [[nodiscard]] absl::Status Next(TarMember* member, bool* more);
  // Reads up to `size` bytes of the current member's data (0 when it is all read).
  [[nodiscard]] absl::StatusOr<size_t> Read(char* buffer, size_t size);

 private:
  absl::Status ReadExactly(char* buffer, size_t size, std::string_view what);
  absl::Status Skip(uint64_t size);

  ByteSource source_;
  std::string source_name_;
  uint64_t max_member_size_;
  uint64_t offset_ = 0;      // bytes consumed from the source
  uint64_t remaining_ = 0;   // of the current member's data
  uint64_t padding_ = 0;     // after the current member's data
  std::string current_;
};

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_TAR_STREAM_H_
