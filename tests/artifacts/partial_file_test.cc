#include "artifacts/partial_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "base/sha256.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::FileExists;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;

TEST(PartialFileTest, AppendsAndHashesWhatItHolds) {
  TempDir dir;
  PartialFile file;
  ASSERT_TRUE(file.Open(dir.Join("a.part"), 10).ok());
  EXPECT_EQ(file.size(), 0u);
  ASSERT_TRUE(file.Append("hello ", 6).ok());
  ASSERT_TRUE(file.Append("moe", 3).ok());
  EXPECT_EQ(file.size(), 9u);
  EXPECT_EQ(ReadFileOrDie(dir.Join("a.part")), "hello moe");
  EXPECT_EQ(file.FinishSha256(), Sha256Hex("hello moe"));
}

TEST(PartialFileTest, ResumesWhatAnEarlierProcessLeftAndHashesItAgain) {
  TempDir dir;
  WriteFileOrDie(dir.Join("a.part"), "0123");
  PartialFile file;
  ASSERT_TRUE(file.Open(dir.Join("a.part"), 8).ok());
  EXPECT_EQ(file.size(), 4u);  // the transfer asks for byte 4 on
  ASSERT_TRUE(file.Append("4567", 4).ok());
  EXPECT_EQ(ReadFileOrDie(dir.Join("a.part")), "01234567");
  EXPECT_EQ(file.FinishSha256(), Sha256Hex("01234567"));
}

TEST(PartialFileTest, AFileAsLongAsTheObjectOrLongerIsEmptied) {
  TempDir dir;
  WriteFileOrDie(dir.Join("a.part"), "01234567");
  PartialFile file;
  ASSERT_TRUE(file.Open(dir.Join("a.part"), 8).ok());
  EXPECT_EQ(file.size(), 0u);
  EXPECT_EQ(ReadFileOrDie(dir.Join("a.part")), "");
}

TEST(PartialFileTest, ResetEmptiesTheFileAndTheHashAndKeepsItOpen) {
  TempDir dir;
  WriteFileOrDie(dir.Join("a.part"), "stale");
  PartialFile file;
  ASSERT_TRUE(file.Open(dir.Join("a.part"), std::nullopt).ok());
  EXPECT_EQ(file.size(), 5u);  // any count resumes when the size is unknown
  ASSERT_TRUE(file.Reset().ok());
  EXPECT_TRUE(file.is_open());
  EXPECT_EQ(file.size(), 0u);
  ASSERT_TRUE(file.Append("fresh", 5).ok());
  EXPECT_EQ(ReadFileOrDie(dir.Join("a.part")), "fresh");
  EXPECT_EQ(file.FinishSha256(), Sha256Hex("fresh"));
}

TEST(PartialFileTest, DiscardRemovesTheFileAndReleaseFdKeepsIt) {
  TempDir dir;
  PartialFile dropped;
  ASSERT_TRUE(dropped.Open(dir.Join("a.part"), 4).ok());
  ASSERT_TRUE(dropped.Append("ab", 2).ok());
  dropped.Discard();
  EXPECT_FALSE(dropped.is_open());
  EXPECT_EQ(dropped.size(), 0u);
  EXPECT_FALSE(FileExists(dir.Join("a.part")));

  PartialFile kept;
  ASSERT_TRUE(kept.Open(dir.Join("b.part"), 4).ok());
  ASSERT_TRUE(kept.Append("abcd", 4).ok());
  UniqueFd fd = kept.ReleaseFd();
  EXPECT_TRUE(fd.valid());
  kept.Discard();  // no longer its file to remove
  EXPECT_EQ(ReadFileOrDie(dir.Join("b.part")), "abcd");
}

TEST(PartialFileTest, ASymlinkOrFifoAtThePathIsReplacedNotUsed) {
  TempDir dir;
  WriteFileOrDie(dir.Join("target"), "do not touch");
  ASSERT_EQ(::symlink(dir.Join("target").c_str(), dir.Join("a.part").c_str()), 0);
  ASSERT_EQ(::mkfifo(dir.Join("b.part").c_str(), 0644), 0);
  for (const char* name : {"a.part", "b.part"}) {
    PartialFile file;
    ASSERT_TRUE(file.Open(dir.Join(name), 4).ok()) << name;
    ASSERT_TRUE(file.Append("abcd", 4).ok());
    struct stat st;
    ASSERT_EQ(::lstat(dir.Join(name).c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode)) << name;
    EXPECT_EQ(ReadFileOrDie(dir.Join(name)), "abcd");
  }
  EXPECT_EQ(ReadFileOrDie(dir.Join("target")), "do not touch");
}

}  // namespace
}  // namespace cubist
