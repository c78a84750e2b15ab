#include "artifacts/parsed_manifest_cache.h"

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/checksums.h"
#include "manifest/manifest_binary.h"

namespace cubist {
namespace {

// An entry is about as large as the text it was parsed from; the parser refuses text
// over 64 MiB, so anything much larger is not an entry of ours.
constexpr uint64_t kMaxEntryBytes = uint64_t{256} << 20;

}  // namespace

ParsedManifestCache::ParsedManifestCache(const Store& store)
    : dir_(absl::StrCat(store.ManifestsDir(), "/parsed")) {}

std::string ParsedManifestCache::EntryPath(std::string_view bytes, std::string_view digest,
                                           std::string_view source,
                                           std::string* name) const {
  name->clear();
  if (!LooksLikeJsonManifest(bytes)) *name = ChecksumsNameFromSource(source);
  return name->empty() ? absl::StrCat(dir_, "/", Sv(digest))
                       : absl::StrCat(dir_, "/", Sv(digest), ".", *name);
}

std::optional<Manifest> ParsedManifestCache::Find(std::string_view bytes,
                                                  std::string_view digest,
                                                  std::string_view source,
                                                  PackedArtifacts* packed) const {
  if (!IsSha256Hex(digest)) return std::nullopt;
  std::string name;
  const std::string path = EntryPath(bytes, digest, source, &name);
  absl::StatusOr<std::string> entry = ReadFileToString(path, kMaxEntryBytes);
  if (!entry.ok()) return std::nullopt;
  PackedArtifacts artifacts;
  absl::StatusOr<Manifest> m = packed != nullptr
                                   ? DecodeManifestBinaryPacked(*std::move(entry), &artifacts)
                                   : DecodeManifestBinary(*entry);
  // Intact, and for these bytes: anything else is parsed again (and the entry rewritten).
  if (!m.ok() || m->digest != digest || (!name.empty() && m->name != name)) {
    return std::nullopt;
  }
  m->source = std::string(source);
  if (packed != nullptr) *packed = std::move(artifacts);
  return *std::move(m);
}

absl::Status ParsedManifestCache::Put(const Manifest& manifest, std::string_view bytes,
                                      std::string_view source) const {
  return Write(manifest, nullptr, bytes, source);
}

absl::Status ParsedManifestCache::Put(const Manifest& manifest,
                                      const PackedArtifacts& artifacts, std::string_view bytes,
                                      std::string_view source) const {
  return Write(manifest, &artifacts, bytes, source);
}

absl::Status ParsedManifestCache::Write(const Manifest& manifest,
                                        const PackedArtifacts* artifacts,
                                        std::string_view bytes,
                                        std::string_view source) const {
  if (!IsSha256Hex(manifest.digest)) {
    return absl::InvalidArgumentError("parsed manifest cache: the manifest has no digest");
  }
  std::string name;
  const std::string path = EntryPath(bytes, manifest.digest, source, &name);
  CUBIST_RETURN_IF_ERROR(MakeDirs(dir_));
  if (artifacts == nullptr) return WriteFileAtomically(path, EncodeManifestBinary(manifest));
  const EncodedPieces entry = EncodeManifestBinaryPieces(manifest, *artifacts);
  return WriteFileAtomically(path, {entry.head, entry.artifacts, entry.tail});
}

}  // namespace cubist
