// Ed25519 keys and detached signatures over a manifest's exact bytes (OpenSSL 3).
//
// Formats (all text, documented in docs/reliability.md):
//   public key      "ed25519:<base64 of the 32 raw key bytes>", or a PEM
//                   "-----BEGIN PUBLIC KEY-----" block (what `openssl pkey -pubout` writes)
//   key id          first 16 hex digits of SHA-256 over the 32 raw public key bytes; a
//                   label for messages and for picking the key, never trusted by itself
//   private key     PKCS#8 PEM "-----BEGIN PRIVATE KEY-----" (what `openssl genpkey
//                   -algorithm ed25519` writes), stored 0600
//   signature file  MANIFEST.sig: one line per signature,
//                     ed25519 <key id> <base64 of the 64 signature bytes>
//                   blank lines and lines starting with '#' are ignored. Several lines
//                   let a publisher sign with an old and a new key during rotation.
//
// A signature file verifies when ANY of its lines is a valid signature of the bytes by
// ANY trusted key. Every failure is PermissionDenied (the caller must not use the bytes),
// except malformed key text given by the user, which is InvalidArgument.
//
// Thread safety: PublicKey is a value type; PrivateKey is move-only and may be used from
// one thread at a time. The free functions are thread-safe.
#ifndef CUBIST_MANIFEST_SIGNATURE_H_
#define CUBIST_MANIFEST_SIGNATURE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace cubist {

inline constexpr size_t kEd25519PublicKeySize = 32;
inline constexpr size_t kEd25519SignatureSize = 64;
// A signature file larger than this is refused unread (it would be hostile).
inline constexpr size_t kMaxSignatureFileSize = 64 * 1024;

using Ed25519Signature = std::array<uint8_t, kEd25519SignatureSize>;

class PublicKey {
 public:
  // Parses "ed25519:<base64>" (canonical padded base64 of exactly 32 bytes) or one PEM
  // public key block holding an Ed25519 key. Surrounding whitespace is ignored.
  // InvalidArgument names what is wrong ("not an Ed25519 key", "decodes to 31 bytes").
  [[nodiscard]] static absl::StatusOr<PublicKey> Parse(std::string_view text);
  static PublicKey FromRaw(const std::array<uint8_t, kEd25519PublicKeySize>& raw);

  const std::array<uint8_t, kEd25519PublicKeySize>& raw() const { return raw_; }
  // "ed25519:<base64>", the form Parse accepts and `cubist keygen` prints.
  std::string ToString() const;
  // PEM SubjectPublicKeyInfo block, for tools that want PEM.
  std::string ToPem() const;
  // 16 lowercase hex digits (see above).
  std::string Id() const;

  // True when `signature` is a valid Ed25519 signature of `data` by this key.
  bool Verify(std::string_view data, const Ed25519Signature& signature) const;

  bool operator==(const PublicKey&) const = default;

 private:
  std::array<uint8_t, kEd25519PublicKeySize> raw_{};
};

// An Ed25519 private key. Move-only; owns an OpenSSL EVP_PKEY.
class PrivateKey {
 public:
  // A fresh key from the operating system's CSPRNG. Internal if OpenSSL fails.
  [[nodiscard]] static absl::StatusOr<PrivateKey> Generate();
  // Parses a PKCS#8 PEM private key (unencrypted). InvalidArgument when the text is not
  // a PEM private key or the key is not Ed25519.
  [[nodiscard]] static absl::StatusOr<PrivateKey> FromPem(std::string_view pem);

  PrivateKey(PrivateKey&&) noexcept;
  PrivateKey& operator=(PrivateKey&&) noexcept;
  PrivateKey(const PrivateKey&) = delete;
  PrivateKey& operator=(const PrivateKey&) = delete;
  ~PrivateKey();

  // PKCS#8 PEM text. The caller should write it with mode 0600 and not log it.
  [[nodiscard]] absl::StatusOr<std::string> ToPem() const;
  PublicKey public_key() const { return public_key_; }
  [[nodiscard]] absl::StatusOr<Ed25519Signature> Sign(std::string_view data) const;

 private:
  struct Impl;
  explicit PrivateKey(std::unique_ptr<Impl> impl, PublicKey pub);
  std::unique_ptr<Impl> impl_;
  PublicKey public_key_;
};

// One line of a signature file.
struct SignatureLine {
  std::string key_id;  // as written; 16 lowercase hex digits
  Ed25519Signature signature{};
};

// Parses a signature file (format above). `source` names the file in messages.
// PermissionDenied for any malformation (a damaged signature is a failed signature),
// with the line number: "m.json.sig:2: expected 'ed25519 <key id> <base64 signature>'".
[[nodiscard]] absl::StatusOr<std::vector<SignatureLine>> ParseSignatureFile(
    std::string_view text, std::string_view source);

// Formats one line, with its trailing newline.
std::string FormatSignatureLine(const SignatureLine& line);
std::string FormatSignatureLine(const PublicKey& key, const Ed25519Signature& signature);

// Checks a detached signature file against `data`. `trusted` must not be empty
// (InvalidArgument otherwise: the caller decides whether signatures are required).
// OK when any line verifies under any trusted key. Otherwise PermissionDenied with a
// message saying why: malformed file, signed only by untrusted keys (names them and the
// trusted ones), or a signature that does not match the bytes (altered manifest or
// signature). `source` names the signature file in messages.
[[nodiscard]] absl::Status VerifyDetachedSignature(std::string_view data,
                                                   std::string_view signature_file,
                                                   absl::Span<const PublicKey> trusted,
                                                   std::string_view source);

}  // namespace cubist

#endif  // CUBIST_MANIFEST_SIGNATURE_H_
