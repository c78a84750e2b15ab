// Scratch files for cubist's tests: a temporary directory removed with its contents,
// whole-file reads and writes that abort the test on failure, and seeded contents.
#ifndef CUBIST_TESTS_TESTLIB_TEMP_FILES_H_
#define CUBIST_TESTS_TESTLIB_TEMP_FILES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace cubist::testing {

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

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_TEMP_FILES_H_
