// Shared helpers for cubist's tests: status matchers, temporary directories, files.
#ifndef CUBIST_TESTS_TEST_UTIL_H_
#define CUBIST_TESTS_TEST_UTIL_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cubist::testing {

// Matches an absl::Status or absl::StatusOr<T> whose code is `code` and whose message
// matches `msg` (e.g. HasSubstr("sha256")):
//   EXPECT_THAT(Parse(x), StatusIs(absl::StatusCode::kInvalidArgument,
//                                  HasSubstr("artifacts[0].sha256")));
MATCHER_P2(StatusIs, code, msg, "") {
  const absl::Status& s = [](const auto& v) -> const absl::Status& {
    if constexpr (std::is_same_v<std::decay_t<decltype(v)>, absl::Status>) {
      return v;
    } else {
      return v.status();
    }
  }(arg);
  *result_listener << "status is " << s;
  return s.code() == code &&
         ::testing::ExplainMatchResult(msg, std::string(s.message()), result_listener);
}

// The status of an absl::Status or an absl::StatusOr<T>.
inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

#define CUBIST_ASSERT_OK(expr)                                           \
  do {                                                                   \
    const auto& _st = (expr);                                            \
    ASSERT_TRUE(_st.ok()) << ::cubist::testing::StatusOf(_st);           \
  } while (0)
#define CUBIST_EXPECT_OK(expr)                                           \
  do {                                                                   \
    const auto& _st = (expr);                                            \
    EXPECT_TRUE(_st.ok()) << ::cubist::testing::StatusOf(_st);           \
  } while (0)

// A fresh directory under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(std::string_view rel) const { return path_ + "/" + std::string(rel); }

 private:
  std::string path_;
};

// Writes `data` to `path`, creating parent directories. Aborts the test on failure.
void WriteFileOrDie(const std::string& path, std::string_view data);
// Reads a whole file; aborts the test on failure.
std::string ReadFileOrDie(const std::string& path);
bool FileExists(const std::string& path);
// Deterministic pseudo-random bytes (seeded), for artifact contents.
std::string RandomBytes(size_t n, uint64_t seed);

// Runs a shell command; returns its exit status (0-255, or 128+signal) and captures
// stdout and stderr together into *output when given.
int RunCommand(const std::string& command, std::string* output = nullptr);

// Absolute path of the built `cubist` command.
inline std::string CliPath() { return CUBIST_CLI_PATH; }
inline std::string SourceDir() { return CUBIST_SOURCE_DIR; }
inline std::string BinaryDir() { return CUBIST_BINARY_DIR; }

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TEST_UTIL_H_
