// Builds a manifest from a directory of artifacts: what a kernel publisher runs on a
// folder of cubins before uploading it (`cubist manifest build`).
//
// Every regular file under the directory, recursively, becomes an artifact (path relative
// to the directory, sha256, size), sorted by path (bytewise). A symbolic link is followed
// when its target lies inside the directory (the artifact keeps the link's path); a link
// that points outside, dangles, or loops back to an enclosing directory is an error that
// names it. Other file types (sockets, FIFOs, devices) are skipped. Each path must
// satisfy path_rules.h.
//
// Kernel metadata comes from an optional kernels file (a JSON array of kernel objects or
// an object with "kernels", validated as in a manifest: manifest_parser.h's
// ParseKernelList); each kernel's artifact must be one of the files found.
//
// Files are hashed on several threads (cubin folders hold thousands of files).
//
// Errors: InvalidArgument (bad option, bad file name, symlink outside the directory or
// dangling or looping, invalid kernels file or a kernel whose artifact is missing: the
// message names the kernel and the path), NotFound (no such directory or kernels file),
// PermissionDenied / Internal from reading files.
//
// Thread-safe: concurrent calls share nothing.
#ifndef CUBIST_MANIFEST_MANIFEST_BUILDER_H_
#define CUBIST_MANIFEST_MANIFEST_BUILDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "manifest/manifest.h"

namespace cubist {

struct ManifestBuildOptions {
  std::string name;          // required: [A-Za-z0-9._-]{1,128}
  int64_t version = 1;       // 1 .. 2^53
  std::string kernels_file;  // optional: path of the kernels JSON file
  // Paths relative to the directory ("manifest.json", "tmp/") to leave out; a directory
  // leaves out everything under it. A leading "./" and trailing '/' are ignored.
  std::vector<std::string> exclude;
  int threads = 0;  // hashing threads; 0: one per core, at most 16
};

// Builds the manifest of `dir`. Manifest::source is `dir`; Manifest::digest is empty
// (it identifies bytes, and none have been written yet).
[[nodiscard]] absl::StatusOr<Manifest> BuildManifestFromDirectory(
    const std::string& dir, const ManifestBuildOptions& options);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_MANIFEST_BUILDER_H_
