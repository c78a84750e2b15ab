// Where the loader's nvcc-built test cubins live (tests/loader/CMakeLists.txt), and a reader
// that lets a test skip when they were not built (no nvcc).
#ifndef CUBIST_TESTS_TESTLIB_LOADER_FIXTURES_H_
#define CUBIST_TESTS_TESTLIB_LOADER_FIXTURES_H_

#include <cstdlib>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "base/file_util.h"
#include "gtest/gtest.h"
#include "tests/testlib/build_paths.h"

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

}  // namespace cubist::testing

// Declares `var` with the fixture's bytes, or skips the test when nvcc did not build it.
#define CUBIST_FIXTURE_OR_SKIP(var, name)                                        \
  auto var##_opt = ::cubist::testing::ReadCubinFixture(name);                    \
  if (!var##_opt) GTEST_SKIP() << "fixture " << name << " not built (no nvcc?)"; \
  const std::string& var = *var##_opt

#endif  // CUBIST_TESTS_TESTLIB_LOADER_FIXTURES_H_
