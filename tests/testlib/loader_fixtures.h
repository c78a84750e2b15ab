// Where the loader's nvcc-built test cubins live (tests/loader/CMakeLists.txt), and a reader
// that lets a test skip when they were not built (no nvcc).
#ifndef CUBIST_TESTS_TESTLIB_LOADER_FIXTURES_H_
#define CUBIST_TESTS_TESTLIB_LOADER_FIXTURES_H_

#include <cstdlib>
#include <optional>
#include <string>

#include "base/file_util.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/status_matchers.h"

namespace cubist::testing {

// $CUBIST_TEST_CUBIN_DIR, else <build dir>/tests/cubins.
inline std::string CubinDir() {
  const char* env = std::getenv("CUBIST_TEST_CUBIN_DIR");
  if (env != nullptr && *env != '\0') return env;
  return BinaryDir() + "/tests/cubins";
}

inline std::string CubinPath(const std::string& name) { return CubinDir() + "/" + name; }

// The fixture's bytes, or nullopt when it was not built.
inline std::optional<std::string> ReadCubinFixture(const std::string& name) {
  absl::StatusOr<std::string> bytes = ReadFileToString(CubinPath(name));
  if (!bytes.ok()) return std::nullopt;
  return *std::move(bytes);
}

inline const absl::Status& AsStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

}  // namespace cubist::testing

// Like CUBIST_ASSERT_OK / CUBIST_EXPECT_OK, for a Status or a StatusOr (printing the
// status on failure), evaluating the expression once.
#define LOADER_ASSERT_OK(expr)                                   \
  do {                                                           \
    const auto& loader_ok_ = (expr);                             \
    ASSERT_TRUE(::cubist::testing::AsStatus(loader_ok_).ok())    \
        << ::cubist::testing::AsStatus(loader_ok_);              \
  } while (0)
#define LOADER_EXPECT_OK(expr)                                   \
  do {                                                           \
    const auto& loader_ok_ = (expr);                             \
    EXPECT_TRUE(::cubist::testing::AsStatus(loader_ok_).ok())    \
        << ::cubist::testing::AsStatus(loader_ok_);              \
  } while (0)

// Declares `var` with the fixture's bytes, or skips the test when nvcc did not build it.
#define CUBIST_FIXTURE_OR_SKIP(var, name)                                        \
  auto var##_opt = ::cubist::testing::ReadCubinFixture(name);                    \
  if (!var##_opt) GTEST_SKIP() << "fixture " << name << " not built (no nvcc?)"; \
  const std::string& var = *var##_opt

#endif  // CUBIST_TESTS_TESTLIB_LOADER_FIXTURES_H_
