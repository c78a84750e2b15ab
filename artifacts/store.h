// The content-addressed store: the on-disk cache shared by every process on a node.
//
// Layout under the cache root:
//   objects/sha256/<first 2 hex>/<64 hex>   verified content only, read-only (0444)
//   tmp/<64 hex>.part                       the one partial download of an object
//   locks/<64 hex>.lock                     per-object cross-process lock (FileLock)
//   manifests/<name>@<digest>.json          manifests kept for `cubist gc` (keep.h)
//   manifests/pending/<random>.json         roots of fetches, imports and Runtimes in use
//   state/                                  small records (rollback versions, tuning)
//   layout, gc.lock                         the layout version and gc's lock (keep.h)
//
// Invariant: a file appears under objects/ only by rename() after its size and SHA-256
// matched, and its data was fsync()ed before the rename. So presence means verified,
// and readers never see a partial object (FlashInfer's readers saw files being
// overwritten, flashinfer#1852). `verify --deep` re-hashes to catch disk rot.
//
// The publish record: Publish sets the object's mtime to a stamp made from its size
// (StampFor: 2000-01-01 plus one second per byte, no nanoseconds). Any write to the
// object, through any hard link (an exported tree written by root), or a truncation,
// sets its mtime to the present, so the stat that the warm path makes anyway tells an
// object unchanged since it was verified (kPresent) from one that changed, or that an
// older cubist published without a stamp (kUnconfirmed): that one is hashed (Confirm)
// before it is trusted, and stamped again when it still hashes to its name. A record
// in the inode costs no read, needs no record file per object, and travels with the
// object (cp -a, rsync -t). ctime cannot serve: link() and chmod() change it.
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
  // A regular file whose publish stamp (above) does not match: written or truncated
  // after it was verified, or published by an older cubist. Not to be trusted (or
  // removed) before Confirm hashes it.
  kUnconfirmed,
};

// The mtime Publish gives an object of `size` bytes (seconds since the epoch).
int64_t StampFor(uint64_t size);

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

  // One lstat(): never reads or hashes. `size` absent accepts any size; the publish
  // stamp checks the size recorded at publish either way.
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

  // Hashes an object that Probe called kUnconfirmed, through one open descriptor: OK
  // when it hashes to `sha256` (then stamped again, so that the next Probe says
  // kPresent; a stamp this user may not set is left, the object stays unconfirmed);
  // DataLoss naming the object, both hashes and the size when it does not; NotFound
  // when it is gone. `actual_size` receives the size read.
  [[nodiscard]] absl::Status Confirm(std::string_view sha256,
                                     uint64_t* actual_size = nullptr) const;

  // Probe, with an object it calls kUnconfirmed hashed (Confirm) first: kPresent when
  // it still hashes to its name. For commands that hand out or copy an object's bytes
  // (path, export, push, bundle). A Confirm that finds other bytes is its DataLoss; one
  // that finds the object gone is kMissing.
  [[nodiscard]] absl::StatusOr<ObjectState> ProbeConfirmed(
      std::string_view sha256, std::optional<uint64_t> size,
      uint64_t* actual_size = nullptr) const;

  // Removes an object (corrupt, or garbage). Missing is OK.
  [[nodiscard]] absl::Status Remove(std::string_view sha256) const;

  // Keeps a copy of a manifest's bytes as manifests/<name>@<digest>.json (keep.h) so
  // that `gc` knows which objects are still wanted; another version or pin of the same
  // name has its own copy. Atomic; a copy that exists already is left alone (one stat,
  // no write, no flush). Errors name the file: ResourceExhausted on a full disk.
  [[nodiscard]] absl::Status KeepManifest(const Manifest& manifest,
                                          std::string_view bytes) const;
  // Whether KeepManifest has kept these bytes already (one stat).
  bool IsKept(const Manifest& manifest, std::string_view bytes) const;

  // Every object's hex name, by listing objects/ (for gc).
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> ListObjects() const;

 private:
  explicit Store(std::string root) : root_(std::move(root)) {}
  std::string root_;
};

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_STORE_H_
