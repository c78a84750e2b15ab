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

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "manifest/manifest.h"

namespace cubist {

class PackedArtifacts;
struct EncodedPieces;

// The bytes of `manifest` in the layout above (source is left out, digest kept).
std::string EncodeManifestBinary(const Manifest& manifest);
// The same for a manifest whose artifacts are packed (`artifacts` stand in for
// manifest.artifacts, which must be empty), in three pieces whose concatenation is the
// entry: the middle one is the packed artifacts' own bytes, not a copy, so that a large
// manifest's entry is written without a second copy of them in memory. The views live as
// long as `artifacts`.
struct EncodedPieces {
  std::string head;
  std::string_view artifacts;
  std::string tail;  // ends with the checksum of all three
};
EncodedPieces EncodeManifestBinaryPieces(const Manifest& manifest,
                                         const PackedArtifacts& artifacts);

// The manifest back from EncodeManifestBinary's bytes, Manifest::source left empty.
// DataLoss when the bytes are not a whole, intact entry of this format version.
[[nodiscard]] absl::StatusOr<Manifest> DecodeManifestBinary(std::string_view bytes);

// One artifact as an entry holds it: views into the entry's bytes.
struct ArtifactRef {
  std::string_view path;
  std::string_view sha256;
  std::optional<uint64_t> size;
};

// The artifacts of an entry, left where they lie in its bytes (which this shares) until
// asked for. A warm fetch looks at each artifact's hash and size once; building and
// freeing an Artifact (two heap strings) for each of FlashInfer's 13,453 took longer
// than everything else it does but the stat()s. Copyable and cheap to copy; immutable.
class PackedArtifacts {
 public:
  PackedArtifacts() = default;

  size_t size() const { return count_; }
  // Calls `fn` on each artifact, in manifest order, until it returns false; returns
  // false when `fn` stopped the walk. The views live as long as this object.
  bool ForEach(absl::FunctionRef<bool(const ArtifactRef&)> fn) const;
  // The artifacts as Manifest::artifacts holds them (extras included): what
  // DecodeManifestBinary would have put there.
  std::vector<Artifact> Unpack() const;

 private:
  friend absl::StatusOr<Manifest> DecodeManifestBinaryPacked(std::string, PackedArtifacts*);
  friend class PackedArtifactsBuilder;
  friend EncodedPieces EncodeManifestBinaryPieces(const Manifest&, const PackedArtifacts&);

  std::shared_ptr<const std::string> entry_;
  std::string_view section_;  // the artifacts, inside *entry_
  size_t count_ = 0;
};

// Packs artifacts one at a time, as they are parsed, so that a large manifest's are
// never all built: packed, one costs its path and 85 bytes (without extras), built about
// 240 (manifest_parser.h's ParseManifestPacked).
class PackedArtifactsBuilder {
 public:
  // Room for this many bytes of packed artifacts. Pages never written are never touched,
  // so a generous guess costs address space, not memory.
  void Reserve(size_t bytes) { section_.reserve(bytes); }
  // Appends `a`; returns where its record starts (for PathAt).
  size_t Add(const Artifact& a);
  // The path of the artifact whose record starts at `offset`, a value Add returned.
  std::string_view PathAt(size_t offset) const;
  size_t size() const { return count_; }
  // The artifacts added, in order.
  PackedArtifacts Finish() &&;

 private:
  std::string section_;
  size_t count_ = 0;
};

// DecodeManifestBinary of `entry` (taken), except that the artifacts stay packed in it:
// `*artifacts` reads them, and the returned manifest has none. The checksum and the
// layout of every artifact are checked here as DecodeManifestBinary checks them
// (DataLoss), so reading them later cannot fail.
[[nodiscard]] absl::StatusOr<Manifest> DecodeManifestBinaryPacked(std::string entry,
                                                                  PackedArtifacts* artifacts);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_MANIFEST_BINARY_H_
