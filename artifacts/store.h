// The content-addressed store: the on-disk cache shared by every process on a node.
//
// Layout under the cache root:
//   objects/sha256/<first 2 hex>/<64 hex>   verified content only, read-only (0444)
//   tmp/<64 hex>.part                       the one partial download of an object
//   locks/<64 hex>.lock                     per-object cross-process lock (FileLock)
//   manifests/<name>.json                   manifests kept for `cubist gc`
//   state/                                  small records (rollback versions, tuning)
//
// Invariant: a file appears under objects/ only by rename() after its size and SHA-256
// matched, and its data was fsync()ed before the rename. So presence means verified,
// and readers never see a partial object (FlashInfer's readers saw files being
// overwritten, flashinfer#1852). `verify --deep` re-hashes to catch disk rot.
// The partial file of an object is written only by the holder of that object's lock,
// so its name can be fixed: a download killed mid-way is resumed by the next holder.
//
// Thread safety: a Store is immutable after Open and safe to share between threads.
#ifndef CUBIST_ARTIFACTS_STORE_H_
#define CUBIST_ARTIFACTS_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "artifacts/file_lock.h"
#include "base/unique_fd.h"

namespace cubist {

struct Manifest;

enum class ObjectState {
  kPresent,     // regular file of the expected size
  kMissing,     // no such object
  kWrongSize,   // present with another size: corrupt, must be removed
  kNotRegular,  // a symlink, directory or device planted at the object's path
};

class Store {
 public:
  // Opens the cache at `root`, creating its directories when `create` is true.
  // A missing cache with create == false is NotFound; an unwritable one with
  // create == true is PermissionDenied naming the directory and the fix.
  [[nodiscard]] static absl::StatusOr<Store> Open(const std::string& root,
                                                  bool create = true);

  const std::string& root() const { return root_; }
  std::string ObjectPath(std::string_view sha256) const;
  std::string TempPath(std::string_view sha256) const;
  std::string LockPath(std::string_view sha256) const;
  std::string ManifestsDir() const { return root_ + "/manifests"; }
  std::string StateDir() const { return root_ + "/state"; }

  // One lstat(): never reads or hashes. `size` absent accepts any size.
  ObjectState Probe(std::string_view sha256, std::optional<uint64_t> size,
                    uint64_t* actual_size = nullptr) const;

  // Probe for many objects in a row (a warm fetch of 13,000 artifacts): objects/sha256
  // is opened once and each object is one fstatat() relative to it, its name built on
  // the stack, which spares the kernel the walk down the cache root each time (a
  // quarter of the time of Probe, measured). Same answers as Probe. Not thread-safe.
  class BatchProbe {
   public:
    explicit BatchProbe(const Store& store);
    ObjectState Probe(std::string_view sha256, std::optional<uint64_t> size) const;

   private:
    const Store& store_;
    UniqueFd dir_;  // objects/sha256; invalid when it could not be opened (then Probe)
  };

  // Blocks until this process holds the object's lock (DeadlineExceeded after timeout).
  [[nodiscard]] absl::StatusOr<FileLock> LockObject(
      std::string_view sha256, absl::Duration timeout = absl::InfiniteDuration()) const;
  // The lock if free now; held() == false when another process holds it.
  [[nodiscard]] absl::StatusOr<FileLock> TryLockObject(std::string_view sha256) const;

  // Moves a verified, fsync()ed file at `temp_path` to the object's path (read-only),
  // creating the shard directory. Does not fsync the shard directory: callers batch
  // that with SyncObjectDir. The caller holds the object's lock.
  [[nodiscard]] absl::Status Publish(const std::string& temp_path,
                                     std::string_view sha256) const;
  [[nodiscard]] absl::Status SyncObjectDir(std::string_view sha256) const;

  // Adds an object from bytes already in memory (a manifest file that is also one of
  // its own artifacts, as a FlashInfer pin's checksums.txt is): DataLoss when the bytes
  // do not hash to `sha256`; a present object is left alone; otherwise written to a
  // temporary file, fsync()ed and published under the object's lock (waiting up to
  // `timeout` for a fetch that holds it).
  [[nodiscard]] absl::Status PutBytes(std::string_view sha256, std::string_view bytes,
                                      absl::Duration timeout = absl::Seconds(60)) const;

  // Removes an object (corrupt, or garbage). Missing is OK.
  [[nodiscard]] absl::Status Remove(std::string_view sha256) const;

  // Keeps a copy of a manifest's bytes under manifests/ so that `gc` knows which
  // objects are still wanted. Atomic; a copy that holds these bytes already is left
  // alone (no write, no flush).
  [[nodiscard]] absl::Status KeepManifest(const Manifest& manifest,
                                          std::string_view bytes) const;

  // Every object's hex name, by listing objects/ (for gc).
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListObjects() const;

 private:
  explicit Store(std::string root) : root_(std::move(root)) {}
  std::string root_;
};

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_STORE_H_
