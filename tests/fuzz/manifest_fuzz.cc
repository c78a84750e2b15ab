// libFuzzer target: ParseManifestOrChecksums on arbitrary bytes must never crash, its
// packed form (ParseManifestOrChecksumsPacked) must give the same error or the same
// manifest, and whatever it accepts must survive WriteManifest -> ParseManifest
// unchanged, with the writer's output a fixed point. Any violation aborts (a finding).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "manifest/checksums.h"
#include "manifest/manifest_binary.h"
#include "manifest/manifest_parser.h"
#include "manifest/manifest_writer.h"
#include "manifest/path_rules.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "manifest_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cubist;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  ManifestParseOptions options;
  options.max_bytes = 1 << 20;
  absl::StatusOr<Manifest> m = ParseManifestOrChecksums(input, "fuzz", options);
  PackedArtifacts packed;
  absl::StatusOr<Manifest> p = ParseManifestOrChecksumsPacked(input, "fuzz", options, &packed);
  if (p.status() != m.status()) {
    Fail("the packed parse disagrees", std::string(m.status().ToString()) + "\n" +
                                           std::string(p.status().ToString()));
  }
  if (p.ok()) {
    p->artifacts = packed.Unpack();
    if (*p != *m) Fail("the packed parse holds another manifest", std::string(input));
  }
  if (!m.ok()) {
    if (m.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("error other than InvalidArgument", std::string(m.status().message()));
    }
    return 0;
  }
  for (const Artifact& a : m->artifacts) {
    if (!ValidateArtifactPath(a.path).ok()) Fail("accepted an invalid path", a.path);
  }
  // A manifest from a checksums.txt has no sizes; the writer then omits them.
  bool all_sized = true;
  for (const Artifact& a : m->artifacts) all_sized = all_sized && a.size.has_value();
  ManifestParseOptions reparse = options;
  reparse.require_artifact_size = all_sized;
  reparse.max_bytes = 64 << 20;

  const std::string written = WriteManifest(*m);
  absl::StatusOr<Manifest> back = ParseManifest(written, "fuzz-written", reparse);
  if (!back.ok()) Fail("written manifest does not parse", std::string(back.status().message()) + "\n" + written);
  if (!SameContent(*m, *back)) Fail("round trip changed the manifest", written);
  if (WriteManifest(*back) != written) Fail("writer output is not a fixed point", written);
  return 0;
}
