// Fuzzes the trust parsers that read untrusted text: signature files (MANIFEST.sig comes
// from the same server as the manifest), key files and key strings. Invariants: no
// crash, and whatever parses formats back to a form that parses to the same value.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "manifest/signature.h"
#include "manifest/trust.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto lines = cubist::ParseSignatureFile(text, "fuzz.sig");
  if (lines.ok()) {
    for (const cubist::SignatureLine& line : *lines) {
      auto again = cubist::ParseSignatureFile(cubist::FormatSignatureLine(line), "again");
      if (!again.ok() || again->size() != 1 || (*again)[0].key_id != line.key_id ||
          (*again)[0].signature != line.signature) {
        std::abort();
      }
    }
  }
  auto keys = cubist::ParseKeyFile(text, "fuzz.keys");
  if (keys.ok()) {
    for (const cubist::PublicKey& k : *keys) {
      auto again = cubist::PublicKey::Parse(k.ToString());
      if (!again.ok() || !(*again == k)) std::abort();
    }
  }
  auto key = cubist::PublicKey::Parse(text);
  if (key.ok()) {
    auto from_pem = cubist::PublicKey::Parse(key->ToPem());
    if (!from_pem.ok() || !(*from_pem == *key)) std::abort();
  }
  return 0;
}
