#include "artifacts/group_commit.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"

namespace cubist {
namespace {

// Below this many files, flushing each one is cheaper than flushing the filesystem.
constexpr size_t kSyncfsThreshold = 4;

}  // namespace

GroupCommitter::GroupCommitter(const Store& store, bool durable)
    : store_(store), durable_(durable), thread_([this] { Run(); }) {}

GroupCommitter::~GroupCommitter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void GroupCommitter::Submit(Pending pending) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(pending));
}

void GroupCommitter::Run() {
  for (;;) {
    std::vector<Pending> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty() && stopping_) return;
      batch.swap(queue_);
    }
    Commit(batch);
  }
}

void GroupCommitter::Commit(std::vector<Pending>& batch) {
  std::vector<absl::Status> status(batch.size());
  if (durable_) {
    if (batch.size() >= kSyncfsThreshold) {
      if (::syncfs(batch.front().fd.get()) != 0) {
        absl::Status s = ErrnoToStatus(errno, "syncfs of the cache");
        for (auto& st : status) st = s;
      }
    } else {
      for (size_t i = 0; i < batch.size(); ++i) {
        if (::fdatasync(batch[i].fd.get()) != 0) {
          status[i] = ErrnoToStatus(errno, absl::StrCat("fsync ", batch[i].temp_path));
        }
      }
    }
  }
  std::set<std::string> dirs;
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].fd.Reset();
    if (status[i].ok()) status[i] = store_.Publish(batch[i].temp_path, batch[i].sha256);
    if (status[i].ok()) {
      dirs.insert(DirName(store_.ObjectPath(batch[i].sha256)));
    } else {
      ::unlink(batch[i].temp_path.c_str());
    }
  }
  if (durable_) {
    absl::Status dir_status;
    if (dirs.size() >= kSyncfsThreshold && !batch.empty()) {
      UniqueFd root(::open(store_.root().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!root.valid() || ::syncfs(root.get()) != 0) {
        dir_status = ErrnoToStatus(errno, "syncfs of the cache");
      }
    } else {
      for (const std::string& d : dirs) {
        absl::Status s = SyncDir(d);
        if (!s.ok()) dir_status = s;
      }
    }
    // A failed directory flush leaves the renamed file in place (it is whole and
    // verified); only its durability across a power loss is in doubt, so report it.
    if (!dir_status.ok()) {
      for (auto& st : status) {
        if (st.ok()) st = dir_status;
      }
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].lock.Release();
    if (batch[i].done) batch[i].done(status[i]);
  }
}

}  // namespace cubist
