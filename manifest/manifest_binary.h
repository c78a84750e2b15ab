// A parsed manifest as compact, self-checking bytes, for the cache of parsed manifests
// (artifacts/parsed_manifest_cache.h): reading 13,000 artifacts back from this form
// takes a fraction of what parsing and validating the JSON or checksums.txt they came
// from takes, and it never has to be validated again because it only ever holds what
// the parser accepted.
//
// Layout (integers little-endian, strings as a u32 length and their bytes):
//   "cubist.manifest.bin/1\n"          magic and format version
//   digest                             Manifest::digest: the SHA-256 of the manifest's
//                                      own bytes, which the entry stands for
//   every field of Manifest except source and digest, in declaration order
//   32 bytes                           SHA-256 of everything before
// A change to the fields of Manifest, Artifact or KernelSpec must change this format
// and its version (the static_asserts in manifest_binary.cc fail until it does).
//
// Decoding checks the trailing SHA-256 before it reads a field, then bounds-checks every
// read, so a truncated, torn or flipped entry is DataLoss, never a wrong manifest or a
// crash. The checksum catches corruption, not forgery: whoever can write the cache can
// also plant objects there, which are trusted on presence (architecture.md, "Cache").
//
// Thread-safe (no shared state).
#ifndef CUBIST_MANIFEST_MANIFEST_BINARY_H_
#define CUBIST_MANIFEST_MANIFEST_BINARY_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "manifest/manifest.h"

namespace cubist {

// The bytes of `manifest` in the layout above (source is left out, digest kept).
std::string EncodeManifestBinary(const Manifest& manifest);

// The manifest back from EncodeManifestBinary's bytes, Manifest::source left empty.
// DataLoss when the bytes are not a whole, intact entry of this format version.
[[nodiscard]] absl::StatusOr<Manifest> DecodeManifestBinary(std::string_view bytes);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_MANIFEST_BINARY_H_
