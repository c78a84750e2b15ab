// Bundles (artifacts/bundle.h, artifacts/tar_stream.h): deterministic creation, verified
// import, and refusal of truncated, tampered and hostile archives.
#include "artifacts/bundle.h"

#include <cstdio>
#include <cstring>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "manifest/manifest_parser.h"
#include "manifest/manifest_writer.h"
#include "tests/test_util.h"

namespace cubist {
namespace {

using ::cubist::testing::FileExists;
using ::cubist::testing::RandomBytes;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

std::string PutObject(const Store& store, const std::string& bytes) {
  const std::string sha = Sha256Hex(bytes);
  const std::string temp = store.root() + "/tmp/put-" + sha;
  WriteFileOrDie(temp, bytes);
  EXPECT_TRUE(store.Publish(temp, sha).ok());
  return sha;
}

size_t CountObjects(const Store& store) {
  auto list = store.ListObjects();
  return list.ok() ? list->size() : 0;
}

// A parsed-back view of the bundle bytes for surgery.
class BundleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = Store::Open(dir_.Join("src"));
    ASSERT_TRUE(s.ok()) << s.status();
    src_.emplace(*std::move(s));
    auto d = Store::Open(dir_.Join("dst"));
    ASSERT_TRUE(d.ok()) << d.status();
    dst_.emplace(*std::move(d));
    Manifest m;
    m.name = "set";
    m.version = 3;
    for (int i = 0; i < 3; ++i) {
      const std::string bytes = RandomBytes(700 + 300 * i, 40 + i);
      Artifact a;
      a.path = absl::StrCat("cubins/k", i, ".cubin");
      a.sha256 = PutObject(*src_, bytes);
      a.size = bytes.size();
      m.artifacts.push_back(a);
    }
    BundleInput in;
    in.bytes = WriteManifest(m);
    auto parsed = ParseManifest(in.bytes, "set.json");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    in.manifest = *parsed;
    inputs_.push_back(in);
    bundle_ = dir_.Join("set.tar");
    auto r = CreateBundle(*src_, inputs_, bundle_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->objects, 3u);
    EXPECT_EQ(r->bytes, 700u + 1000u + 1300u);
  }
  absl::StatusOr<BundleReport> ImportBytes(const std::string& bytes) {
    WriteFileOrDie(dir_.Join("in.tar"), bytes);
    ImportBundleOptions o;
    o.manifests_dir = dir_.Join("manifests");
    return ImportBundle(*dst_, dir_.Join("in.tar"), o);
  }
  TempDir dir_;
  std::optional<Store> src_;
  std::optional<Store> dst_;
  std::vector<BundleInput> inputs_;
  std::string bundle_;
};

TEST_F(BundleTest, CreateIsDeterministic) {
  const std::string first = ReadFileOrDie(bundle_);
  ASSERT_TRUE(CreateBundle(*src_, inputs_, dir_.Join("again.tar")).ok());
  EXPECT_EQ(ReadFileOrDie(dir_.Join("again.tar")), first);
  EXPECT_EQ(first.size() % 512, 0u);
  EXPECT_EQ(first.substr(0, 13), "cubist-bundle");
  EXPECT_EQ(first.substr(257, 8), std::string("ustar\0" "00", 8));
}

TEST_F(BundleTest, ImportVerifiesAndPublishesEverything) {
  auto r = ImportBytes(ReadFileOrDie(bundle_));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->objects, 3u);
  EXPECT_EQ(r->manifests, std::vector<std::string>{"manifests/set.json"});
  for (const Artifact& a : inputs_[0].manifest.artifacts) {
    EXPECT_EQ(ReadFileOrDie(dst_->ObjectPath(a.sha256)), ReadFileOrDie(src_->ObjectPath(a.sha256)));
  }
  EXPECT_EQ(ReadFileOrDie(dir_.Join("manifests/set.json")), inputs_[0].bytes);
  EXPECT_TRUE(FileExists(dst_->ManifestsDir() + "/set.json"));
  // A second import finds everything cached.
  r = ImportBytes(ReadFileOrDie(bundle_));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->objects, 0u);
  EXPECT_EQ(r->objects_already_cached, 3u);
}

TEST_F(BundleTest, TruncatedBundleImportsNothing) {
  const std::string full = ReadFileOrDie(bundle_);
  for (size_t cut : {full.size() - 1, full.size() - 1024, full.size() / 2, size_t{600}}) {
    EXPECT_THAT(ImportBytes(full.substr(0, cut)),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated at byte")))
        << cut;
    EXPECT_EQ(CountObjects(*dst_), 0u) << cut;
  }
}

TEST_F(BundleTest, TamperedObjectImportsNothing) {
  std::string bytes = ReadFileOrDie(bundle_);
  bytes[bytes.size() - 1024 - 512 - 300] ^= 1;  // inside the last object's data
  EXPECT_THAT(ImportBytes(bytes),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("the bundle was altered or damaged: nothing was imported")));
  EXPECT_EQ(CountObjects(*dst_), 0u);
}

// A ustar header for a hostile member, appended after the marker of a real bundle.
std::string Header(const std::string& name, char type, uint64_t size = 0) {
  std::string out;
  TarWriter w([&](std::string_view b) {
    out.append(b.data(), b.size());
    return absl::OkStatus();
  });
  EXPECT_TRUE(w.BeginMember("x", size).ok());
  out.resize(512);
  std::memset(out.data(), 0, 100);
  std::memcpy(out.data(), name.data(), std::min<size_t>(name.size(), 100));
  out[156] = type;
  uint64_t sum = 0;
  for (size_t i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(out[i]);
  snprintf(out.data() + 148, 8, "%06llo", static_cast<unsigned long long>(sum));
  out[155] = ' ';
  return out;
}

TEST_F(BundleTest, HostileMembersAreRefusedByName) {
  const std::string full = ReadFileOrDie(bundle_);
  const std::string marker = full.substr(0, 1024);  // header + data block
  struct Case {
    std::string name;
    char type;
    std::string message;
  } cases[] = {
      {"manifests/../../x", '0', "has a \"..\" segment"},
      {"/etc/passwd", '0', "path \"/etc/passwd\""},
      {"manifests/link.json", '2', "member \"manifests/link.json\" at byte 1024 is a symlink"},
      {"objects/sha256/aa/hard", '1', "is a hard link; bundles hold regular files only"},
      {"dev", '3', "is a character device"},
      {"fifo", '6', "is a FIFO"},
      {"manifests", '5', "is a directory"},
  };
  for (const Case& c : cases) {
    std::string bytes = marker + Header(c.name, c.type) + std::string(1024, '\0');
    EXPECT_THAT(ImportBytes(bytes), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr(c.message)))
        << c.name;
  }
  EXPECT_EQ(CountObjects(*dst_), 0u);
  EXPECT_FALSE(FileExists(dir_.Join("x")));
}

// A member's file name is its manifest's: manifests/victim.json holding the set "set"
// would otherwise be written over -o DIR/victim.json, another set's manifest.
TEST_F(BundleTest, AMemberNamedAfterAnotherSetIsRefused) {
  const std::string full = ReadFileOrDie(bundle_);
  const size_t objects_start = full.find("objects/sha256/");
  ASSERT_NE(objects_start, std::string::npos);
  const std::string& manifest = inputs_[0].bytes;
  std::string data = manifest;
  data.resize((manifest.size() + 511) / 512 * 512, '\0');
  const std::string bytes = full.substr(0, 1024) +
                            Header("manifests/victim.json", '0', manifest.size()) + data +
                            full.substr(objects_start);  // the first object's header on
  WriteFileOrDie(dir_.Join("manifests/victim.json"), "the victim's manifest");
  EXPECT_THAT(ImportBytes(bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(":manifests/victim.json: holds the set \"set\", which a bundle "
                                 "names manifests/set.json; a member's name must be its "
                                 "manifest's")));
  EXPECT_EQ(ReadFileOrDie(dir_.Join("manifests/victim.json")), "the victim's manifest");
  EXPECT_EQ(CountObjects(*dst_), 0u);
}

TEST_F(BundleTest, UnknownObjectsAndNonBundlesAreRefused) {
  EXPECT_THAT(ImportBytes(std::string(4096, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("no valid ustar header at byte 0")));
  // An object no manifest names, placed after the manifest.
  const std::string full = ReadFileOrDie(bundle_);
  const size_t objects_start = full.find("objects/sha256/");
  ASSERT_NE(objects_start, std::string::npos);
  const std::string other(64, 'e');
  std::string bytes = full.substr(0, objects_start) +
                      Header("objects/sha256/ee/" + other, '0', 1) + std::string(512, 'z') +
                      std::string(1024, '\0');
  EXPECT_THAT(ImportBytes(bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("refused: no manifest of the bundle names this object")));
}

TEST_F(BundleTest, CreateNeedsEveryObjectCached) {
  ASSERT_TRUE(src_->Remove(inputs_[0].manifest.artifacts[1].sha256).ok());
  EXPECT_THAT(CreateBundle(*src_, inputs_, dir_.Join("b.tar")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("cubins/k1.cubin of set.json (sha256 ")));
  EXPECT_FALSE(FileExists(dir_.Join("b.tar")));
}

}  // namespace
}  // namespace cubist
