// libFuzzer target: ParseChecksums on arbitrary bytes must never crash; what it accepts
// must hold only valid, unique paths and lowercase hex, and must read back the same after
// being written out again in sha256sum's unambiguous "<hex> *<path>" form.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "base/sha256.h"
#include "manifest/checksums.h"
#include "manifest/path_rules.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "checksums_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cubist;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  ManifestParseOptions options;
  options.checksums_name = "fuzz";
  absl::StatusOr<Manifest> m = ParseChecksums(input, "checksums.txt", options);
  if (!m.ok()) {
    if (m.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("error other than InvalidArgument", std::string(m.status().message()));
    }
    return 0;
  }
  if (m->artifacts.empty()) Fail("accepted a file without entries", std::string(input));
  std::set<std::string> paths;
  std::string rewritten;
  for (const Artifact& a : m->artifacts) {
    if (!ValidateArtifactPath(a.path).ok()) Fail("accepted an invalid path", a.path);
    if (!IsSha256Hex(a.sha256)) Fail("accepted a bad hash", a.sha256);
    if (a.size.has_value()) Fail("invented a size", a.path);
    if (!paths.insert(a.path).second) Fail("accepted a duplicate path", a.path);
    rewritten += a.sha256 + " *" + a.path + "\n";
  }
  absl::StatusOr<Manifest> back = ParseChecksums(rewritten, "checksums.txt", options);
  if (!back.ok()) Fail("rewritten file does not parse", std::string(back.status().message()));
  if (back->artifacts != m->artifacts) Fail("rewritten file reads differently", rewritten);
  return 0;
}
