#include "manifest/signature.h"

#include <openssl/evp.h>
#include <openssl/pem.h>

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

std::string Unhex(std::string_view hex) {
  return absl::HexStringToBytes(absl::string_view(hex.data(), hex.size()));
}

// RFC 8032 section 7.1, TEST 2 (one-byte message 0x72).
constexpr char kRfcSeed[] =
    "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb";
constexpr char kRfcPublic[] =
    "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";
constexpr char kRfcSignature[] =
    "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
    "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00";

// PKCS#8 PEM of a raw Ed25519 seed: the fixed DER prefix of RFC 8410, then the seed.
std::string SeedToPem(std::string_view seed_hex) {
  std::string der = Unhex("302e020100300506032b657004220420") + Unhex(seed_hex);
  return absl::StrCat("-----BEGIN PRIVATE KEY-----\n", absl::Base64Escape(der),
                      "\n-----END PRIVATE KEY-----\n");
}

Ed25519Signature SigFromHex(std::string_view hex) {
  std::string raw = Unhex(hex);
  Ed25519Signature sig{};
  std::copy(raw.begin(), raw.end(), sig.begin());
  return sig;
}

std::string SigHex(const Ed25519Signature& sig) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(sig.data()), sig.size()));
}

TEST(SignatureTest, MatchesRfc8032TestVector) {
  absl::StatusOr<PrivateKey> key = PrivateKey::FromPem(SeedToPem(kRfcSeed));
  CUBIST_ASSERT_OK(key.status());
  std::string raw_pub(reinterpret_cast<const char*>(key->public_key().raw().data()), 32);
  EXPECT_EQ(absl::BytesToHexString(raw_pub), kRfcPublic);
  absl::StatusOr<Ed25519Signature> sig = key->Sign("\x72");
  CUBIST_ASSERT_OK(sig.status());
  EXPECT_EQ(SigHex(*sig), kRfcSignature);
  EXPECT_TRUE(key->public_key().Verify("\x72", SigFromHex(kRfcSignature)));
  EXPECT_FALSE(key->public_key().Verify("\x73", SigFromHex(kRfcSignature)));
}

TEST(SignatureTest, GeneratedKeysSignAndVerifyExactBytes) {
  absl::StatusOr<PrivateKey> a = PrivateKey::Generate();
  absl::StatusOr<PrivateKey> b = PrivateKey::Generate();
  CUBIST_ASSERT_OK(a.status());
  CUBIST_ASSERT_OK(b.status());
  EXPECT_NE(a->public_key(), b->public_key());
  std::string data = "{\"name\": \"x\", \"version\": 3}\n";
  absl::StatusOr<Ed25519Signature> sig = a->Sign(data);
  CUBIST_ASSERT_OK(sig.status());
  EXPECT_TRUE(a->public_key().Verify(data, *sig));
  EXPECT_FALSE(b->public_key().Verify(data, *sig));
  // Any change of the bytes, even trailing whitespace, breaks the signature.
  EXPECT_FALSE(a->public_key().Verify(data + " ", *sig));
  std::string flipped = data;
  flipped[5] ^= 1;
  EXPECT_FALSE(a->public_key().Verify(flipped, *sig));
  Ed25519Signature bad = *sig;
  bad[63] ^= 0x40;
  EXPECT_FALSE(a->public_key().Verify(data, bad));
}

TEST(SignatureTest, PrivateKeyPemRoundTrip) {
  absl::StatusOr<PrivateKey> key = PrivateKey::Generate();
  CUBIST_ASSERT_OK(key.status());
  absl::StatusOr<std::string> pem = key->ToPem();
  CUBIST_ASSERT_OK(pem.status());
  EXPECT_THAT(*pem, HasSubstr("-----BEGIN PRIVATE KEY-----"));
  absl::StatusOr<PrivateKey> again = PrivateKey::FromPem(*pem);
  CUBIST_ASSERT_OK(again.status());
  EXPECT_EQ(again->public_key(), key->public_key());
}

TEST(SignatureTest, PublicKeyStringAndPemRoundTrip) {
  absl::StatusOr<PrivateKey> key = PrivateKey::FromPem(SeedToPem(kRfcSeed));
  CUBIST_ASSERT_OK(key.status());
  PublicKey pub = key->public_key();
  std::string s = pub.ToString();
  EXPECT_EQ(s, "ed25519:" + absl::Base64Escape(Unhex(kRfcPublic)));
  EXPECT_EQ(s.size(), 8u + 44u);
  absl::StatusOr<PublicKey> parsed = PublicKey::Parse("  " + s + "\n");
  CUBIST_ASSERT_OK(parsed.status());
  EXPECT_EQ(*parsed, pub);
  absl::StatusOr<PublicKey> from_pem = PublicKey::Parse(pub.ToPem());
  CUBIST_ASSERT_OK(from_pem.status());
  EXPECT_EQ(*from_pem, pub);
  // Id: the first 16 hex digits of SHA-256 over the raw key.
  EXPECT_EQ(pub.Id(), Sha256Hex(Unhex(kRfcPublic)).substr(0, 16));
}

TEST(SignatureTest, PublicKeyParseRejectsMalformedText) {
  EXPECT_THAT(PublicKey::Parse("ed25519:AAAA"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exactly 32 bytes")));
  // 32 bytes but unpadded: not canonical.
  std::string b64 = absl::Base64Escape(std::string(32, 'a'));
  ASSERT_EQ(b64.back(), '=');
  EXPECT_THAT(PublicKey::Parse("ed25519:" + b64.substr(0, b64.size() - 1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("padded base64")));
  CUBIST_EXPECT_OK(PublicKey::Parse("ed25519:" + b64).status());
  EXPECT_THAT(PublicKey::Parse("rsa:" + b64),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("expected 'ed25519:<base64 of 32 bytes>'")));
  EXPECT_THAT(PublicKey::Parse("-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a PEM PUBLIC KEY block")));
}

TEST(SignatureTest, RejectsKeysOfOtherAlgorithms) {
  EVP_PKEY* ec = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
  ASSERT_NE(ec, nullptr);
  BIO* bio = BIO_new(BIO_s_mem());
  ASSERT_EQ(PEM_write_bio_PUBKEY(bio, ec), 1);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string pub_pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  bio = BIO_new(BIO_s_mem());
  ASSERT_EQ(PEM_write_bio_PrivateKey(bio, ec, nullptr, nullptr, 0, nullptr, nullptr), 1);
  n = BIO_get_mem_data(bio, &data);
  std::string priv_pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  EVP_PKEY_free(ec);
  EXPECT_THAT(PublicKey::Parse(pub_pem),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an Ed25519 key")));
  EXPECT_THAT(PrivateKey::FromPem(priv_pem),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not an Ed25519 key")));
}

TEST(SignatureTest, EncryptedPrivateKeyFailsWithoutPrompting) {
  absl::StatusOr<PrivateKey> key = PrivateKey::FromPem(SeedToPem(kRfcSeed));
  CUBIST_ASSERT_OK(key.status());
  // Re-encode the same key with a passphrase through OpenSSL directly.
  std::string plain = SeedToPem(kRfcSeed);
  BIO* in = BIO_new_mem_buf(plain.data(), static_cast<int>(plain.size()));
  EVP_PKEY* pkey = PEM_read_bio_PrivateKey(in, nullptr, nullptr, nullptr);
  BIO_free(in);
  ASSERT_NE(pkey, nullptr);
  BIO* out = BIO_new(BIO_s_mem());
  char pass[] = "secret";
  ASSERT_EQ(PEM_write_bio_PKCS8PrivateKey(out, pkey, EVP_aes_256_cbc(), pass, 6, nullptr,
                                          nullptr),
            1);
  char* data = nullptr;
  long n = BIO_get_mem_data(out, &data);
  std::string encrypted(data, static_cast<size_t>(n));
  BIO_free(out);
  EVP_PKEY_free(pkey);
  ASSERT_THAT(encrypted, HasSubstr("ENCRYPTED PRIVATE KEY"));
  // stdin is not read: a prompt would hang here until the ctest timeout.
  EXPECT_THAT(PrivateKey::FromPem(encrypted),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not an unencrypted PEM PRIVATE KEY")));
  EXPECT_THAT(PrivateKey::FromPem("garbage"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cubist keygen")));
}

TEST(SignatureFileTest, ParsesLinesCommentsAndCrlf) {
  absl::StatusOr<PrivateKey> key = PrivateKey::FromPem(SeedToPem(kRfcSeed));
  CUBIST_ASSERT_OK(key.status());
  std::string line = FormatSignatureLine(key->public_key(), SigFromHex(kRfcSignature));
  EXPECT_EQ(line, absl::StrCat("ed25519 ", key->public_key().Id(), " ",
                               absl::Base64Escape(Unhex(kRfcSignature)), "\n"));
  std::string text = "# comment\n\n" + line.substr(0, line.size() - 1) + "\r\n  \n" + line;
  absl::StatusOr<std::vector<SignatureLine>> lines = ParseSignatureFile(text, "m.sig");
  CUBIST_ASSERT_OK(lines.status());
  ASSERT_EQ(lines->size(), 2u);
  EXPECT_EQ((*lines)[0].key_id, key->public_key().Id());
  EXPECT_EQ(SigHex((*lines)[1].signature), kRfcSignature);
  EXPECT_EQ(FormatSignatureLine((*lines)[0]), line);
}

TEST(SignatureFileTest, MalformedFilesAreRefusedWithLineNumbers) {
  std::string sig64 = absl::Base64Escape(std::string(64, 'x'));
  EXPECT_THAT(ParseSignatureFile("", "m.sig"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("m.sig: holds no signature")));
  EXPECT_THAT(ParseSignatureFile("# only a comment\n", "m.sig"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("no signature")));
  EXPECT_THAT(ParseSignatureFile("\nrsa 0123456789abcdef " + sig64, "m.sig"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("m.sig:2: malformed signature line")));
  EXPECT_THAT(ParseSignatureFile("ed25519 0123456789ABCDEF " + sig64, "m.sig"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("m.sig:1: key id must be 16 lowercase hex")));
  EXPECT_THAT(ParseSignatureFile("ed25519 0123456789abcdef AAAA", "m.sig"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("padded base64 of 64 bytes")));
  EXPECT_THAT(ParseSignatureFile("ed25519 0123456789abcdef " + sig64 + " extra", "m.sig"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("malformed")));
  EXPECT_THAT(ParseSignatureFile(std::string(kMaxSignatureFileSize + 1, '#'), "m.sig"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("more than the 65536")));
  CUBIST_EXPECT_OK(ParseSignatureFile("ed25519 0123456789abcdef " + sig64, "m.sig").status());
}

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto* k : {&old_key_, &new_key_, &other_key_}) {
      absl::StatusOr<PrivateKey> g = PrivateKey::Generate();
      ASSERT_TRUE(g.ok());
      k->emplace(*std::move(g));
    }
  }
  std::string SigFile(const PrivateKey& key, std::string_view data) {
    absl::StatusOr<Ed25519Signature> s = key.Sign(data);
    EXPECT_TRUE(s.ok());
    return FormatSignatureLine(key.public_key(), *s);
  }
  std::optional<PrivateKey> old_key_, new_key_, other_key_;
  const std::string data_ = "{\"schema\": \"cubist.manifest/1\", \"version\": 9}";
};

TEST_F(VerifyTest, GoodSignatureByATrustedKey) {
  std::vector<PublicKey> trusted = {new_key_->public_key()};
  CUBIST_EXPECT_OK(VerifyDetachedSignature(data_, SigFile(*new_key_, data_), trusted, "s"));
}

TEST_F(VerifyTest, KeyRotationEitherTrustedKeyOrEitherLine) {
  // Users trust old and new during the rotation; the publisher may sign with either.
  std::vector<PublicKey> both = {old_key_->public_key(), new_key_->public_key()};
  CUBIST_EXPECT_OK(VerifyDetachedSignature(data_, SigFile(*old_key_, data_), both, "s"));
  CUBIST_EXPECT_OK(VerifyDetachedSignature(data_, SigFile(*new_key_, data_), both, "s"));
  // Or the publisher signs with both and users trust only one of them.
  std::string two = SigFile(*old_key_, data_) + SigFile(*new_key_, data_);
  std::vector<PublicKey> only_new = {new_key_->public_key()};
  std::vector<PublicKey> only_old = {old_key_->public_key()};
  CUBIST_EXPECT_OK(VerifyDetachedSignature(data_, two, only_new, "s"));
  CUBIST_EXPECT_OK(VerifyDetachedSignature(data_, two, only_old, "s"));
}

TEST_F(VerifyTest, AlteredBytesAreRefused) {
  std::vector<PublicKey> trusted = {new_key_->public_key()};
  std::string altered = data_;
  altered[altered.size() - 2] = '8';  // version 9 -> 8
  EXPECT_THAT(VerifyDetachedSignature(altered, SigFile(*new_key_, data_), trusted, "m.sig"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr(absl::StrCat("m.sig: bad signature: the signature by "
                                              "trusted key ",
                                              new_key_->public_key().Id(),
                                              " does not match the manifest bytes"))));
}

TEST_F(VerifyTest, UntrustedSignerIsRefusedNamingBothKeys) {
  std::vector<PublicKey> trusted = {new_key_->public_key()};
  absl::Status s = VerifyDetachedSignature(data_, SigFile(*other_key_, data_), trusted, "m.sig");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied,
                          HasSubstr("signed only by untrusted key " +
                                    other_key_->public_key().Id())));
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied,
                          HasSubstr("(trusted: " + new_key_->public_key().Id() + ")")));
}

TEST_F(VerifyTest, ForgedKeyIdDoesNotHelp) {
  // A line that claims a trusted key's id but is signed by another key.
  absl::StatusOr<Ed25519Signature> s = other_key_->Sign(data_);
  CUBIST_ASSERT_OK(s.status());
  std::string line = FormatSignatureLine(new_key_->public_key(), *s);
  std::vector<PublicKey> trusted = {new_key_->public_key()};
  EXPECT_THAT(VerifyDetachedSignature(data_, line, trusted, "m.sig"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("bad signature")));
}

TEST_F(VerifyTest, NoTrustedKeysIsACallerError) {
  EXPECT_THAT(VerifyDetachedSignature(data_, SigFile(*new_key_, data_), {}, "m.sig"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no trusted keys")));
}

}  // namespace
}  // namespace cubist
