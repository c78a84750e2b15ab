#include "artifacts/version_guard.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "manifest/manifest.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::FileExists;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::StatusIs;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::testing::HasSubstr;

Manifest M(const std::string& name, int64_t version) {
  Manifest m;
  m.name = name;
  m.version = version;
  m.source = "https://h/" + name + ".json";
  m.digest = std::string(64, 'a' + static_cast<char>(version % 6));
  return m;
}

int64_t HighestOrZero(const VersionGuard& g, const std::string& name) {
  absl::StatusOr<std::optional<VersionRecord>> r = g.Highest(name);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() && r->has_value() ? (*r)->version : 0;
}

TEST(VersionGuardTest, RecordsTheHighestAndRefusesRollback) {
  TempDir dir;
  VersionGuard g(dir.path());
  EXPECT_EQ(HighestOrZero(g, "moe"), 0);
  CUBIST_ASSERT_OK(g.CheckAndRecord(M("moe", 5), false));
  EXPECT_EQ(HighestOrZero(g, "moe"), 5);
  EXPECT_EQ(ReadFileOrDie(dir.Join("state/versions/moe")),
            "cubist.version-state/1\nname moe\nversion 5\ndigest " + M("moe", 5).digest +
                "\n");
  CUBIST_ASSERT_OK(g.CheckAndRecord(M("moe", 5), false));  // same release again: fine
  CUBIST_ASSERT_OK(g.CheckAndRecord(M("moe", 7), false));
  EXPECT_EQ(HighestOrZero(g, "moe"), 7);
  EXPECT_THAT(g.CheckAndRecord(M("moe", 6), false),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("https://h/moe.json: manifest 'moe' version 6 is older than "
                                 "version 7 already verified in this cache (rollback "
                                 "refused")));
  EXPECT_THAT(g.Check(M("moe", 6), false),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("pass --allow-rollback to downgrade deliberately")));
  EXPECT_EQ(HighestOrZero(g, "moe"), 7);
  // Names are independent.
  CUBIST_EXPECT_OK(g.CheckAndRecord(M("other", 1), false));
}

TEST(VersionGuardTest, AllowRollbackAcceptsButKeepsTheHigherRecord) {
  TempDir dir;
  VersionGuard g(dir.path());
  CUBIST_ASSERT_OK(g.CheckAndRecord(M("moe", 9), false));
  CUBIST_EXPECT_OK(g.CheckAndRecord(M("moe", 3), true));
  CUBIST_EXPECT_OK(g.Check(M("moe", 3), true));
  EXPECT_EQ(HighestOrZero(g, "moe"), 9);
  EXPECT_FALSE(g.CheckAndRecord(M("moe", 3), false).ok());
}

TEST(VersionGuardTest, CheckDoesNotWrite) {
  TempDir dir;
  VersionGuard g(dir.path());
  CUBIST_EXPECT_OK(g.Check(M("moe", 4), false));
  EXPECT_FALSE(FileExists(dir.Join("state")));
  EXPECT_FALSE(FileExists(dir.Join("locks")));
}

TEST(VersionGuardTest, HostileNamesStayInsideTheStateDirectory) {
  TempDir dir;
  VersionGuard g(dir.path());
  for (std::string name : {"../../escape", "a/b", ".hidden", "x\ny", "", "caf\xc3\xa9"}) {
    SCOPED_TRACE(name);
    CUBIST_ASSERT_OK(g.CheckAndRecord(M(name, 2), false));
    EXPECT_EQ(HighestOrZero(g, name), 2);
    std::string file = VersionStateFileName(name);
    EXPECT_EQ(file.find('/'), std::string::npos);
    EXPECT_NE(file[0], '.');
    EXPECT_TRUE(FileExists(dir.Join("state/versions/" + file)));
  }
  EXPECT_EQ(VersionStateFileName("../../escape"), "%2E.%2F..%2Fescape");
  EXPECT_EQ(VersionStateFileName("moe-gemm_sm90a.v2"), "moe-gemm_sm90a.v2");
  EXPECT_FALSE(FileExists(dir.Join("../escape")));
  std::string long_name(300, 'n');
  EXPECT_EQ(VersionStateFileName(long_name).substr(0, 7), "sha256-");
  CUBIST_ASSERT_OK(g.CheckAndRecord(M(long_name, 3), false));
  EXPECT_EQ(HighestOrZero(g, long_name), 3);
}

// A name of 200 bytes or fewer may still encode to more than NAME_MAX (255): 100 "é"
// are 200 bytes and 600 characters escaped. Its record and lock get a hashed name that
// fits, the same every time, and another for another name.
TEST(VersionGuardTest, NamesThatEscapeLongStayWithinNameMax) {
  TempDir dir;
  VersionGuard g(dir.path());
  std::string accents;
  for (int i = 0; i < 100; ++i) accents += "\xc3\xa9";
  const std::string newlines(90, '\n');
  for (const std::string& name : {accents, newlines}) {
    const std::string file = VersionStateFileName(name);
    EXPECT_EQ(file, "sha256-" + Sha256Hex(name));
    EXPECT_LE(std::string("version-" + file + ".lock").size(), 255u);
    CUBIST_ASSERT_OK(g.CheckAndRecord(M(name, 4), false));
    EXPECT_EQ(HighestOrZero(g, name), 4);
    EXPECT_TRUE(FileExists(dir.Join("state/versions/" + file)));
    EXPECT_THAT(g.Check(M(name, 3), false),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("rollback refused")));
  }
  EXPECT_NE(VersionStateFileName(accents), VersionStateFileName(newlines));
  // At the edge: 200 encoded characters are kept readable, 201 are hashed.
  EXPECT_EQ(VersionStateFileName(std::string(197, 'n') + "\n"), std::string(197, 'n') + "%0A");
  EXPECT_EQ(VersionStateFileName(std::string(198, 'n') + "\n"),
            "sha256-" + Sha256Hex(std::string(198, 'n') + "\n"));
}

TEST(VersionGuardTest, CorruptStateIsDataLossNamingTheFix) {
  TempDir dir;
  VersionGuard g(dir.path());
  WriteFileOrDie(dir.Join("state/versions/moe"), "garbage\n");
  EXPECT_THAT(g.CheckAndRecord(M("moe", 2), false),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("corrupt rollback state (bad header); remove the file to "
                                 "reset rollback protection for 'moe'")));
  WriteFileOrDie(dir.Join("state/versions/moe"),
                 "cubist.version-state/1\nname moe\nversion -4\n");
  EXPECT_THAT(g.Highest("moe"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("bad version")));
  WriteFileOrDie(dir.Join("state/versions/moe"),
                 "cubist.version-state/1\nname other\nversion 4\n");
  EXPECT_THAT(g.Highest("moe"),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("records another name")));
  WriteFileOrDie(dir.Join("state/versions/moe"), std::string(100000, 'x'));
  EXPECT_THAT(g.Highest("moe"), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("too large")));
}

TEST(VersionGuardTest, PlantedSymlinkIsNotFollowed) {
  TempDir dir;
  VersionGuard g(dir.path());
  WriteFileOrDie(dir.Join("elsewhere"), "cubist.version-state/1\nname moe\nversion 1\n");
  WriteFileOrDie(dir.Join("state/versions/.keep"), "");
  ASSERT_EQ(::symlink(dir.Join("elsewhere").c_str(), dir.Join("state/versions/moe").c_str()), 0);
  EXPECT_THAT(g.CheckAndRecord(M("moe", 2), false),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("is a symlink")));
  EXPECT_EQ(ReadFileOrDie(dir.Join("elsewhere")),
            "cubist.version-state/1\nname moe\nversion 1\n");
}

TEST(VersionGuardTest, UnwritableStateIsPermissionDenied) {
  TempDir dir;
  VersionGuard g(dir.path());
  CUBIST_ASSERT_OK(g.CheckAndRecord(M("moe", 1), false));
  ASSERT_EQ(::chmod(dir.Join("state/versions").c_str(), 0555), 0);
  // Root ignores file modes, so as root the check runs in a child that drops to nobody
  // (for whom the whole cache is read-only).
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(2);
    absl::Status s = g.CheckAndRecord(M("moe", 2), false);
    bool ok = s.code() == absl::StatusCode::kPermissionDenied &&
              std::string(s.message()).find(dir.path()) != std::string::npos;
    if (!ok) std::fprintf(stderr, "got %s\n", s.ToString().c_str());
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::chmod(dir.Join("state/versions").c_str(), 0755);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(HighestOrZero(g, "moe"), 1);
}

// Many processes recording different versions at once: the record ends at the maximum
// (a read-compare-write without the lock would lose updates), and every process whose
// version was below a record already written was refused, none crashed.
TEST(VersionGuardTest, ConcurrentProcessesKeepTheMaximum) {
  TempDir dir;
  constexpr int kProcs = 16;
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcs; ++i) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      VersionGuard g(dir.path());
      int bad = 0;
      for (int round = 0; round < 20; ++round) {
        int64_t v = 1 + (i * 7 + round * 13) % 97;
        absl::Status s = g.CheckAndRecord(M("moe", v), false);
        if (!s.ok() && s.code() != absl::StatusCode::kFailedPrecondition) ++bad;
      }
      ::_exit(bad == 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  int64_t want = 0;
  for (int i = 0; i < kProcs; ++i) {
    for (int round = 0; round < 20; ++round) {
      want = std::max<int64_t>(want, 1 + (i * 7 + round * 13) % 97);
    }
  }
  VersionGuard g(dir.path());
  EXPECT_EQ(HighestOrZero(g, "moe"), want);
}

}  // namespace
}  // namespace cubist
