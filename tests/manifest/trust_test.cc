// Trusted keys (flag, file, environment), the signature and expiry policy checks, and
// the `cubist keygen` / `cubist sign` commands end to end (including interoperation
// with the openssl command line tool, when it is installed).
#include "manifest/trust.h"

#include <sys/stat.h>

#include <map>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/sha256.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/fault_http_server.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::CliPath;
using ::cubist::testing::FaultHttpServer;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::RunCommand;
using ::cubist::testing::StatusIs;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::testing::HasSubstr;

PublicKey NewKey() {
  absl::StatusOr<PrivateKey> k = PrivateKey::Generate();
  EXPECT_TRUE(k.ok());
  return k->public_key();
}

TEST(KeyFileTest, ParsesLinesCommentsAndPemBlocks) {
  PublicKey a = NewKey(), b = NewKey(), c = NewKey();
  std::string text = absl::StrCat("# keys of the kernel team\n\n", a.ToString(),
                                  "  # 2025 key\r\n", b.ToPem(), "\n", c.ToString(), "\n");
  absl::StatusOr<std::vector<PublicKey>> keys = ParseKeyFile(text, "keys.txt");
  CUBIST_ASSERT_OK(keys.status());
  ASSERT_EQ(keys->size(), 3u);
  EXPECT_EQ((*keys)[0], a);
  EXPECT_EQ((*keys)[1], b);
  EXPECT_EQ((*keys)[2], c);
}

TEST(KeyFileTest, ErrorsNameTheLine) {
  PublicKey a = NewKey();
  EXPECT_THAT(ParseKeyFile("# nothing\n", "keys.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keys.txt: no keys in the trusted key file")));
  EXPECT_THAT(ParseKeyFile(a.ToString() + "\ned25519:AAAA\n", "keys.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keys.txt:2: public key 'ed25519:AAAA'")));
  EXPECT_THAT(ParseKeyFile(a.ToString() + " trailing words\n", "keys.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keys.txt:1: expected one key per line")));
  EXPECT_THAT(ParseKeyFile("\n-----BEGIN PUBLIC KEY-----\nMCow\n", "keys.txt"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("keys.txt:2: PEM block without an -----END line")));
}

TEST(LoadTrustedKeysTest, UnionOfFlagsFilesAndEnvironmentWithoutDuplicates) {
  TempDir dir;
  PublicKey a = NewKey(), b = NewKey(), c = NewKey(), d = NewKey();
  WriteFileOrDie(dir.Join("b.pub"), b.ToString() + "\n");
  WriteFileOrDie(dir.Join("cd.txt"), c.ToString() + "\n" + d.ToPem());
  TrustSources src;
  src.keys = {a.ToString(), dir.Join("b.pub")};
  src.key_files = {dir.Join("cd.txt")};
  // Commas, semicolons and whitespace separate entries; a repeated key counts once.
  src.env = absl::StrCat(" ", a.ToString(), ",", d.ToString(), ";\n", dir.Join("b.pub"));
  absl::StatusOr<std::vector<PublicKey>> keys = LoadTrustedKeys(src);
  CUBIST_ASSERT_OK(keys.status());
  EXPECT_EQ(*keys, (std::vector<PublicKey>{a, b, c, d}));
}

TEST(LoadTrustedKeysTest, NothingConfiguredMeansNoKeys) {
  TrustSources src;
  src.env = "";
  absl::StatusOr<std::vector<PublicKey>> keys = LoadTrustedKeys(src);
  CUBIST_ASSERT_OK(keys.status());
  EXPECT_TRUE(keys->empty());
}

TEST(LoadTrustedKeysTest, ReadsTheRealEnvironmentWhenNotGiven) {
  PublicKey a = NewKey();
  ASSERT_EQ(::setenv(kTrustedKeysEnv, a.ToString().c_str(), 1), 0);
  absl::StatusOr<std::vector<PublicKey>> keys = LoadTrustedKeys(TrustSources{});
  ::unsetenv(kTrustedKeysEnv);
  CUBIST_ASSERT_OK(keys.status());
  EXPECT_EQ(*keys, std::vector<PublicKey>{a});
}

TEST(LoadTrustedKeysTest, ErrorsNameTheSource) {
  TempDir dir;
  TrustSources bad_env;
  bad_env.env = NewKey().ToString() + ",ed25519:nope";
  EXPECT_THAT(LoadTrustedKeys(bad_env),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("CUBIST_TRUSTED_KEYS entry 2: public key 'ed25519:nope'")));
  TrustSources empty;
  empty.env = "";
  empty.keys = {"  "};
  EXPECT_THAT(LoadTrustedKeys(empty),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--trusted-key: empty")));
  TrustSources missing;
  missing.env = "";
  missing.keys = {dir.Join("absent.pub")};
  EXPECT_THAT(LoadTrustedKeys(missing),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("--trusted-key: trusted key file " + dir.Join("absent.pub"))));
  TrustSources missing_file;
  missing_file.env = "";
  missing_file.key_files = {dir.Join("absent.txt")};
  EXPECT_THAT(LoadTrustedKeys(missing_file),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("--trusted-keys-file")));
  WriteFileOrDie(dir.Join("huge.txt"), std::string(kMaxKeyFileSize + 1, '#'));
  TrustSources huge;
  huge.env = "";
  huge.key_files = {dir.Join("huge.txt")};
  EXPECT_THAT(LoadTrustedKeys(huge),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("larger than the limit")));
}

class PolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<PrivateKey> k = PrivateKey::Generate();
    ASSERT_TRUE(k.ok());
    key_.emplace(*std::move(k));
    policy_.trusted_keys = {key_->public_key()};
    absl::StatusOr<Ed25519Signature> s = key_->Sign(bytes_);
    ASSERT_TRUE(s.ok());
    sig_ = FormatSignatureLine(key_->public_key(), *s);
  }
  std::optional<PrivateKey> key_;
  TrustPolicy policy_;
  std::string bytes_ = "{\"name\": \"moe\", \"version\": 4}";
  std::string sig_;
};

TEST_F(PolicyTest, NoTrustedKeysAcceptsUnsignedManifests) {
  CUBIST_EXPECT_OK(CheckManifestSignature(bytes_, std::nullopt, TrustPolicy{}, "m.json"));
  // ...and does not even look at a broken signature file.
  CUBIST_EXPECT_OK(CheckManifestSignature(bytes_, "junk", TrustPolicy{}, "m.json"));
}

TEST_F(PolicyTest, UnsignedManifestIsRefusedWhenKeysAreConfigured) {
  EXPECT_THAT(CheckManifestSignature(bytes_, std::nullopt, policy_, "https://h/m.json"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("https://h/m.json: unsigned manifest: "
                                 "https://h/m.json.sig does not exist")));
}

TEST_F(PolicyTest, SignedManifestPassesAndAlteredOneIsRefused) {
  CUBIST_EXPECT_OK(CheckManifestSignature(bytes_, sig_, policy_, "m.json"));
  std::string altered = bytes_;
  altered.replace(altered.find('4'), 1, "5");
  EXPECT_THAT(CheckManifestSignature(altered, sig_, policy_, "m.json"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("m.json.sig: bad signature")));
  EXPECT_THAT(CheckManifestSignature(bytes_, "ed25519 x y\n", policy_, "m.json"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("m.json.sig:1:")));
}

TEST(ExpiryTest, ExpiredManifestIsRefusedUnlessAllowed) {
  Manifest m;
  m.name = "moe";
  m.version = 3;
  m.source = "m.json";
  absl::Time now = absl::FromUnixSeconds(1767225600);  // 2026-01-01T00:00:00Z
  TrustPolicy policy;
  CUBIST_EXPECT_OK(CheckManifestExpiry(m, policy, now));  // no expires: never expires
  m.expires = now + absl::Seconds(1);
  CUBIST_EXPECT_OK(CheckManifestExpiry(m, policy, now));
  m.expires = now;  // the instant of expiry is expired
  EXPECT_THAT(CheckManifestExpiry(m, policy, now),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("m.json: manifest 'moe' version 3 expired at "
                                 "2026-01-01T00:00:00Z (now 2026-01-01T00:00:00Z)")));
  m.expires = now - absl::Hours(24);
  EXPECT_THAT(CheckManifestExpiry(m, policy, now),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("pass --allow-expired to use it deliberately")));
  policy.allow_expired = true;
  CUBIST_EXPECT_OK(CheckManifestExpiry(m, policy, now));
}

TEST(SignatureLocationTest, AppendsSig) {
  EXPECT_EQ(SignatureLocation("https://h/a/manifest.json"), "https://h/a/manifest.json.sig");
  EXPECT_EQ(SignatureLocation("/srv/m.json"), "/srv/m.json.sig");
}

// ---------------------------------------------------------------------------------
// The CLI: keygen, sign, sign --check.

std::string Q(const std::string& s) { return "'" + s + "'"; }

class SignCliTest : public ::testing::Test {
 protected:
  int Cubist(const std::string& args, std::string* out) {
    return RunCommand("env -u CUBIST_TRUSTED_KEYS " + Q(CliPath()) + " " + args, out);
  }
  // Runs `cubist keygen -o <name>.pem -q` and returns the printed public key.
  std::string Keygen(const std::string& name) {
    std::string out;
    EXPECT_EQ(Cubist("keygen -q -o " + Q(dir_.Join(name + ".pem")), &out), 0) << out;
    return std::string(absl::StripAsciiWhitespace(out));
  }
  TempDir dir_;
};

TEST_F(SignCliTest, KeygenWritesAPrivateKey0600AndAPublicKey) {
  std::string out;
  ASSERT_EQ(Cubist("keygen -o " + Q(dir_.Join("k.pem")), &out), 0) << out;
  struct stat st;
  ASSERT_EQ(::stat(dir_.Join("k.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_THAT(ReadFileOrDie(dir_.Join("k.pem")), HasSubstr("-----BEGIN PRIVATE KEY-----"));
  std::string pub_text = ReadFileOrDie(dir_.Join("k.pub"));
  absl::StatusOr<std::vector<PublicKey>> pub = ParseKeyFile(pub_text, "k.pub");
  CUBIST_ASSERT_OK(pub.status());
  ASSERT_EQ(pub->size(), 1u);
  // The last line printed is the key string, the same as the .pub file holds.
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.back(), (*pub)[0].ToString());
  EXPECT_THAT(out, HasSubstr("key id:      " + (*pub)[0].Id()));
  // --public-of prints the same key from the private key file.
  std::string again;
  ASSERT_EQ(Cubist("keygen -q --public-of " + Q(dir_.Join("k.pem")), &again), 0) << again;
  EXPECT_EQ(absl::StripAsciiWhitespace(again), (*pub)[0].ToString());
}

TEST_F(SignCliTest, KeygenRefusesToOverwriteWithoutForce) {
  std::string first = Keygen("k");
  std::string out;
  EXPECT_EQ(Cubist("keygen -o " + Q(dir_.Join("k.pem")), &out), 1);
  EXPECT_THAT(out, HasSubstr("cubist: error: keygen: " + dir_.Join("k.pem") +
                             " already exists; choose another name with -o, or pass "
                             "--force"));
  ASSERT_EQ(Cubist("keygen -q --force -o " + Q(dir_.Join("k.pem")), &out), 0) << out;
  EXPECT_NE(absl::StripAsciiWhitespace(out), first);
}

TEST_F(SignCliTest, SignThenCheckAndTamperingIsRefused) {
  std::string pub = Keygen("k");
  std::string manifest = dir_.Join("manifest.json");
  WriteFileOrDie(manifest, "{\"schema\": \"cubist.manifest/1\", \"version\": 2}\n");
  std::string out;
  ASSERT_EQ(Cubist("sign " + Q(manifest) + " --key " + Q(dir_.Join("k.pem")), &out), 0)
      << out;
  std::string sig = ReadFileOrDie(manifest + ".sig");
  absl::StatusOr<std::vector<SignatureLine>> lines = ParseSignatureFile(sig, "sig");
  CUBIST_ASSERT_OK(lines.status());
  ASSERT_EQ(lines->size(), 1u);

  // The key string, the .pub file and the environment all work as trust sources.
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " --trusted-key " + pub, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("good signature"));
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " --trusted-key " +
                       Q(dir_.Join("k.pub")), &out),
            0)
      << out;
  EXPECT_EQ(RunCommand("CUBIST_TRUSTED_KEYS=" + pub + " " + Q(CliPath()) + " sign --check " +
                           Q(manifest), &out),
            0)
      << out;

  // One changed byte: exit code 7 (permission), and the reason.
  WriteFileOrDie(manifest, "{\"schema\": \"cubist.manifest/1\", \"version\": 1}\n");
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " --trusted-key " + pub, &out), 7);
  EXPECT_THAT(out, HasSubstr("cubist: error: " + manifest + ".sig: bad signature"));

  // A signature file elsewhere (-o), checked with the same -o.
  WriteFileOrDie(manifest, "{\"schema\": \"cubist.manifest/1\", \"version\": 2}\n");
  std::string elsewhere = dir_.Join("detached.sig");
  ASSERT_EQ(Cubist("sign -q " + Q(manifest) + " --key " + Q(dir_.Join("k.pem")) + " -o " +
                       Q(elsewhere), &out),
            0);
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " -o " + Q(elsewhere) +
                       " --trusted-key " + pub, &out),
            0)
      << out;

  // No signature at all.
  ASSERT_EQ(::unlink((manifest + ".sig").c_str()), 0);
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " --trusted-key " + pub, &out), 7);
  EXPECT_THAT(out, HasSubstr(manifest + ": unsigned manifest: " + manifest +
                             ".sig does not exist"));

  // A key that did not sign it.
  std::string other = Keygen("other");
  ASSERT_EQ(Cubist("sign -q " + Q(manifest) + " --key " + Q(dir_.Join("other.pem")), &out),
            0);
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " --trusted-key " + pub, &out), 7);
  EXPECT_THAT(out, HasSubstr("signed only by untrusted key"));
}

TEST_F(SignCliTest, AppendSignsWithOldAndNewKeyForRotation) {
  std::string old_pub = Keygen("old");
  std::string new_pub = Keygen("new");
  std::string manifest = dir_.Join("m.json");
  WriteFileOrDie(manifest, "{}\n");
  std::string out;
  ASSERT_EQ(Cubist("sign -q " + Q(manifest) + " --key " + Q(dir_.Join("old.pem")), &out), 0);
  ASSERT_EQ(Cubist("sign -q --append " + Q(manifest) + " --key " + Q(dir_.Join("new.pem")),
                   &out),
            0)
      << out;
  // Signing again with the same key replaces its line instead of adding one.
  ASSERT_EQ(Cubist("sign -q --append " + Q(manifest) + " --key " + Q(dir_.Join("new.pem")),
                   &out),
            0);
  absl::StatusOr<std::vector<SignatureLine>> lines =
      ParseSignatureFile(ReadFileOrDie(manifest + ".sig"), "sig");
  CUBIST_ASSERT_OK(lines.status());
  ASSERT_EQ(lines->size(), 2u);
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " --trusted-key " + old_pub, &out), 0);
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " --trusted-key " + new_pub, &out), 0);
  // Without --append the file holds the last key's signature only.
  ASSERT_EQ(Cubist("sign -q " + Q(manifest) + " --key " + Q(dir_.Join("new.pem")), &out), 0);
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " --trusted-key " + old_pub, &out), 7);
}

TEST_F(SignCliTest, SignErrors) {
  std::string out;
  WriteFileOrDie(dir_.Join("m.json"), "{}");
  EXPECT_EQ(Cubist("sign " + Q(dir_.Join("m.json")), &out), 8);
  EXPECT_THAT(out, HasSubstr("sign: no signing key; pass --key KEY.pem"));
  WriteFileOrDie(dir_.Join("bad.pem"), "not a key");
  EXPECT_EQ(Cubist("sign " + Q(dir_.Join("m.json")) + " --key " + Q(dir_.Join("bad.pem")),
                   &out),
            8);
  EXPECT_THAT(out, HasSubstr("not an unencrypted PEM PRIVATE KEY"));
  EXPECT_EQ(Cubist("sign --check " + Q(dir_.Join("m.json")), &out), 8);
  EXPECT_THAT(out, HasSubstr("sign --check: no trusted keys"));
  EXPECT_EQ(Cubist("sign " + Q(dir_.Join("absent.json")) + " --key k", &out), 5);
}

bool HaveOpenssl() { return RunCommand("openssl version") == 0; }

TEST_F(SignCliTest, InteroperatesWithTheOpensslCommandLine) {
  if (!HaveOpenssl()) GTEST_SKIP() << "openssl command not installed";
  std::string out;
  // A key made by openssl signs with cubist; its PEM public key is a trusted key.
  ASSERT_EQ(RunCommand("openssl genpkey -algorithm ed25519 -out " + Q(dir_.Join("o.pem")) +
                           " && openssl pkey -in " + Q(dir_.Join("o.pem")) + " -pubout -out " +
                           Q(dir_.Join("o.pub.pem")),
                       &out),
            0)
      << out;
  std::string manifest = dir_.Join("m.json");
  WriteFileOrDie(manifest, cubist::testing::RandomBytes(5000, 7));
  ASSERT_EQ(Cubist("sign -q " + Q(manifest) + " --key " + Q(dir_.Join("o.pem")), &out), 0)
      << out;
  EXPECT_EQ(Cubist("sign --check " + Q(manifest) + " --trusted-keys-file " +
                       Q(dir_.Join("o.pub.pem")), &out),
            0)
      << out;
  // And openssl verifies cubist's signature bytes over the exact manifest bytes.
  absl::StatusOr<std::vector<SignatureLine>> lines =
      ParseSignatureFile(ReadFileOrDie(manifest + ".sig"), "sig");
  CUBIST_ASSERT_OK(lines.status());
  const Ed25519Signature& s = (*lines)[0].signature;
  WriteFileOrDie(dir_.Join("raw.sig"), std::string(reinterpret_cast<const char*>(s.data()),
                                                   s.size()));
  EXPECT_EQ(RunCommand("openssl pkeyutl -verify -rawin -pubin -inkey " +
                           Q(dir_.Join("o.pub.pem")) + " -in " + Q(manifest) + " -sigfile " +
                           Q(dir_.Join("raw.sig")),
                       &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("Signature Verified Successfully"));
}

// ---------------------------------------------------------------------------------
// `cubist fetch` and `verify` with trust configured: signatures before parsing,
// rollback and expiry refusals with their overrides, key rotation.

class FetchTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = FaultHttpServer::Start();
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    for (int i = 0; i < 3; ++i) {
      std::string data = cubist::testing::RandomBytes(5000 + 100 * i, 50 + i);
      files_.push_back({absl::StrCat("cubins/k", i, ".cubin"), data});
      server_->Serve("/repo/" + files_.back().first, data);
    }
    for (const char* name : {"old", "new", "stranger"}) {
      absl::StatusOr<PrivateKey> k = PrivateKey::Generate();
      ASSERT_TRUE(k.ok());
      absl::StatusOr<std::string> pem = k->ToPem();
      ASSERT_TRUE(pem.ok());
      WriteFileOrDie(dir_.Join(std::string(name) + ".pem"), *pem);
      pub_[name] = k->public_key().ToString();
    }
  }
  std::string ManifestJson(int64_t version, const std::string& expires = "") {
    std::string arts;
    for (const auto& [path, data] : files_) {
      absl::StrAppend(&arts, arts.empty() ? "" : ", ", R"({"path": ")", path,
                      R"(", "sha256": ")", Sha256Hex(data), R"(", "size": )", data.size(), "}");
    }
    return absl::StrCat(R"({"schema": "cubist.manifest/1", "name": "signed-set", "version": )",
                        version,
                        expires.empty() ? "" : absl::StrCat(R"(, "expires": ")", expires, "\""),
                        R"(, "base_urls": [")", server_->Url("/repo/"), R"("], "artifacts": [)",
                        arts, "]}\n");
  }
  // Signs `bytes` with the named keys (one line each) and returns the .sig text.
  std::string Sign(const std::string& bytes, std::initializer_list<const char*> keys) {
    std::string sig;
    for (const char* name : keys) {
      absl::StatusOr<PrivateKey> k =
          PrivateKey::FromPem(ReadFileOrDie(dir_.Join(std::string(name) + ".pem")));
      EXPECT_TRUE(k.ok());
      absl::StatusOr<Ed25519Signature> s = k->Sign(bytes);
      EXPECT_TRUE(s.ok());
      sig += FormatSignatureLine(k->public_key(), *s);
    }
    return sig;
  }
  // Publishes the manifest (and its .sig unless empty) on the server.
  std::string Publish(const std::string& bytes, const std::string& sig) {
    server_->Serve("/repo/manifest.json", bytes);
    if (!sig.empty()) server_->Serve("/repo/manifest.json.sig", sig);
    return server_->Url("/repo/manifest.json");
  }
  int Cubist(const std::string& args, std::string* out) {
    return RunCommand("env -u CUBIST_TRUSTED_KEYS " + Q(CliPath()) + " " + args +
                          " --cache " + Q(dir_.Join("cache")),
                      out);
  }
  int ArtifactRequests() {
    int n = 0;
    for (const auto& [path, data] : files_) n += server_->Count("/repo/" + path);
    return n;
  }

  TempDir dir_;
  std::unique_ptr<FaultHttpServer> server_;
  std::vector<std::pair<std::string, std::string>> files_;
  std::map<std::string, std::string> pub_;
};

TEST_F(FetchTrustTest, SignedManifestOverHttpIsFetched) {
  std::string bytes = ManifestJson(1);
  std::string url = Publish(bytes, Sign(bytes, {"new"}));
  std::string out;
  EXPECT_EQ(Cubist("fetch -q -m " + url + " --trusted-key " + pub_["new"], &out), 0) << out;
  EXPECT_EQ(ArtifactRequests(), 3);
  EXPECT_EQ(server_->Count("/repo/manifest.json.sig"), 1);
}

TEST_F(FetchTrustTest, UnsignedManifestIsRefusedBeforeItIsParsed) {
  // Not even JSON: with keys configured, the signature check comes first, so the error is
  // about the signature (exit 7), not a parse error (exit 8).
  std::string url = Publish("this is not a manifest", "");
  std::string out;
  EXPECT_EQ(Cubist("fetch -q -m " + url + " --trusted-key " + pub_["new"], &out), 7) << out;
  EXPECT_THAT(out, HasSubstr("cubist: error: " + url + ": unsigned manifest"));
  EXPECT_EQ(ArtifactRequests(), 0);
  // Without keys the same bytes are parsed, and rejected as malformed.
  EXPECT_EQ(Cubist("fetch -q -m " + url, &out), 8) << out;
}

TEST_F(FetchTrustTest, TamperedOrForeignSignedManifestIsRefused) {
  std::string bytes = ManifestJson(1);
  std::string sig = Sign(bytes, {"new"});
  std::string tampered = bytes;
  tampered.replace(tampered.find("\"version\": 1"), 12, "\"version\": 9");
  std::string url = Publish(tampered, sig);
  std::string out;
  EXPECT_EQ(Cubist("fetch -q -m " + url + " --trusted-key " + pub_["new"], &out), 7) << out;
  EXPECT_THAT(out, HasSubstr("bad signature"));
  url = Publish(bytes, Sign(bytes, {"stranger"}));
  EXPECT_EQ(Cubist("fetch -q -m " + url + " --trusted-key " + pub_["new"], &out), 7) << out;
  EXPECT_THAT(out, HasSubstr("signed only by untrusted key"));
  EXPECT_EQ(ArtifactRequests(), 0);
}

TEST_F(FetchTrustTest, KeyRotationOldAndNewKeysTogether) {
  std::string bytes = ManifestJson(1);
  std::string url = Publish(bytes, Sign(bytes, {"old", "new"}));
  std::string out;
  // Users who still trust only the old key, and users who moved to the new one.
  EXPECT_EQ(Cubist("fetch -q -m " + url + " --trusted-key " + pub_["old"], &out), 0) << out;
  EXPECT_EQ(Cubist("fetch -q -m " + url + " --trusted-key " + pub_["new"], &out), 0) << out;
  // A manifest signed only by the new key, for a user who trusts both (flag + env).
  bytes = ManifestJson(2);
  url = Publish(bytes, Sign(bytes, {"new"}));
  EXPECT_EQ(RunCommand("CUBIST_TRUSTED_KEYS=" + pub_["new"] + " " + Q(CliPath()) +
                           " fetch -q -m " + url + " --trusted-key " + pub_["old"] +
                           " --cache " + Q(dir_.Join("cache")),
                       &out),
            0)
      << out;
}

TEST_F(FetchTrustTest, RollbackIsRefusedUnlessAllowed) {
  std::string v2 = ManifestJson(2), v1 = ManifestJson(1);
  std::string out;
  std::string url = Publish(v2, Sign(v2, {"new"}));
  std::string trust = " --trusted-key " + pub_["new"];
  ASSERT_EQ(Cubist("fetch -q -m " + url + trust, &out), 0) << out;
  EXPECT_EQ(ReadFileOrDie(dir_.Join("cache/state/versions/signed-set")),
            absl::StrCat("cubist.version-state/1\nname signed-set\nversion 2\ndigest ",
                         Sha256Hex(v2), "\n"));
  // A mirror now serves the older, validly signed release.
  url = Publish(v1, Sign(v1, {"new"}));
  EXPECT_EQ(Cubist("fetch -q -m " + url + trust, &out), 6) << out;
  EXPECT_THAT(out, HasSubstr("manifest 'signed-set' version 1 is older than version 2 already "
                             "verified in this cache"));
  EXPECT_THAT(out, HasSubstr("--allow-rollback"));
  EXPECT_EQ(Cubist("verify -m " + url + trust, &out), 6) << out;  // read-only commands too
  EXPECT_EQ(Cubist("fetch -q -m " + url + trust + " --allow-rollback", &out), 0) << out;
  // The record keeps version 2: protection resumes without the flag.
  EXPECT_EQ(Cubist("fetch -q -m " + url + trust, &out), 6) << out;
}

TEST_F(FetchTrustTest, ExpiredManifestIsRefusedUnlessAllowed) {
  std::string bytes = ManifestJson(1, "2020-01-01T00:00:00Z");
  std::string url = Publish(bytes, Sign(bytes, {"new"}));
  std::string out;
  std::string trust = " --trusted-key " + pub_["new"];
  EXPECT_EQ(Cubist("fetch -q -m " + url + trust, &out), 6) << out;
  EXPECT_THAT(out, HasSubstr("expired at 2020-01-01T00:00:00Z"));
  EXPECT_THAT(out, HasSubstr("--allow-expired"));
  EXPECT_EQ(ArtifactRequests(), 0);
  EXPECT_EQ(Cubist("fetch -q -m " + url + trust + " --allow-expired", &out), 0) << out;
  bytes = ManifestJson(2, "2999-01-01T00:00:00Z");
  url = Publish(bytes, Sign(bytes, {"new"}));
  EXPECT_EQ(Cubist("fetch -q -m " + url + trust, &out), 0) << out;
}

TEST_F(FetchTrustTest, SignatureServerErrorIsNotMistakenForUnsigned) {
  std::string bytes = ManifestJson(1);
  std::string url = Publish(bytes, Sign(bytes, {"new"}));
  server_->SetFault("/repo/manifest.json.sig",
                    {.kind = ::cubist::testing::FaultKind::kStatus, .status = 503});
  std::string out;
  EXPECT_EQ(Cubist("fetch -q -m " + url + " --trusted-key " + pub_["new"], &out), 4) << out;
  EXPECT_THAT(out, HasSubstr("signature"));
  EXPECT_EQ(ArtifactRequests(), 0);
}

}  // namespace
}  // namespace cubist
