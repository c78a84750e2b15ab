// Where the tests find the source tree and the build: the `cubist` command they run,
// fixtures under tests/, outputs under <build>/tests. The paths are compiled in by
// tests/testlib/CMakeLists.txt.
#ifndef CUBIST_TESTS_TESTLIB_BUILD_PATHS_H_
#define CUBIST_TESTS_TESTLIB_BUILD_PATHS_H_

#include <string>

namespace cubist::testing {

// Absolute path of the built `cubist` command.
inline std::string CliPath() { return CUBIST_CLI_PATH; }
inline std::string SourceDir() { return CUBIST_SOURCE_DIR; }
inline std::string BinaryDir() { return CUBIST_BINARY_DIR; }

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_BUILD_PATHS_H_
