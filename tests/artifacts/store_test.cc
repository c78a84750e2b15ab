#include "artifacts/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "artifacts/keep.h"
#include "base/sha256.h"
#include "manifest/manifest.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

TEST(StoreTest, OpenCreatesTheLayout) {
  testing::TempDir tmp;
  auto store = Store::Open(tmp.Join("c"));
  ASSERT_TRUE(store.ok()) << store.status();
  for (const char* d : {"objects/sha256", "tmp", "locks", "manifests", "state"}) {
    EXPECT_TRUE(std::filesystem::is_directory(tmp.Join(std::string("c/") + d))) << d;
  }
  std::string sha = Sha256Hex("x");
  EXPECT_EQ(store->ObjectPath(sha), tmp.Join("c/objects/sha256/" + sha.substr(0, 2) + "/" + sha));
  EXPECT_EQ(store->TempPath(sha), tmp.Join("c/tmp/" + sha + ".part"));
}

TEST(StoreTest, OpenWithoutCreateReportsAMissingCache) {
  testing::TempDir tmp;
  EXPECT_THAT(Store::Open(tmp.Join("none"), false),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("run 'cubist fetch' first")));
}

TEST(StoreTest, OpenUnderAFileNamesTheFix) {
  testing::TempDir tmp;
  testing::WriteFileOrDie(tmp.Join("file"), "x");
  EXPECT_THAT(Store::Open(tmp.Join("file/cache")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("choose a writable directory with --cache or CUBIST_CACHE_DIR")));
}

TEST(StoreTest, UnwritableCacheIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root can write anywhere";
  testing::TempDir tmp;
  ASSERT_TRUE(Store::Open(tmp.Join("c")).ok());
  ::chmod(tmp.Join("c/tmp").c_str(), 0555);
  EXPECT_THAT(Store::Open(tmp.Join("c")),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("not writable")));
  ::chmod(tmp.Join("c/tmp").c_str(), 0755);
}

TEST(StoreTest, ProbeNeverFollowsLinksAndChecksSize) {
  testing::TempDir tmp;
  auto store = Store::Open(tmp.Join("c"));
  ASSERT_TRUE(store.ok());
  std::string data = "hello";
  std::string sha = Sha256Hex(data);
  EXPECT_EQ(store->Probe(sha, 5), ObjectState::kMissing);
  testing::WriteFileOrDie(store->TempPath(sha), data);
  ASSERT_TRUE(store->Publish(store->TempPath(sha), sha).ok());
  EXPECT_EQ(store->Probe(sha, 5), ObjectState::kPresent);
  EXPECT_EQ(store->Probe(sha, std::nullopt), ObjectState::kPresent);
  EXPECT_EQ(store->Probe(sha, 6), ObjectState::kWrongSize);
  struct stat st;
  ASSERT_EQ(::stat(store->ObjectPath(sha).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
  EXPECT_FALSE(testing::FileExists(store->TempPath(sha)));

  std::string other = Sha256Hex("other");
  std::filesystem::create_directories(std::filesystem::path(store->ObjectPath(other)).parent_path());
  std::filesystem::create_symlink(store->ObjectPath(sha), store->ObjectPath(other));
  EXPECT_EQ(store->Probe(other, 5), ObjectState::kNotRegular);
  ASSERT_TRUE(store->Remove(other).ok());
  EXPECT_EQ(store->Probe(other, 5), ObjectState::kMissing);
  EXPECT_TRUE(store->Remove(other).ok()) << "removing a missing object is fine";
}

// The publish record (store.h): Publish stamps the mtime from the size; a write breaks
// it (kUnconfirmed); Confirm hashes, keeps and restamps a right object and refuses a
// changed one without removing it.
TEST(StoreTest, PublishStampsAndConfirmHashesWhatChangedSince) {
  testing::TempDir tmp;
  auto store = Store::Open(tmp.Join("c"));
  ASSERT_TRUE(store.ok());
  const std::string data = "hello, stamp";
  const std::string sha = Sha256Hex(data);
  testing::WriteFileOrDie(store->TempPath(sha), data);
  ASSERT_TRUE(store->Publish(store->TempPath(sha), sha).ok());
  struct stat st;
  ASSERT_EQ(::stat(store->ObjectPath(sha).c_str(), &st), 0);
  EXPECT_EQ(st.st_mtim.tv_sec, StampFor(data.size()));
  EXPECT_EQ(st.st_mtim.tv_nsec, 0);
  EXPECT_EQ(store->Probe(sha, std::nullopt), ObjectState::kPresent);

  // Touched (as an older cubist's objects are): unconfirmed, then confirmed and stamped.
  ASSERT_EQ(::utimensat(AT_FDCWD, store->ObjectPath(sha).c_str(), nullptr, 0), 0);
  EXPECT_EQ(store->Probe(sha, std::nullopt), ObjectState::kUnconfirmed);
  uint64_t size = 0;
  CUBIST_ASSERT_OK(store->Confirm(sha, &size));
  EXPECT_EQ(size, data.size());
  EXPECT_EQ(store->Probe(sha, data.size()), ObjectState::kPresent);

  // Written in place, same size: unconfirmed; Confirm says DataLoss and leaves it.
  ASSERT_EQ(::chmod(store->ObjectPath(sha).c_str(), 0644), 0);
  const std::string changed = "HELLO, stamp";
  testing::WriteFileOrDie(store->ObjectPath(sha), changed);
  EXPECT_EQ(store->Probe(sha, data.size()), ObjectState::kUnconfirmed);
  EXPECT_THAT(store->Confirm(sha),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("changed after it was verified (its publish stamp "
                                              "no longer matches): sha256 ", Sha256Hex(changed)))));
  EXPECT_EQ(store->Probe(sha, data.size()), ObjectState::kUnconfirmed);
}

// Kept manifests are keyed by name and digest, inside manifests/, whatever the name.
TEST(StoreTest, KeptManifestsOfOneNameAndTwoDigestsAreTwoFiles) {
  testing::TempDir tmp;
  auto store = Store::Open(tmp.Join("c"));
  ASSERT_TRUE(store.ok());
  for (const std::string& name : {std::string("bmm"), std::string("../a/b"),
                                  std::string(199, '%'), std::string(300, 'n')}) {
    Manifest m;
    m.name = name;
    for (const std::string bytes : {"first pin", "second pin"}) {
      m.digest = Sha256Hex(bytes);
      EXPECT_FALSE(store->IsKept(m, bytes));
      CUBIST_ASSERT_OK(store->KeepManifest(m, bytes));
      EXPECT_TRUE(store->IsKept(m, bytes));
      const std::string file = KeptManifestFileName(m, bytes);
      EXPECT_EQ(file.find('/'), std::string::npos) << file;
      EXPECT_LE(file.size(), 255u);
      EXPECT_EQ(testing::ReadFileOrDie(store->ManifestsDir() + "/" + file), bytes);
    }
  }
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(store->ManifestsDir())) {
    files += e.is_regular_file();
  }
  EXPECT_EQ(files, 8u);
}

TEST(StoreTest, PublishRefusesADirectoryPlantedAtTheObjectPath) {
  testing::TempDir tmp;
  auto store = Store::Open(tmp.Join("c"));
  ASSERT_TRUE(store.ok());
  std::string sha = Sha256Hex("d");
  std::filesystem::create_directories(store->ObjectPath(sha));
  testing::WriteFileOrDie(store->TempPath(sha), "d");
  EXPECT_THAT(store->Publish(store->TempPath(sha), sha),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("a directory stands where")));
}

TEST(StoreTest, PutBytesVerifiesPublishesReadOnlyAndLeavesAPresentObjectAlone) {
  testing::TempDir tmp;
  auto store = Store::Open(tmp.Join("c"));
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string sha = Sha256Hex("checksums");
  EXPECT_THAT(store->PutBytes(sha, "checksumz"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("object ", sha, ": 9 bytes in memory hash to ",
                                              Sha256Hex("checksumz")))));
  EXPECT_FALSE(testing::FileExists(store->ObjectPath(sha)));

  ASSERT_TRUE(store->PutBytes(sha, "checksums").ok());
  EXPECT_EQ(testing::ReadFileOrDie(store->ObjectPath(sha)), "checksums");
  struct stat st;
  ASSERT_EQ(::stat(store->ObjectPath(sha).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
  EXPECT_FALSE(testing::FileExists(store->TempPath(sha)));
  const auto inode = st.st_ino;
  ASSERT_TRUE(store->PutBytes(sha, "checksums").ok());  // present: not rewritten
  ASSERT_EQ(::stat(store->ObjectPath(sha).c_str(), &st), 0);
  EXPECT_EQ(st.st_ino, inode);
}

TEST(StoreTest, ListObjectsFindsEveryShard) {
  testing::TempDir tmp;
  auto store = Store::Open(tmp.Join("c"));
  ASSERT_TRUE(store.ok());
  for (const char* s : {"a", "b", "c"}) {
    std::string sha = Sha256Hex(s);
    testing::WriteFileOrDie(store->TempPath(sha), s);
    ASSERT_TRUE(store->Publish(store->TempPath(sha), sha).ok());
  }
  auto list = store->ListObjects();
  ASSERT_TRUE(list.ok());
  std::sort(list->begin(), list->end());
  std::vector<std::string> want = {Sha256Hex("a"), Sha256Hex("b"), Sha256Hex("c")};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(*list, want);
}

}  // namespace
}  // namespace cubist
