#include "artifacts/file_lock.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

TEST(FileLockTest, SecondHolderWaitsAndTheFileIsRemovedOnRelease) {
  testing::TempDir tmp;
  std::string path = tmp.Join("x.lock");
  auto a = FileLock::Acquire(path);
  ASSERT_TRUE(a.ok() && a->held());
  auto busy = FileLock::TryAcquire(path);
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE(busy->held());
  EXPECT_THAT(FileLock::Acquire(path, absl::Milliseconds(50)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("still held by another process")));
  a->Release();
  EXPECT_FALSE(testing::FileExists(path)) << "lock files must not pile up";
  auto b = FileLock::TryAcquire(path);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->held());
}

TEST(FileLockTest, ExclusiveUnderContentionDespiteUnlinking) {
  // Many threads take and release the same lock (each release unlinks the file); the
  // inode re-check must keep it exclusive.
  testing::TempDir tmp;
  std::string path = tmp.Join("c.lock");
  std::atomic<int> inside{0};
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto l = FileLock::Acquire(path);
        ASSERT_TRUE(l.ok());
        if (inside.fetch_add(1) != 0) violations++;
        inside.fetch_sub(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(violations.load(), 0);
}

TEST(FileLockTest, AHolderKilledWithSigkillReleasesTheLock) {
  testing::TempDir tmp;
  std::string path = tmp.Join("k.lock");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    auto l = FileLock::Acquire(path);
    char c = l.ok() ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  auto busy = FileLock::TryAcquire(path);
  ASSERT_TRUE(busy.ok());
  EXPECT_FALSE(busy->held());
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  auto mine = FileLock::Acquire(path, absl::Seconds(5));
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_TRUE(mine->held());
}

}  // namespace
}  // namespace cubist
