// Group commit for verified downloads: fsync data, rename into the store, fsync the
// object directories, release the object locks, in batches.
//
// Why: a per-file fdatasync costs about 3 ms on the disks we measured, so 1,000 small
// artifacts would spend 3 s flushing one by one. A batch flushed with one syncfs() costs
// about what the data's write-back costs. The durability contract is unchanged: no object
// is renamed into objects/ before its data is on disk, and no lock is released before
// the rename is durable, so a waiter that sees the object can trust it.
#ifndef CUBIST_ARTIFACTS_GROUP_COMMIT_H_
#define CUBIST_ARTIFACTS_GROUP_COMMIT_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "artifacts/file_lock.h"
#include "artifacts/store.h"
#include "base/unique_fd.h"

namespace cubist {

class GroupCommitter {
 public:
  struct Pending {
    std::string sha256;
    std::string temp_path;
    UniqueFd fd;    // the temp file, still open, for fdatasync
    FileLock lock;  // released after the rename is durable
    // Called on the committer's thread with the outcome of the publish.
    std::function<void(absl::Status)> done;
  };

  // `durable` false skips the flushes (benchmarks of the network path only).
  GroupCommitter(const Store& store, bool durable);
  // Commits everything submitted, then stops the thread.
  ~GroupCommitter();
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  void Submit(Pending pending);

 private:
  void Run();
  void Commit(std::vector<Pending>& batch);

  const Store& store_;
  const bool durable_;
  absl::Mutex mu_;
  std::vector<Pending> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_GROUP_COMMIT_H_
