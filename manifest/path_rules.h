// Rules for artifact paths: the names under which a manifest's files are fetched, cached
// and looked up. A path comes from an untrusted manifest and is later joined to a base
// URL or a directory, so it must not be able to escape that root or mean two things.
//
// A valid path is relative, normalised and '/'-separated: one or more segments, each
// non-empty and neither "." nor "..", no leading or trailing '/', no backslash, no NUL
// or other control character (C0, DEL, C1), valid UTF-8 (no overlong forms), at most
// kMaxArtifactPathBytes bytes.
//
// Thread-safe (pure function).
#ifndef CUBIST_MANIFEST_PATH_RULES_H_
#define CUBIST_MANIFEST_PATH_RULES_H_

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"

namespace cubist {

inline constexpr size_t kMaxArtifactPathBytes = 4096;

// OK for a valid path (above). Otherwise InvalidArgument whose message quotes the path
// (escaped) and says exactly what is wrong, e.g.
//   path "a/../b" has a ".." segment; paths must not leave the artifact set's root
// Callers prefix their context ("manifest.json: artifacts[3].path: ").
[[nodiscard]] absl::Status ValidateArtifactPath(std::string_view path);

// A set's paths name files, so none may be another's directory: "x" and "x/y" cannot
// both be listed (the export of such a set, or its files on disk, cannot exist). Returns
// the first proper prefix of `path` ("x" for "x/y/z", then "x/y") that `listed(prefix)`
// says is in the set, or "" when none is.
template <typename Listed>
std::string_view ListedParentOf(std::string_view path, const Listed& listed) {
  for (size_t slash = path.find('/'); slash != std::string_view::npos;
       slash = path.find('/', slash + 1)) {
    if (listed(path.substr(0, slash))) return path.substr(0, slash);
  }
  return {};
}

}  // namespace cubist

#endif  // CUBIST_MANIFEST_PATH_RULES_H_
