// Bundles (artifacts/bundle.h, artifacts/tar_stream.h): deterministic creation, verified
// import, and refusal of truncated, tampered and hostile archives.
#include "artifacts/bundle.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "artifacts/gc.h"
#include "artifacts/keep.h"
#include "artifacts/version_guard.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/unique_fd.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manifest/manifest_parser.h"
#include "manifest/manifest_writer.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::FileExists;
using ::cubist::testing::RandomBytes;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::cubist::testing::StatusIs;
using ::testing::AllOf;
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
    inputs_.push_back(MakeInput(3, 40, 700, 300));
    bundle_ = dir_.Join("set.tar");
    auto r = CreateBundle(*src_, inputs_, bundle_);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->objects, 3u);
    EXPECT_EQ(r->bytes, 700u + 1000u + 1300u);
  }
  // Set v`version` with three objects of `size`, `size + step`, `size + 2 * step` bytes
  // (seeded by `seed`), put into src_.
  BundleInput MakeInput(int64_t version, int seed, size_t size, size_t step) {
    Manifest m;
    m.name = "set";
    m.version = version;
    for (int i = 0; i < 3; ++i) {
      const std::string bytes = RandomBytes(size + step * i, seed + i);
      Artifact a;
      a.path = absl::StrCat("cubins/k", i, ".cubin");
      a.sha256 = PutObject(*src_, bytes);
      a.size = bytes.size();
      m.artifacts.push_back(a);
    }
    BundleInput in;
    in.bytes = WriteManifest(m);
    auto parsed = ParseManifest(in.bytes, "set.json");
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    if (parsed.ok()) in.manifest = *parsed;
    return in;
  }
  // A bundle of set v`version` with three objects of its own.
  std::string MakeBundle(int64_t version, int seed, Manifest* out) {
    const BundleInput in = MakeInput(version, seed, 500, 100);
    *out = in.manifest;
    const std::string path = dir_.Join(absl::StrCat("set-v", version, ".tar"));
    auto r = CreateBundle(*src_, {in}, path);
    EXPECT_TRUE(r.ok()) << r.status();
    return path;
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
  EXPECT_TRUE(FileExists(absl::StrCat(dst_->ManifestsDir(), "/",
                                      KeptManifestFileName(inputs_[0].manifest,
                                                           inputs_[0].bytes))));
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

// Import's order and completeness rules (bundle.h): manifests before the objects, each
// signature beside its manifest, every object named in the bundle or the cache; and
// create's one manifest per name.
TEST_F(BundleTest, MisplacedStrayAndMissingMembersAreRefused) {
  const std::string full = ReadFileOrDie(bundle_);
  const size_t objects_start = full.find("objects/sha256/");
  ASSERT_NE(objects_start, std::string::npos);
  const std::string end_of_archive(1024, '\0');
  const uint64_t first_size = std::stoull(full.substr(objects_start + 124, 11), nullptr, 8);
  const size_t first_end = objects_start + 512 + (first_size + 511) / 512 * 512;
  const std::string late = full.substr(0, first_end) + Header("manifests/late.json", '0', 2) +
                           "{}" + std::string(510, '\0') + end_of_archive;
  EXPECT_THAT(ImportBytes(late),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("refused: manifests must come before the objects")));
  const std::string stray = full.substr(0, objects_start) +
                            Header("manifests/other.json.sig", '0', 3) + "sig" +
                            std::string(509, '\0') + full.substr(objects_start);
  EXPECT_THAT(ImportBytes(stray),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(": signature manifests/other.json.sig belongs to no manifest "
                                 "of the bundle")));
  EXPECT_THAT(ImportBytes(full.substr(0, objects_start) + end_of_archive),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("but the bundle does not hold it and the cache lacks it; "
                                 "nothing was imported")));
  EXPECT_EQ(CountObjects(*dst_), 0u);

  EXPECT_THAT(CreateBundle(*src_, {inputs_[0], inputs_[0]}, dir_.Join("twice.tar")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("two manifests are named 'set'; a bundle holds one manifest "
                                 "per name")));
  EXPECT_FALSE(FileExists(dir_.Join("twice.tar")));
}

TEST_F(BundleTest, CreateNeedsEveryObjectCached) {
  ASSERT_TRUE(src_->Remove(inputs_[0].manifest.artifacts[1].sha256).ok());
  EXPECT_THAT(CreateBundle(*src_, inputs_, dir_.Join("b.tar")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("cubins/k1.cubin of set.json (sha256 ")));
  EXPECT_FALSE(FileExists(dir_.Join("b.tar")));
}

// Issue 28, item 3: import applies fetch's rollback guard, and an allowed rollback
// keeps both versions' objects until the operator drops one by name.
TEST_F(BundleTest, ImportRefusesARollbackAndAnAllowedOneKeepsBothVersions) {
  ASSERT_TRUE(ImportBytes(ReadFileOrDie(bundle_)).ok());  // set v3
  Manifest v2;
  const std::string old_bundle = MakeBundle(2, 90, &v2);
  ImportBundleOptions o;
  EXPECT_THAT(ImportBundle(*dst_, old_bundle, o),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("version 2 is older than version 3"),
                             HasSubstr("--allow-rollback"))));
  EXPECT_EQ(CountObjects(*dst_), 3u) << "a refused import stages and publishes nothing";
  o.trust.allow_rollback = true;
  ASSERT_TRUE(ImportBundle(*dst_, old_bundle, o).ok());
  auto highest = VersionGuard(dst_->root()).Highest("set");
  ASSERT_TRUE(highest.ok() && highest->has_value());
  EXPECT_EQ((*highest)->version, 3) << "the record keeps the higher version";

  auto gc = CollectGarbage(*dst_, GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->kept_manifests, 2);
  EXPECT_EQ(gc->objects_removed, 0);
  EXPECT_EQ(CountObjects(*dst_), 6u);

  GcOptions drop;
  drop.drop = {"set@9"};
  EXPECT_THAT(CollectGarbage(*dst_, drop),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("gc --drop set@9: no kept manifest"),
                             HasSubstr("set@3"), HasSubstr("nothing was deleted"))));
  drop.drop = {"set@2"};
  gc = CollectGarbage(*dst_, drop);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->objects_removed, 3);
  for (const Artifact& a : v2.artifacts) {
    EXPECT_EQ(dst_->Probe(a.sha256, a.size), ObjectState::kMissing) << a.path;
  }
  for (const Artifact& a : inputs_[0].manifest.artifacts) {
    EXPECT_EQ(dst_->Probe(a.sha256, a.size), ObjectState::kPresent) << a.path;
  }
}

// Issue 28, item 8: gc removes the staging directory of a killed import, never that of
// one still running (which holds a flock on it).
TEST_F(BundleTest, GcRemovesAbandonedStagingDirectoriesOnly) {
  const std::string dead = dst_->root() + "/tmp/bundle-dead01";
  const std::string live = dst_->root() + "/tmp/bundle-live01";
  WriteFileOrDie(dead + "/" + std::string(64, 'a'), RandomBytes(4096, 1));
  WriteFileOrDie(live + "/" + std::string(64, 'b'), RandomBytes(4096, 2));
  UniqueFd held(::open(live.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(held.valid());
  ASSERT_EQ(::flock(held.get(), LOCK_EX), 0);

  GcOptions dry;
  dry.dry_run = true;
  auto gc = CollectGarbage(*dst_, dry);
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->temps_removed, 1);
  EXPECT_TRUE(FileExists(dead + "/" + std::string(64, 'a')));
  gc = CollectGarbage(*dst_, GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->temps_removed, 1);
  EXPECT_EQ(gc->busy_skipped, 1);
  struct stat st;
  EXPECT_NE(::stat(dead.c_str(), &st), 0) << "the killed import's staging is gone";
  EXPECT_TRUE(FileExists(live + "/" + std::string(64, 'b')));
  held = UniqueFd();  // the importer exits
  gc = CollectGarbage(*dst_, GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_NE(::stat(live.c_str(), &st), 0);
}

// Kept manifests of layout 1 (manifests/<name>.json, older cubist) are still honoured; a
// pending root whose process is gone (no flock) is reaped, and what only it named goes.
TEST_F(BundleTest, GcHonoursOldKeptManifestsAndReapsAbandonedRoots) {
  ASSERT_TRUE(ImportBytes(ReadFileOrDie(bundle_)).ok());
  const std::string kept = absl::StrCat(
      dst_->ManifestsDir(), "/", KeptManifestFileName(inputs_[0].manifest, inputs_[0].bytes));
  ASSERT_EQ(::rename(kept.c_str(), (dst_->ManifestsDir() + "/set.json").c_str()), 0);
  const BundleInput other = MakeInput(7, 70, 300, 10);  // objects in src_ only
  for (const Artifact& a : other.manifest.artifacts) {
    ASSERT_EQ(PutObject(*dst_, ReadFileOrDie(src_->ObjectPath(a.sha256))), a.sha256);
  }
  WriteFileOrDie(dst_->ManifestsDir() + "/pending/0123456789abcdef.json", other.bytes);

  auto gc = CollectGarbage(*dst_, GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->kept_manifests, 1);
  EXPECT_EQ(gc->roots_removed, 1);
  EXPECT_EQ(gc->roots_in_use, 0);
  EXPECT_EQ(gc->objects_removed, 3);
  EXPECT_EQ(CountObjects(*dst_), 3u);
  EXPECT_FALSE(FileExists(dst_->ManifestsDir() + "/pending/0123456789abcdef.json"));
  for (const Artifact& a : inputs_[0].manifest.artifacts) {
    EXPECT_EQ(dst_->Probe(a.sha256, a.size), ObjectState::kPresent) << a.path;
  }
}

}  // namespace
}  // namespace cubist
