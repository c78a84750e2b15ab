// Materializing an artifact set as a plain directory tree, for programs that read files
// by path rather than through cubist (FlashInfer with FLASHINFER_CUBIN_DIR).
//
//   ExportTree(store, manifest, "/opt/cubins", {.subdir = "<commit>/batched_gemm-..."})
//
// puts every artifact of the manifest at <dir>/<subdir>/<artifact path>, taken from the
// content-addressed cache: a hard link to the object where the filesystem allows it (no
// bytes copied; objects are read-only, so the link cannot be written through), else a
// copy that is hashed while it is written and must match.
//
// Atomic: the tree is built in a fresh temporary directory next to its final place
// (<dir>/<subdir's parent>/.<name>.cubist-export-XXXXXX), flushed, then renamed into
// place; an existing tree there is swapped out in the same step (renameat2
// RENAME_EXCHANGE) and then removed. A reader sees the old tree or the new one, never a
// half-written one; on any failure the temporary directory is removed and the old tree
// stays. The directories cubist creates on the way to <dir>/<subdir> are checked not to
// be symlinks, so the export cannot be redirected outside <dir>.
//
// Only a tree an export made is replaced: each export writes a marker file,
// kExportMarker, at <dir>/<subdir> (for FlashInfer that is the pin directory, since
// <dir> is a FLASHINFER_CUBIN_DIR shared with other pins and FlashInfer's own files).
// An existing directory there is replaced when it is empty, holds the marker, holds only
// hard links to cache objects (a tree exported before the marker existed), or
// `options.replace` says so; never when it holds another export (`--pin a` after
// `--pin a/b/c`) and never when the target is inside the cache or holds it: those are
// FailedPrecondition naming the directory.
//
// A killed export leaves its temporary directory behind; each temporary directory is
// flock()ed by its process while it lives, and the next export into the same parent
// removes those whose lock is free.
//
// Errors: NotFound when artifacts are missing from the cache (all named in the count,
// the first by path; the fix is `cubist fetch`), DataLoss when a copy does not hash to
// its artifact, FailedPrecondition for a symlink or a non-directory in the way,
// PermissionDenied / ResourceExhausted from the filesystem.
#ifndef CUBIST_ARTIFACTS_EXPORT_TREE_H_
#define CUBIST_ARTIFACTS_EXPORT_TREE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "artifacts/store.h"
#include "manifest/manifest.h"

namespace cubist {

// The marker file an export writes at the root of its tree.
inline constexpr char kExportMarker[] = ".cubist-export";

struct ExportOptions {
  // Relative path under the export directory where the set's root goes ("" for the
  // directory itself); must satisfy path_rules.h.
  std::string subdir;
  // Re-hash hard-linked objects too (copies are always hashed).
  bool deep = false;
  // Copy even where a hard link would work (tests; filesystems where links mislead).
  bool copy_only = false;
  // Replace a non-empty directory at the target that no export made (`--replace`).
  bool replace = false;
  // Small files written into the tree besides the artifacts (path -> bytes), e.g. the
  // checksums.txt a checksums manifest was read from. Paths satisfy path_rules.h and
  // must not be artifact paths.
  std::vector<std::pair<std::string, std::string>> extra_files;
};

struct ExportReport {
  std::string root;     // <dir>/<subdir>
  uint64_t linked = 0;  // hard links made
  uint64_t copied = 0;  // files copied
  uint64_t bytes = 0;   // bytes of all exported files
  bool replaced = false;  // an earlier tree was swapped out
};

[[nodiscard]] absl::StatusOr<ExportReport> ExportTree(const Store& store,
                                                      const Manifest& manifest,
                                                      const std::string& dir,
                                                      const ExportOptions& options = {});

}  // namespace cubist

#endif  // CUBIST_ARTIFACTS_EXPORT_TREE_H_
