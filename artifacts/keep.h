// What `cubist gc` keeps: one scheme for every writer of the cache (docs/reliability.md,
// "What gc keeps"). Nothing that was verified and kept is lost without a command that
// names it (`cubist gc --drop NAME[@VERSION]`).
//
// Under the cache root:
//   layout                            "cubist.cache/2\n": the layout this file describes.
//                                     gc refuses a cache whose layout is newer than it
//                                     knows, rather than deleting what it cannot read.
//   gc.lock                           gc holds it exclusively while it collects; a
//                                     writer holds it shared only while it adds a root
//                                     (below). Never removed.
//   manifests/<name>@<digest>.json    kept manifests: one per name and manifest digest
//                                     (SHA-256 of its bytes), written by fetch and
//                                     bundle import once every object is present. Two
//                                     versions, or two pins of one name, never overwrite
//                                     each other. <name> is encoded as the version guard
//                                     encodes it (version_guard.h).
//   manifests/<name>.json             kept manifests of layout 1: still honoured.
//   manifests/pending/<random>.json   roots in use: a fetch or bundle import in flight,
//                                     a Runtime that loads lazily. Each holds the bytes
//                                     of its manifest and is flock()ed (shared) by the
//                                     process using it for as long as it does. A flock,
//                                     not a pid: containers share caches across PID
//                                     namespaces, and the kernel drops the lock of a
//                                     process that dies. gc keeps what a held root names
//                                     and removes one nobody holds.
//
// Ordering, which makes "gc during a fetch" safe: a root is created under the shared
// gc.lock and before the first object of its fetch lands; gc reads the roots under the
// exclusive gc.lock before it lists objects. So gc either sees the root or ran entirely
// before it existed (and then could not see the fetch's objects either).
#ifndef CUBIST_ARTIFACTS_KEEP_H_
#define CUBIST_ARTIFACTS_KEEP_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/unique_fd.h"

namespace cubist {

class Store;
struct Manifest;

inline constexpr int kCacheLayout = 2;

// Writes the layout file when it is missing (Store::Open with create). Best effort on a
// read-only cache: an error only when the file cannot be written to a writable one.
[[nodiscard]] absl::Status EnsureCacheLayout(const std::string& root);
// The layout a cache declares: 1 when there is no layout file (older cubist), the
// number in it otherwise; DataLoss when it does not parse.
[[nodiscard]] absl::StatusOr<int> ReadCacheLayout(const std::string& root);

// The kept manifest's file name: "<encoded name>@<digest>.json". `digest` is the
// manifest's (Sha256Hex of `bytes` when the manifest carries none).
std::string KeptManifestFileName(const Manifest& manifest, std::string_view bytes);

// gc.lock, shared or exclusive. Move-only; unlocks on destruction (the file stays).
class GcLock {
 public:
  GcLock() = default;
  // Waits up to `timeout` (DeadlineExceeded naming the file and the holder's likely
  // identity: a gc in progress).
  [[nodiscard]] static absl::StatusOr<GcLock> Acquire(const std::string& root, bool exclusive,
                                                      absl::Duration timeout);

 private:
  explicit GcLock(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

// A pending root (see above): the objects `bytes` names stay in the cache while this
// object lives. Move-only; removes its file on destruction.
class RootLease {
 public:
  RootLease() = default;
  RootLease(RootLease&&) noexcept = default;
  RootLease& operator=(RootLease&& other) noexcept;
  RootLease(const RootLease&) = delete;
  RootLease& operator=(const RootLease&) = delete;
  ~RootLease() { Release(); }

  // Writes manifests/pending/<random>.json holding `bytes` (a hard link to the kept copy
  // when there is one), flock()ed shared, under the shared gc.lock (waiting up to
  // `timeout` for a gc in progress). Errors name the file: ResourceExhausted on a full
  // disk, PermissionDenied on an unwritable cache.
  [[nodiscard]] static absl::StatusOr<RootLease> Take(
      const Store& store, const Manifest& manifest, std::string_view bytes,
      absl::Duration timeout = absl::Minutes(10));

  bool held() const { return fd_.valid(); }
  const std::string& path() const { return path_; }
  void Release();

 private:
  RootLease(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  std::string path_;
  UniqueFd fd_;
};

// Whether a pending root's file is held by a live process: tries an exclusive
// non-blocking flock through `fd` (held: false; free: true and the lock stays with fd).
bool LockIfAbandoned(int fd);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_KEEP_H_
