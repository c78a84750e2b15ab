#include "manifest/signature.h"

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/sha256.h"
#include "base/strings.h"

namespace cubist {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* p) const { EVP_MD_CTX_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;

constexpr std::string_view kKeyPrefix = "ed25519:";
constexpr std::string_view kSigFormat = "expected 'ed25519 <key id> <base64 signature>'";

// OpenSSL keeps a per-thread error queue; drain it into one line so that a later,
// unrelated call does not report a stale error.
std::string OpenSslError() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

// OpenSSL's default passphrase callback prompts on the terminal; cubist never wants
// that (it would hang CI), so encrypted keys simply fail to load.
int NoPassphrase(char*, int, int, void*) { return -1; }

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

// Strict base64: padded, canonical, exactly `want` bytes. Lenient decoders accept
// several spellings of one value; a signature format should have one.
bool DecodeBase64Exact(std::string_view text, size_t want, uint8_t* out) {
  std::string decoded;
  if (!absl::Base64Unescape(Sv(text), &decoded)) return false;
  if (decoded.size() != want) return false;
  if (absl::Base64Escape(decoded) != Sv(text)) return false;
  std::copy(decoded.begin(), decoded.end(), out);
  return true;
}

std::string Base64(const uint8_t* data, size_t n) {
  return absl::Base64Escape(
      absl::string_view(reinterpret_cast<const char*>(data), n));
}

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

absl::StatusOr<PkeyPtr> RawPublicToPkey(const std::array<uint8_t, 32>& raw) {
  PkeyPtr pkey(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, raw.data(),
                                           raw.size()));
  if (!pkey) return absl::InternalError(absl::StrCat("ed25519 key: ", OpenSslError()));
  return pkey;
}

absl::StatusOr<std::array<uint8_t, 32>> RawPublicFromPkey(EVP_PKEY* pkey) {
  if (EVP_PKEY_get_id(pkey) != EVP_PKEY_ED25519) {
    return absl::InvalidArgumentError(
        "not an Ed25519 key; make one with 'cubist keygen' or "
        "'openssl genpkey -algorithm ed25519'");
  }
  std::array<uint8_t, 32> raw{};
  size_t len = raw.size();
  if (EVP_PKEY_get_raw_public_key(pkey, raw.data(), &len) != 1 || len != raw.size()) {
    return absl::InternalError(absl::StrCat("ed25519 key: ", OpenSslError()));
  }
  return raw;
}

}  // namespace

// ---------------------------------------------------------------------------------
// PublicKey

absl::StatusOr<PublicKey> PublicKey::Parse(std::string_view text) {
  text = Trim(text);
  if (text.substr(0, kKeyPrefix.size()) == kKeyPrefix) {
    std::string_view b64 = text.substr(kKeyPrefix.size());
    std::array<uint8_t, 32> raw{};
    if (!DecodeBase64Exact(b64, raw.size(), raw.data())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "public key '", Sv(text.substr(0, 60)),
          "': expected 'ed25519:' and the padded base64 of exactly 32 bytes "
          "(44 characters), as 'cubist keygen' prints"));
    }
    return FromRaw(raw);
  }
  if (text.substr(0, 11) == "-----BEGIN ") {
    BioPtr bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
    if (!bio) return absl::InternalError("public key: BIO_new_mem_buf failed");
    PkeyPtr pkey(PEM_read_bio_PUBKEY(bio.get(), nullptr, NoPassphrase, nullptr));
    if (!pkey) {
      std::string why = OpenSslError();
      return absl::InvalidArgumentError(absl::StrCat(
          "public key: not a PEM PUBLIC KEY block (", why,
          "); give 'ed25519:<base64>' or the output of 'openssl pkey -pubout'"));
    }
    absl::StatusOr<std::array<uint8_t, 32>> raw = RawPublicFromPkey(pkey.get());
    if (!raw.ok()) {
      return absl::Status(raw.status().code(),
                          absl::StrCat("public key: ", raw.status().message()));
    }
    return FromRaw(*raw);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "public key '", Sv(text.substr(0, 60)),
      "': expected 'ed25519:<base64 of 32 bytes>' or a PEM PUBLIC KEY block"));
}

PublicKey PublicKey::FromRaw(const std::array<uint8_t, kEd25519PublicKeySize>& raw) {
  PublicKey k;
  k.raw_ = raw;
  return k;
}

std::string PublicKey::ToString() const {
  return absl::StrCat(Sv(kKeyPrefix), Base64(raw_.data(), raw_.size()));
}

std::string PublicKey::ToPem() const {
  absl::StatusOr<PkeyPtr> pkey = RawPublicToPkey(raw_);
  if (!pkey.ok()) return "";
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PUBKEY(bio.get(), pkey->get()) != 1) return "";
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string PublicKey::Id() const {
  Sha256 h;
  h.Update(raw_.data(), raw_.size());
  return ToHex(h.Finish()).substr(0, 16);
}

bool PublicKey::Verify(std::string_view data, const Ed25519Signature& signature) const {
  absl::StatusOr<PkeyPtr> pkey = RawPublicToPkey(raw_);
  if (!pkey.ok()) return false;
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx) return false;
  // Ed25519 is a "one-shot" algorithm in OpenSSL: no digest, whole message at once.
  if (EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, pkey->get()) != 1) {
    ERR_clear_error();
    return false;
  }
  int rc = EVP_DigestVerify(ctx.get(), signature.data(), signature.size(),
                            reinterpret_cast<const unsigned char*>(data.data()),
                            data.size());
  ERR_clear_error();
  return rc == 1;
}

// ---------------------------------------------------------------------------------
// PrivateKey

struct PrivateKey::Impl {
  PkeyPtr pkey;
};

PrivateKey::PrivateKey(std::unique_ptr<Impl> impl, PublicKey pub)
    : impl_(std::move(impl)), public_key_(pub) {}
PrivateKey::PrivateKey(PrivateKey&&) noexcept = default;
PrivateKey& PrivateKey::operator=(PrivateKey&&) noexcept = default;
PrivateKey::~PrivateKey() = default;

absl::StatusOr<PrivateKey> PrivateKey::Generate() {
  PkeyPtr pkey(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  if (!pkey) {
    return absl::InternalError(absl::StrCat("generate ed25519 key: ", OpenSslError()));
  }
  absl::StatusOr<std::array<uint8_t, 32>> raw = RawPublicFromPkey(pkey.get());
  if (!raw.ok()) return raw.status();
  auto impl = std::make_unique<Impl>();
  impl->pkey = std::move(pkey);
  return PrivateKey(std::move(impl), PublicKey::FromRaw(*raw));
}

absl::StatusOr<PrivateKey> PrivateKey::FromPem(std::string_view pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (!bio) return absl::InternalError("private key: BIO_new_mem_buf failed");
  PkeyPtr pkey(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr));
  if (!pkey) {
    std::string why = OpenSslError();
    return absl::InvalidArgumentError(absl::StrCat(
        "private key: not an unencrypted PEM PRIVATE KEY (", why,
        "); make one with 'cubist keygen'"));
  }
  absl::StatusOr<std::array<uint8_t, 32>> raw = RawPublicFromPkey(pkey.get());
  if (!raw.ok()) {
    return absl::Status(raw.status().code(),
                        absl::StrCat("private key: ", raw.status().message()));
  }
  auto impl = std::make_unique<Impl>();
  impl->pkey = std::move(pkey);
  return PrivateKey(std::move(impl), PublicKey::FromRaw(*raw));
}

absl::StatusOr<std::string> PrivateKey::ToPem() const {
  BioPtr bio(BIO_new(BIO_s_secmem()));
  if (!bio) bio.reset(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), impl_->pkey.get(), nullptr, nullptr,
                                       0, nullptr, nullptr) != 1) {
    return absl::InternalError(absl::StrCat("write private key: ", OpenSslError()));
  }
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<Ed25519Signature> PrivateKey::Sign(std::string_view data) const {
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx ||
      EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, impl_->pkey.get()) != 1) {
    return absl::InternalError(absl::StrCat("ed25519 sign: ", OpenSslError()));
  }
  Ed25519Signature sig{};
  size_t len = sig.size();
  if (EVP_DigestSign(ctx.get(), sig.data(), &len,
                     reinterpret_cast<const unsigned char*>(data.data()),
                     data.size()) != 1 ||
      len != sig.size()) {
    return absl::InternalError(absl::StrCat("ed25519 sign: ", OpenSslError()));
  }
  return sig;
}

// ---------------------------------------------------------------------------------
// Signature files

absl::StatusOr<std::vector<SignatureLine>> ParseSignatureFile(std::string_view text,
                                                              std::string_view source) {
  if (text.size() > kMaxSignatureFileSize) {
    return absl::PermissionDeniedError(absl::StrCat(
        Sv(source), ": ", text.size(), " bytes, more than the ", kMaxSignatureFileSize,
        " a signature file may have; it is not a cubist signature"));
  }
  std::vector<SignatureLine> out;
  int line_no = 0;
  for (absl::string_view raw_line : absl::StrSplit(Sv(text), '\n')) {
    ++line_no;
    std::string_view line = Trim(Sv(raw_line));
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields =
        absl::StrSplit(Sv(line), absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto bad = [&](std::string_view why) {
      return absl::PermissionDeniedError(absl::StrCat(
          Sv(source), ":", line_no, ": ", Sv(why), "; ", Sv(kSigFormat),
          "; sign the manifest again with 'cubist sign'"));
    };
    if (fields.size() != 3 || fields[0] != "ed25519") {
      return bad("malformed signature line");
    }
    SignatureLine sl;
    if (fields[1].size() != 16 || !IsLowerHex(Sv(fields[1]))) {
      return bad("key id must be 16 lowercase hex digits");
    }
    sl.key_id = std::string(fields[1]);
    if (!DecodeBase64Exact(Sv(fields[2]), sl.signature.size(), sl.signature.data())) {
      return bad("signature must be the padded base64 of 64 bytes");
    }
    out.push_back(std::move(sl));
  }
  if (out.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        Sv(source), ": holds no signature; sign the manifest with 'cubist sign'"));
  }
  return out;
}

std::string FormatSignatureLine(const SignatureLine& line) {
  return absl::StrCat("ed25519 ", line.key_id, " ",
                      Base64(line.signature.data(), line.signature.size()), "\n");
}

std::string FormatSignatureLine(const PublicKey& key, const Ed25519Signature& signature) {
  return FormatSignatureLine(SignatureLine{key.Id(), signature});
}

absl::Status VerifyDetachedSignature(std::string_view data,
                                     std::string_view signature_file,
                                     absl::Span<const PublicKey> trusted,
                                     std::string_view source) {
  if (trusted.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(source), ": no trusted keys to verify the signature with"));
  }
  absl::StatusOr<std::vector<SignatureLine>> lines =
      ParseSignatureFile(signature_file, source);
  if (!lines.ok()) return lines.status();

  std::vector<std::string> mismatched;  // lines by a trusted key id that did not verify
  std::vector<std::string> untrusted;   // lines by key ids nobody trusts
  for (const SignatureLine& line : *lines) {
    bool id_trusted = false;
    // The key id is an unauthenticated label, so every trusted key is tried; the set is
    // small (a handful during rotation) and a verification costs tens of microseconds.
    for (const PublicKey& key : trusted) {
      if (key.Verify(data, line.signature)) return absl::OkStatus();
      id_trusted |= key.Id() == line.key_id;
    }
    (id_trusted ? mismatched : untrusted).push_back(line.key_id);
  }
  if (!mismatched.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        Sv(source), ": bad signature: the signature by trusted key ",
        absl::StrJoin(mismatched, ", "),
        " does not match the manifest bytes (the manifest or its signature was altered "
        "or is from another release); fetch both again, or ask the publisher to "
        "re-sign"));
  }
  std::vector<std::string> trusted_ids;
  for (const PublicKey& key : trusted) trusted_ids.push_back(key.Id());
  return absl::PermissionDeniedError(absl::StrCat(
      Sv(source), ": signed only by untrusted key", untrusted.size() > 1 ? "s " : " ",
      absl::StrJoin(untrusted, ", "), " (trusted: ", absl::StrJoin(trusted_ids, ", "),
      "); if the publisher rotated its key, add the new public key with --trusted-key "
      "or CUBIST_TRUSTED_KEYS"));
}

}  // namespace cubist
