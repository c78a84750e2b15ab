// Where the cache lives: --cache DIR, else $CUBIST_CACHE_DIR, else
// $XDG_CACHE_HOME/cubist, else $HOME/.cache/cubist (FlashInfer ignored XDG_CACHE_HOME,
// flashinfer#2976; cubist honours each level in this order).
#ifndef CUBIST_ARTIFACTS_CACHE_DIR_H_
#define CUBIST_ARTIFACTS_CACHE_DIR_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace cubist {

// Returns the cache root as an absolute path (not created). `flag` is the value of
// --cache, empty when not given. InvalidArgument when nothing names a directory
// (no flag, no variables, no HOME).
[[nodiscard]] absl::StatusOr<std::string> ResolveCacheDir(std::string_view flag);

// Which rule picked the directory: "--cache", "CUBIST_CACHE_DIR", "XDG_CACHE_HOME" or
// "HOME". For `cubist doctor`.
std::string CacheDirOrigin(std::string_view flag);

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_CACHE_DIR_H_
