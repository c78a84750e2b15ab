#include "tests/testlib/temp_files.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/status/statusor.h"
#include "base/file_util.h"
#include "gtest/gtest.h"

namespace cubist::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/cubist_test.XXXXXX";
  char* p = ::mkdtemp(tmpl.data());
  if (p == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    std::abort();
  }
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  // Objects in the cache are read-only; make everything writable before removal.
  std::filesystem::remove_all(path_, ec);
  if (ec) {
    std::string cmd = "chmod -R u+w '" + path_ + "' && rm -rf '" + path_ + "'";
    (void)std::system(cmd.c_str());
  }
}

void WriteFileOrDie(const std::string& path, std::string_view data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) {
    ADD_FAILURE() << "cannot write " << path;
    std::abort();
  }
}

std::string ReadFileOrDie(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  if (!bytes.ok()) {
    ADD_FAILURE() << "cannot read " << path << ": " << bytes.status();
    std::abort();
  }
  return *std::move(bytes);
}

bool FileExists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(rng() & 0xff);
  return out;
}

}  // namespace cubist::testing
