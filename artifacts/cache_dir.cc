#include "artifacts/cache_dir.h"

#include <cstdlib>
#include <filesystem>

#include "absl/status/status.h"

namespace cubist {
namespace {

const char* NonEmptyEnv(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

std::string Absolute(const std::string& p) {
  std::error_code ec;
  auto abs = std::filesystem::absolute(p, ec);
  return ec ? p : abs.lexically_normal().string();
}

}  // namespace

absl::StatusOr<std::string> ResolveCacheDir(std::string_view flag) {
  if (!flag.empty()) return Absolute(std::string(flag));
  if (const char* v = NonEmptyEnv("CUBIST_CACHE_DIR")) return Absolute(v);
  // The XDG spec says relative values are invalid and must be ignored.
  if (const char* v = NonEmptyEnv("XDG_CACHE_HOME"); v != nullptr && v[0] == '/') {
    return Absolute(std::string(v) + "/cubist");
  }
  if (const char* v = NonEmptyEnv("HOME")) return Absolute(std::string(v) + "/.cache/cubist");
  return absl::InvalidArgumentError(
      "cache directory: none of --cache, CUBIST_CACHE_DIR, XDG_CACHE_HOME or HOME is "
      "set; pass --cache DIR");
}

std::string CacheDirOrigin(std::string_view flag) {
  if (!flag.empty()) return "--cache";
  if (NonEmptyEnv("CUBIST_CACHE_DIR")) return "CUBIST_CACHE_DIR";
  if (const char* v = NonEmptyEnv("XDG_CACHE_HOME"); v != nullptr && v[0] == '/') {
    return "XDG_CACHE_HOME";
  }
  return "HOME";
}

}  // namespace cubist
