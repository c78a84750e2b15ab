// The warm path of a fetch: a URL manifest read again with If-None-Match (a real nginx
// answers 304), the cache of parsed manifests (manifest_binary.h,
// parsed_manifest_cache.h) and what keeps it safe: keyed by the manifest's digest,
// damaged or misfiled entries ignored, signatures still checked, atomic entries under
// concurrent writers. And the pieces: the ETag header, WriteFileIfChanged, BatchProbe.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "artifacts/curl_transport.h"
#include "artifacts/gc.h"
#include "artifacts/http_headers.h"
#include "artifacts/manifest_source.h"
#include "artifacts/parsed_manifest_cache.h"
#include "artifacts/store.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "manifest/checksums.h"
#include "manifest/manifest_binary.h"
#include "manifest/signature.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/nginx_server.h"
#include "tests/testlib/sample_repo.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::NginxServer;
using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

Manifest FullManifest() {
  Manifest m;
  m.name = "full";
  m.version = 7;
  m.expires = absl::FromUnixSeconds(1'900'000'000) + absl::Nanoseconds(123456789) +
              absl::Nanoseconds(1) / 4;
  m.base_urls = {"https://m1.example/x/", "file:///srv/y/"};
  Artifact a;
  a.path = "cubins/sm_90a/a.cubin";
  a.sha256 = std::string(64, 'a');
  a.size = 1234;
  a.extras = {{"note", "\"x\""}};
  Artifact b;
  b.path = "cubins/b.cubin";
  b.sha256 = std::string(64, 'b');  // no size, as from a checksums.txt
  m.artifacts = {a, b};
  KernelSpec k;
  k.name = "k1";
  k.artifact = a.path;
  k.function = "moe_gemm_k1";
  k.arch = "sm_90a";
  k.op = "moe_gemm";
  k.abi = 2;
  k.weight_format = "mxfp4";
  k.activation_format = "bf16";
  k.activation = "swiglu";
  k.tile_m = 64;
  k.tile_n = 128;
  k.tile_k = 256;
  k.cluster = {2, 1, 1};
  k.stages = 4;
  k.threads = 384;
  k.shared_mem_bytes = 200000;
  k.extras = {{"mma_efficiency", "0.7"}};
  m.kernels = {k};
  m.extras = {{"publisher", "{\"a\":[1,2]}"}};
  m.digest = std::string(64, 'c');
  return m;
}

TEST(ManifestBinaryTest, RoundTripsEveryField) {
  const Manifest m = FullManifest();
  absl::StatusOr<Manifest> back = DecodeManifestBinary(EncodeManifestBinary(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, m);  // every field, digest included (source is empty in both)
}

TEST(ManifestBinaryTest, EveryFlippedByteAndEveryTruncationIsDataLoss) {
  const std::string bytes = EncodeManifestBinary(FullManifest());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x01;
    EXPECT_THAT(DecodeManifestBinary(bad), StatusIs(absl::StatusCode::kDataLoss, ::testing::_)) << i;
    EXPECT_THAT(DecodeManifestBinary(std::string_view(bytes).substr(0, i)),
                StatusIs(absl::StatusCode::kDataLoss, ::testing::_))
        << i;
  }
}

// Artifacts packed one at a time (as a parse packs them) and written around them in
// pieces make the very entry the whole manifest encodes to.
TEST(ManifestBinaryTest, PiecesAroundBuiltPackedArtifactsAreTheWholeEntry) {
  const Manifest m = FullManifest();
  PackedArtifactsBuilder builder;
  for (const Artifact& a : m.artifacts) {
    const size_t offset = builder.Add(a);
    EXPECT_EQ(builder.PathAt(offset), a.path);
  }
  const PackedArtifacts packed = std::move(builder).Finish();
  ASSERT_EQ(packed.size(), m.artifacts.size());
  EXPECT_EQ(packed.Unpack(), m.artifacts);
  Manifest without = m;
  without.artifacts.clear();
  const EncodedPieces pieces = EncodeManifestBinaryPieces(without, packed);
  EXPECT_EQ(pieces.head + std::string(pieces.artifacts) + pieces.tail, EncodeManifestBinary(m));
}

TEST(ManifestBinaryTest, PackedArtifactsReadAsTheFullDecodeDoes) {
  const Manifest m = FullManifest();
  PackedArtifacts packed;
  absl::StatusOr<Manifest> rest = DecodeManifestBinaryPacked(EncodeManifestBinary(m), &packed);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_TRUE(rest->artifacts.empty());
  Manifest without = m;
  without.artifacts.clear();
  EXPECT_EQ(*rest, without);  // every other field, as DecodeManifestBinary reads it
  ASSERT_EQ(packed.size(), 2u);
  std::vector<Artifact> seen;
  EXPECT_TRUE(packed.ForEach([&](const ArtifactRef& a) {
    seen.push_back({std::string(a.path), std::string(a.sha256), a.size, {}});
    return true;
  }));
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].path, m.artifacts[0].path);
  EXPECT_EQ(seen[0].sha256, m.artifacts[0].sha256);
  EXPECT_EQ(seen[0].size, m.artifacts[0].size);
  EXPECT_EQ(seen[1].path, m.artifacts[1].path);
  EXPECT_EQ(seen[1].size, std::nullopt);
  EXPECT_EQ(packed.Unpack(), m.artifacts);  // extras included
  // The walk stops where the callback says, and says so.
  int calls = 0;
  EXPECT_FALSE(packed.ForEach([&](const ArtifactRef&) { return ++calls < 1; }));
  EXPECT_EQ(calls, 1);
  // Copies share the entry; the views stay valid after the original is gone.
  PackedArtifacts copy = packed;
  packed = PackedArtifacts();
  EXPECT_EQ(copy.Unpack(), m.artifacts);
  EXPECT_EQ(packed.size(), 0u);
}

TEST(ManifestBinaryTest, APackedDecodeRefusesWhatTheFullOneRefuses) {
  const std::string bytes = EncodeManifestBinary(FullManifest());
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] ^= 0x01;
    PackedArtifacts packed;
    EXPECT_THAT(DecodeManifestBinaryPacked(bad, &packed),
                StatusIs(absl::StatusCode::kDataLoss, ::testing::_))
        << i;
    EXPECT_THAT(DecodeManifestBinaryPacked(bytes.substr(0, i), &packed),
                StatusIs(absl::StatusCode::kDataLoss, ::testing::_))
        << i;
    EXPECT_EQ(packed.size(), 0u) << i;  // left alone on failure
  }
}

// Found by the manifest_binary fuzzer: an artifact whose extras repeat a key (which no
// encoder writes) was refused by the full decode and accepted by the packed one, which
// steps over artifacts' extras. Both must refuse it.
TEST(ManifestBinaryTest, ARepeatedExtrasKeyIsDataLossInBothDecodes) {
  Manifest m = FullManifest();
  m.artifacts[0].extras = {{"k1", "x"}, {"k2", "y"}};
  std::string bytes = EncodeManifestBinary(m);
  // Rename k2 to k1 and seal the body again with its SHA-256.
  const size_t at = bytes.find("k2");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1] = '1';
  std::string body = bytes.substr(0, bytes.size() - 32);
  Sha256 hasher;
  hasher.Update(body);
  const Sha256Digest sum = hasher.Finish();
  body.append(reinterpret_cast<const char*>(sum.data()), sum.size());
  EXPECT_THAT(DecodeManifestBinary(body),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("malformed entry")));
  PackedArtifacts packed;
  EXPECT_THAT(DecodeManifestBinaryPacked(body, &packed),
              StatusIs(absl::StatusCode::kDataLoss, ::testing::HasSubstr("malformed entry")));
  EXPECT_EQ(packed.size(), 0u);
}

class ParsedManifestCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Store::Open(tmp_.Join("cache"));
    ASSERT_TRUE(store.ok()) << store.status();
    store_.emplace(*std::move(store));
    files_ = testing::MakeSampleFiles(5, 100, 1000, 3);
    manifest_ = testing::WriteSampleRepo(tmp_.Join("repo"), files_, "warm", 2);
    path_ = tmp_.Join("repo/manifest.json");
  }

  absl::StatusOr<OpenedManifest> Open(const std::string& location, TrustPolicy trust = {}) {
    OpenManifestOptions o;
    o.store = &*store_;
    o.record_version = true;
    o.trust = std::move(trust);
    return OpenManifest(location, o);
  }

  std::string EntryPathFor(const std::string& bytes) {
    return absl::StrCat(store_->ManifestsDir(), "/parsed/", Sha256Hex(bytes));
  }

  testing::TempDir tmp_;
  std::optional<Store> store_;
  std::vector<testing::SampleFile> files_;
  Manifest manifest_;
  std::string path_;
};

TEST_F(ParsedManifestCacheTest, SecondOpenReadsTheParseKeptByDigest) {
  const std::string bytes = testing::ReadFileOrDie(path_);
  auto first = Open(path_);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string entry = EntryPathFor(bytes);
  ASSERT_TRUE(testing::FileExists(entry));
  // Plant an entry for the same digest that differs in one extra field: if the second
  // open returns it, it read the cache instead of parsing.
  Manifest marked = first->manifest;
  marked.extras["x-from-cache"] = "true";
  testing::WriteFileOrDie(entry, EncodeManifestBinary(marked));
  auto second = Open(path_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->manifest.extras.count("x-from-cache"), 1u);
  EXPECT_EQ(second->manifest.source, path_);
  EXPECT_EQ(second->manifest.digest, Sha256Hex(bytes));
}

TEST_F(ParsedManifestCacheTest, PackedArtifactsUnpackToTheParseWhetherParsedOrCached) {
  OpenManifestOptions o;
  o.store = &*store_;
  // Without the option the artifacts are built: the reference.
  auto whole = OpenManifest(path_, o);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE(whole->packed_artifacts.has_value());
  EXPECT_EQ(whole->manifest.artifacts, manifest_.artifacts);
  ASSERT_EQ(::unlink(EntryPathFor(testing::ReadFileOrDie(path_)).c_str()), 0);
  o.pack_artifacts = true;
  // The first open parses straight into the packed form (never building the list), and
  // keeps that parse for the next.
  auto first = OpenManifest(path_, o);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(first->packed_artifacts.has_value());
  EXPECT_EQ(first->packed_artifacts->size(), manifest_.artifacts.size());
  EXPECT_TRUE(first->manifest.artifacts.empty());
  EXPECT_TRUE(testing::FileExists(EntryPathFor(testing::ReadFileOrDie(path_))));
  first->UnpackArtifacts();
  EXPECT_EQ(first->manifest, whole->manifest);
  // The second reads the parse from the cache and leaves the artifacts in it.
  auto second = OpenManifest(path_, o);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(second->packed_artifacts.has_value());
  EXPECT_EQ(second->packed_artifacts->size(), manifest_.artifacts.size());
  EXPECT_TRUE(second->manifest.artifacts.empty());
  EXPECT_EQ(second->manifest.name, "warm");
  second->UnpackArtifacts();
  EXPECT_FALSE(second->packed_artifacts.has_value());
  EXPECT_EQ(second->manifest, whole->manifest);
  // Without the option, a parse from the cache is whole.
  o.pack_artifacts = false;
  auto third = OpenManifest(path_, o);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->packed_artifacts.has_value());
  EXPECT_EQ(third->manifest, whole->manifest);
}

TEST_F(ParsedManifestCacheTest, ADamagedEntryIsIgnoredAndRewritten) {
  const std::string bytes = testing::ReadFileOrDie(path_);
  ASSERT_TRUE(Open(path_).ok());
  const std::string entry = EntryPathFor(bytes);
  std::string damaged = testing::ReadFileOrDie(entry);
  // One flipped bit, then a torn tail: neither may be read as a manifest.
  damaged[damaged.size() / 2] ^= 0x40;
  testing::WriteFileOrDie(entry, damaged);
  auto opened = Open(path_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(SameContent(opened->manifest, manifest_));
  EXPECT_TRUE(DecodeManifestBinary(testing::ReadFileOrDie(entry)).ok());

  testing::WriteFileOrDie(entry, damaged.substr(0, damaged.size() - 10));
  opened = Open(path_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(SameContent(opened->manifest, manifest_));
}

TEST_F(ParsedManifestCacheTest, AChangedManifestIsParsedAgainNotServedFromTheCache) {
  ASSERT_TRUE(Open(path_).ok());
  // Tamper with one artifact's hash: other bytes, another digest, another entry.
  std::string bytes = testing::ReadFileOrDie(path_);
  const std::string old_sha = manifest_.artifacts[0].sha256;
  const std::string new_sha = std::string(64, 'e');
  bytes = absl::StrReplaceAll(bytes, {{old_sha, new_sha}});
  testing::WriteFileOrDie(path_, bytes);
  auto opened = Open(path_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->manifest.artifacts[0].sha256, new_sha);
  EXPECT_EQ(opened->manifest.digest, Sha256Hex(bytes));
}

TEST_F(ParsedManifestCacheTest, AnEntryFiledUnderAnotherDigestIsNotUsed) {
  const std::string bytes = testing::ReadFileOrDie(path_);
  auto original = Open(path_);
  ASSERT_TRUE(original.ok());
  // Another manifest's bytes, with the first manifest's entry copied under their digest.
  std::string other = absl::StrReplaceAll(bytes, {{"\"version\": 2", "\"version\": 3"}});
  ASSERT_NE(other, bytes);
  const std::string other_path = tmp_.Join("repo/other.json");
  testing::WriteFileOrDie(other_path, other);
  testing::WriteFileOrDie(EntryPathFor(other), testing::ReadFileOrDie(EntryPathFor(bytes)));
  auto opened = Open(other_path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->manifest.version, 3);
}

TEST_F(ParsedManifestCacheTest, AChecksumsEntryIsKeyedByTheNameItsSourceGives) {
  std::string sums;
  for (const Artifact& a : manifest_.artifacts) absl::StrAppend(&sums, a.sha256, " ", a.path, "\n");
  testing::WriteFileOrDie(tmp_.Join("pin-a/checksums.txt"), sums);
  testing::WriteFileOrDie(tmp_.Join("pin-b/checksums.txt"), sums);
  auto a = Open(tmp_.Join("pin-a/checksums.txt"));
  auto b = Open(tmp_.Join("pin-b/checksums.txt"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->manifest.name, "pin-a");
  EXPECT_EQ(b->manifest.name, "pin-b");  // not pin-a's parse, though the bytes are equal
  a = Open(tmp_.Join("pin-a/checksums.txt"));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->manifest.name, "pin-a");
}

TEST_F(ParsedManifestCacheTest, SignaturesAreStillRequiredWhenTheParseIsCached) {
  auto key = PrivateKey::Generate();
  ASSERT_TRUE(key.ok());
  const std::string bytes = testing::ReadFileOrDie(path_);
  auto sig = key->Sign(bytes);
  ASSERT_TRUE(sig.ok());
  testing::WriteFileOrDie(path_ + ".sig", FormatSignatureLine(key->public_key(), *sig));
  TrustPolicy trust;
  trust.trusted_keys = {key->public_key()};
  ASSERT_TRUE(Open(path_, trust).ok());
  ASSERT_TRUE(testing::FileExists(EntryPathFor(bytes)));
  // The same bytes, their parse cached, but the signature gone or made by another key.
  ASSERT_EQ(::unlink((path_ + ".sig").c_str()), 0);
  EXPECT_THAT(Open(path_, trust), StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  auto other = PrivateKey::Generate();
  ASSERT_TRUE(other.ok());
  auto other_sig = other->Sign(bytes);
  ASSERT_TRUE(other_sig.ok());
  testing::WriteFileOrDie(path_ + ".sig", FormatSignatureLine(other->public_key(), *other_sig));
  EXPECT_THAT(Open(path_, trust), StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
}

TEST_F(ParsedManifestCacheTest, ProcessesWritingOneEntryAtOnceLeaveAWholeEntry) {
  const std::string bytes = testing::ReadFileOrDie(path_);
  absl::StatusOr<Manifest> parsed = ParseManifestOrChecksums(bytes, path_);
  ASSERT_TRUE(parsed.ok());
  const ParsedManifestCache cache(*store_);
  std::vector<pid_t> children;
  for (int p = 0; p < 8; ++p) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Write and read the entry in a loop; any read that finds something must find
      // exactly the parse (never a torn entry taken as a manifest).
      for (int i = 0; i < 50; ++i) {
        if (!cache.Put(*parsed, bytes, path_).ok()) ::_exit(2);
        std::optional<Manifest> got = cache.Find(bytes, parsed->digest, path_);
        if (got.has_value() && !(*got == *parsed)) ::_exit(3);
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  std::optional<Manifest> got = cache.Find(bytes, parsed->digest, path_);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, *parsed);
  // No temporary file is left behind.
  std::string out;
  testing::RunCommand(absl::StrCat("ls ", cache.dir()), &out);
  EXPECT_THAT(out, ::testing::Not(HasSubstr(".tmp.")));
}

TEST_F(ParsedManifestCacheTest, GcRemovesTheParsesOfManifestsNoLongerKept) {
  auto opened = Open(path_);
  ASSERT_TRUE(opened.ok());
  const std::string entry = EntryPathFor(opened->bytes);
  GcOptions keep;
  keep.extra_keep = {opened->manifest};
  auto kept = CollectGarbage(*store_, keep);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->parsed_removed, 0);
  EXPECT_TRUE(testing::FileExists(entry));
  auto collected = CollectGarbage(*store_, GcOptions{});
  ASSERT_TRUE(collected.ok()) << collected.status();
  EXPECT_EQ(collected->parsed_removed, 1);
  EXPECT_FALSE(testing::FileExists(entry));
}

class ConditionalGetTest : public ParsedManifestCacheTest {
 protected:
  void SetUp() override {
    if (NginxServer::BinaryPath().empty()) GTEST_SKIP() << "nginx not installed";
    ParsedManifestCacheTest::SetUp();
    NginxServer::Options o;
    o.root = tmp_.Join("repo");
    o.workdir = tmp_.Join("nginx");
    auto s = NginxServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    url_ = server_->BaseUrl() + "manifest.json";
  }

  // The statuses nginx answered GET /manifest.json with, in order.
  std::vector<std::string> ManifestStatuses(size_t expected) {
    return Statuses("/manifest.json", expected);
  }

  // The statuses nginx answered GET `path` with, in order, once `expected` of them are in
  // the log (or after 5 s): nginx writes a request's line after the answer has gone out,
  // so a client holding the answer can read the log before the line is there (seen once
  // under TSan: {"200"} where {"200", "304"} came a moment later).
  std::vector<std::string> Statuses(const std::string& path, size_t expected) {
    const std::string request = absl::StrCat("GET ", path, " ");
    std::vector<std::string> out;
    for (int attempt = 0; attempt < 500; ++attempt) {
      out.clear();
      for (const std::string& line : server_->AccessLog()) {
        if (absl::StartsWith(line, request)) out.push_back(line.substr(request.size(), 3));
      }
      if (out.size() >= expected) break;
      usleep(10 * 1000);
    }
    return out;
  }

  std::unique_ptr<NginxServer> server_;
  std::string url_;
};

TEST_F(ConditionalGetTest, AnUnchangedManifestIsAnswered304AndNotParsedAgain) {
  auto first = Open(url_);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string entry = EntryPathFor(first->bytes);
  Manifest marked = first->manifest;
  marked.extras["x-from-cache"] = "true";
  testing::WriteFileOrDie(entry, EncodeManifestBinary(marked));

  auto second = Open(url_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(ManifestStatuses(2), (std::vector<std::string>{"200", "304"}));
  EXPECT_EQ(second->bytes, first->bytes);
  EXPECT_FALSE(second->from_offline_copy);
  EXPECT_EQ(second->manifest.extras.count("x-from-cache"), 1u);  // the cached parse
  EXPECT_EQ(second->manifest.source, url_);
}

TEST_F(ConditionalGetTest, AChangedManifestIsReadAgain) {
  ASSERT_TRUE(Open(url_).ok());
  // A newer version on the server (other bytes and size, so another ETag).
  std::string bytes = testing::ReadFileOrDie(path_);
  bytes = absl::StrReplaceAll(bytes, {{"\"version\": 2", "\"version\": 30"}});
  testing::WriteFileOrDie(path_, bytes);
  auto opened = Open(url_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->manifest.version, 30);
  EXPECT_EQ(opened->bytes, bytes);
  EXPECT_EQ(ManifestStatuses(2), (std::vector<std::string>{"200", "200"}));
  // The copy for --offline is the new one too.
  OpenManifestOptions o;
  o.store = &*store_;
  o.offline = true;
  auto offline = OpenManifest(url_, o);
  ASSERT_TRUE(offline.ok()) << offline.status();
  EXPECT_EQ(offline->manifest.version, 30);
}

TEST_F(ConditionalGetTest, ACopyThatIsNotTheOneTheTagCameWithIsNotUsed) {
  ASSERT_TRUE(Open(url_).ok());
  const std::string copy =
      absl::StrCat(store_->ManifestsDir(), "/by-url/", Sha256Hex(url_));
  ASSERT_TRUE(testing::FileExists(copy + ".etag"));
  // Another process replaced the copy but not (yet) its tag record.
  testing::WriteFileOrDie(copy, "{\"schema\": \"not this\"}");
  auto opened = Open(url_);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_TRUE(SameContent(opened->manifest, manifest_));
  EXPECT_EQ(ManifestStatuses(2), (std::vector<std::string>{"200", "200"}));  // no If-None-Match
  EXPECT_EQ(testing::ReadFileOrDie(copy), opened->bytes);                // repaired
}

TEST_F(ConditionalGetTest, AnUnchangedSignatureIsAnswered304AndAChangedOneReadAndChecked) {
  auto key = PrivateKey::Generate();
  ASSERT_TRUE(key.ok());
  const std::string bytes = testing::ReadFileOrDie(path_);
  auto sig = key->Sign(bytes);
  ASSERT_TRUE(sig.ok());
  const std::string sig_line = FormatSignatureLine(key->public_key(), *sig);
  testing::WriteFileOrDie(path_ + ".sig", sig_line);
  TrustPolicy trust;
  trust.trusted_keys = {key->public_key()};
  ASSERT_TRUE(Open(url_, trust).ok());
  auto second = Open(url_, trust);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(ManifestStatuses(2), (std::vector<std::string>{"200", "304"}));
  EXPECT_EQ(Statuses("/manifest.json.sig", 2), (std::vector<std::string>{"200", "304"}));
  const std::string copy =
      absl::StrCat(store_->ManifestsDir(), "/by-url/", Sha256Hex(url_));
  EXPECT_EQ(testing::ReadFileOrDie(copy + ".sig"), sig_line);
  // The server's signature replaced by one of an untrusted key: read (200), and refused.
  auto other = PrivateKey::Generate();
  ASSERT_TRUE(other.ok());
  auto other_sig = other->Sign(bytes);
  ASSERT_TRUE(other_sig.ok());
  testing::WriteFileOrDie(path_ + ".sig" + ".new",
                          FormatSignatureLine(other->public_key(), *other_sig) + "\n# other\n");
  ASSERT_EQ(::rename((path_ + ".sig.new").c_str(), (path_ + ".sig").c_str()), 0);
  EXPECT_THAT(Open(url_, trust), StatusIs(absl::StatusCode::kPermissionDenied, ::testing::_));
  EXPECT_EQ(Statuses("/manifest.json.sig", 3), (std::vector<std::string>{"200", "304", "200"}));
}

TEST(EtagHeaderTest, ReadsTheTagAndRefusesWhatCouldBendAHeaderLine) {
  EXPECT_EQ(EtagFromHeaderLine("ETag: \"6b0e-21955e\"\r\n"), "\"6b0e-21955e\"");
  EXPECT_EQ(EtagFromHeaderLine("etag:W/\"x\"\r\n"), "W/\"x\"");
  EXPECT_EQ(EtagFromHeaderLine("Content-Type: text/plain\r\n"), std::nullopt);
  EXPECT_EQ(EtagFromHeaderLine("ETag: \r\n"), std::nullopt);
  EXPECT_EQ(EtagFromHeaderLine("ETag: \"a\rb\"\r\n"), std::nullopt);
  EXPECT_EQ(EtagFromHeaderLine(absl::StrCat("ETag: \"", std::string(2000, 'x'), "\"")),
            std::nullopt);
}

TEST(WriteFileIfChangedTest, LeavesAFileWithTheSameBytesAlone) {
  testing::TempDir tmp;
  const std::string path = tmp.Join("f");
  ASSERT_TRUE(WriteFileIfChanged(path, "one").ok());
  struct stat before, after;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  ASSERT_TRUE(WriteFileIfChanged(path, "one").ok());
  ASSERT_EQ(::stat(path.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);  // not replaced
  ASSERT_TRUE(WriteFileIfChanged(path, "two").ok());
  EXPECT_EQ(testing::ReadFileOrDie(path), "two");
  ASSERT_TRUE(WriteFileIfChanged(path, "three").ok());  // another size
  EXPECT_EQ(testing::ReadFileOrDie(path), "three");
}

TEST(BatchProbeTest, AnswersAsProbeDoes) {
  testing::TempDir tmp;
  auto store = Store::Open(tmp.Join("cache"));
  ASSERT_TRUE(store.ok());
  const std::string present = std::string(64, 'a'), dir = std::string(64, 'b'),
                    link = std::string(64, 'c'), missing = std::string(64, 'd'),
                    unstamped = std::string(64, 'e');
  testing::WriteFileOrDie(store->ObjectPath(present), "12345");
  testing::WriteFileOrDie(store->ObjectPath(unstamped), "12345");
  // As Publish leaves it: the mtime stamped from the size (store.h).
  const struct timespec stamp[2] = {{0, UTIME_OMIT}, {StampFor(5), 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, store->ObjectPath(present).c_str(), stamp, 0), 0);
  ASSERT_TRUE(MakeDirs(store->ObjectPath(dir)).ok());
  ASSERT_TRUE(MakeDirs(DirName(store->ObjectPath(link))).ok());
  ASSERT_EQ(::symlink(store->ObjectPath(present).c_str(), store->ObjectPath(link).c_str()), 0);
  const Store::BatchProbe probe(*store);
  for (const std::string& sha : {present, dir, link, missing, unstamped}) {
    for (std::optional<uint64_t> size : {std::optional<uint64_t>(), std::optional<uint64_t>(5),
                                         std::optional<uint64_t>(6)}) {
      EXPECT_EQ(probe.Probe(sha, size), store->Probe(sha, size)) << sha.substr(0, 1);
    }
  }
  EXPECT_EQ(probe.Probe(present, 5), ObjectState::kPresent);
  EXPECT_EQ(probe.Probe(present, 6), ObjectState::kWrongSize);
  EXPECT_EQ(probe.Probe(link, std::nullopt), ObjectState::kNotRegular);
  EXPECT_EQ(probe.Probe(missing, std::nullopt), ObjectState::kMissing);
  EXPECT_EQ(probe.Probe(unstamped, 5), ObjectState::kUnconfirmed);
}

}  // namespace
}  // namespace cubist
