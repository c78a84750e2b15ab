// libFuzzer target: DecodeManifestBinary (manifest/manifest_binary.h) reads entries of the
// parsed-manifest cache, which a crash or a full disk can leave torn. Any bytes must give
// DataLoss or a manifest, never a crash. A random input almost never carries a valid
// trailing SHA-256, so the target also seals the input (appends the SHA-256 of
// "magic + input") and decodes that, which exercises the bounds checks of every field
// read. What decodes must encode to bytes that decode to the same encoding again, and
// the packed decode (artifacts read in place) must agree with the full one.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/sha256.h"
#include "manifest/manifest_binary.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "manifest_binary_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void Check(std::string_view bytes) {
  using namespace cubist;
  absl::StatusOr<Manifest> m = DecodeManifestBinary(bytes);
  // The packed decode (a warm fetch's) must accept exactly the same entries, and its
  // artifacts must unpack to the full decode's.
  PackedArtifacts packed;
  absl::StatusOr<Manifest> rest = DecodeManifestBinaryPacked(std::string(bytes), &packed);
  if (rest.ok() != m.ok()) {
    Fail("the packed decode disagrees", std::string(m.ok() ? rest.status().message()
                                                           : m.status().message()));
  }
  if (rest.ok()) {
    size_t walked = 0;
    packed.ForEach([&](const ArtifactRef&) {
      ++walked;
      return true;
    });
    rest->artifacts = packed.Unpack();
    if (walked != rest->artifacts.size() || *rest != *m) {
      Fail("the packed decode reads other artifacts", EncodeManifestBinary(*rest));
    }
  }
  if (!m.ok()) {
    if (m.status().code() != absl::StatusCode::kDataLoss) {
      Fail("error other than DataLoss", std::string(m.status().message()));
    }
    return;
  }
  const std::string once = EncodeManifestBinary(*m);
  absl::StatusOr<Manifest> back = DecodeManifestBinary(once);
  if (!back.ok()) Fail("its own encoding does not decode", std::string(back.status().message()));
  if (EncodeManifestBinary(*back) != once) Fail("encoding is not stable", once);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  Check(input);
  // The same bytes behind the format's magic, sealed with their checksum.
  std::string sealed = "cubist.manifest.bin/1\n";
  sealed.append(input);
  cubist::Sha256 hasher;
  hasher.Update(sealed);
  const cubist::Sha256Digest sum = hasher.Finish();
  sealed.append(reinterpret_cast<const char*>(sum.data()), sum.size());
  Check(sealed);
  return 0;
}
