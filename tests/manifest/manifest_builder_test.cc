#include "manifest/manifest_builder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include <nlohmann/json.hpp>

#include "base/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::RandomBytes;
using ::cubist::testing::StatusIs;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::testing::HasSubstr;

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

ManifestBuildOptions Options(std::string name = "set") {
  ManifestBuildOptions o;
  o.name = std::move(name);
  return o;
}

nlohmann::json Kernel(const std::string& name, const std::string& artifact) {
  return {{"name", name},         {"artifact", artifact},   {"function", "f_" + name},
          {"arch", "sm_90a"},     {"op", "moe_gemm"},       {"abi", 1},
          {"weight_format", "bf16"}, {"activation_format", "bf16"}, {"activation", "swiglu"},
          {"tile_m", 64},         {"tile_n", 128},          {"tile_k", 64},
          {"stages", 4},          {"threads", 256},         {"shared_mem_bytes", 0}};
}

TEST(ManifestBuilderTest, ListsHashesAndSizesEveryFileInSortedOrder) {
  TempDir dir;
  const std::string a = RandomBytes(3 << 20, 1);  // bigger than the hasher's buffer
  const std::string b = RandomBytes(17, 2);
  WriteFileOrDie(dir.Join("z.cubin"), b);
  WriteFileOrDie(dir.Join("cubins/sm_90a/a.cubin"), a);
  WriteFileOrDie(dir.Join("cubins/sm_100a/b.cubin"), b);
  WriteFileOrDie(dir.Join("empty"), "");
  WriteFileOrDie(dir.Join("A-upper"), "x");
  ManifestBuildOptions o = Options("moe");
  o.version = 9;
  absl::StatusOr<Manifest> m = BuildManifestFromDirectory(dir.path(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "moe");
  EXPECT_EQ(m->version, 9);
  EXPECT_EQ(m->source, dir.path());
  EXPECT_TRUE(m->digest.empty());
  ASSERT_EQ(m->artifacts.size(), 5u);
  EXPECT_EQ(m->artifacts[0].path, "A-upper");  // bytewise: uppercase first
  EXPECT_EQ(m->artifacts[1].path, "cubins/sm_100a/b.cubin");
  EXPECT_EQ(m->artifacts[2].path, "cubins/sm_90a/a.cubin");
  EXPECT_EQ(m->artifacts[3].path, "empty");
  EXPECT_EQ(m->artifacts[4].path, "z.cubin");
  EXPECT_EQ(m->artifacts[2].sha256, Sha256Hex(a));
  EXPECT_EQ(m->artifacts[2].size, a.size());
  EXPECT_EQ(m->artifacts[1].sha256, Sha256Hex(b));
  EXPECT_EQ(m->artifacts[3].sha256,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(m->artifacts[3].size, 0u);
  EXPECT_TRUE(m->kernels.empty());
}

TEST(ManifestBuilderTest, SameResultWithOneOrManyThreads) {
  TempDir dir;
  for (int i = 0; i < 200; ++i) {
    WriteFileOrDie(dir.Join("d" + std::to_string(i % 7) + "/f" + std::to_string(i)),
                   RandomBytes(1000 + i, i));
  }
  ManifestBuildOptions one = Options();
  one.threads = 1;
  ManifestBuildOptions many = Options();
  many.threads = 8;
  absl::StatusOr<Manifest> m1 = BuildManifestFromDirectory(dir.path(), one);
  absl::StatusOr<Manifest> m8 = BuildManifestFromDirectory(dir.path(), many);
  ASSERT_TRUE(m1.ok()) << m1.status();
  ASSERT_TRUE(m8.ok()) << m8.status();
  EXPECT_EQ(m1->artifacts.size(), 200u);
  EXPECT_EQ(m1->artifacts, m8->artifacts);
  EXPECT_EQ(m1->artifacts[0].path, "d0/f0");
  EXPECT_EQ(m1->artifacts[1].path, "d0/f105");
}

TEST(ManifestBuilderTest, ExcludesFilesAndDirectories) {
  TempDir dir;
  WriteFileOrDie(dir.Join("keep.cubin"), "k");
  WriteFileOrDie(dir.Join("manifest.json"), "{}");
  WriteFileOrDie(dir.Join("tmp/a"), "a");
  WriteFileOrDie(dir.Join("tmp/b/c"), "c");
  ManifestBuildOptions o = Options();
  o.exclude = {"./manifest.json", "tmp/"};
  absl::StatusOr<Manifest> m = BuildManifestFromDirectory(dir.path(), o);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->artifacts.size(), 1u);
  EXPECT_EQ(m->artifacts[0].path, "keep.cubin");
}

TEST(ManifestBuilderTest, FollowsSymlinksInsideTheDirectory) {
  TempDir dir;
  WriteFileOrDie(dir.Join("real/a.cubin"), "aaa");
  ASSERT_EQ(::symlink("real/a.cubin", dir.Join("alias.cubin").c_str()), 0);
  ASSERT_EQ(::symlink("real", dir.Join("linked_dir").c_str()), 0);
  absl::StatusOr<Manifest> m = BuildManifestFromDirectory(dir.path(), Options());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->artifacts.size(), 3u);
  EXPECT_EQ(m->artifacts[0].path, "alias.cubin");
  EXPECT_EQ(m->artifacts[1].path, "linked_dir/a.cubin");
  EXPECT_EQ(m->artifacts[2].path, "real/a.cubin");
  EXPECT_EQ(m->artifacts[0].sha256, Sha256Hex("aaa"));
  EXPECT_EQ(m->artifacts[0].size, 3u);
}

TEST(ManifestBuilderTest, RefusesSymlinksOutsideAndNamesThem) {
  TempDir outside;
  WriteFileOrDie(outside.Join("secret"), "s");
  TempDir dir;
  WriteFileOrDie(dir.Join("ok.cubin"), "o");
  const std::string link = dir.Join("sub/escape.cubin");
  WriteFileOrDie(dir.Join("sub/x"), "x");
  ASSERT_EQ(::symlink(outside.Join("secret").c_str(), link.c_str()), 0);
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), Options()),
              StatusIs(kInvalid, HasSubstr(link + ": symbolic link points outside " + dir.path())));
  // A relative link that climbs out is refused the same way.
  ASSERT_EQ(::unlink(link.c_str()), 0);
  ASSERT_EQ(::symlink("../../", link.c_str()), 0);
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), Options()),
              StatusIs(kInvalid, HasSubstr(link + ": symbolic link points outside")));
}

TEST(ManifestBuilderTest, RefusesDanglingAndLoopingLinks) {
  TempDir dir;
  WriteFileOrDie(dir.Join("sub/a"), "a");
  ASSERT_EQ(::symlink("nowhere", dir.Join("dangling").c_str()), 0);
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), Options()),
              StatusIs(kInvalid, HasSubstr(dir.Join("dangling") +
                                           ": symbolic link to \"nowhere\" cannot be resolved")));
  ASSERT_EQ(::unlink(dir.Join("dangling").c_str()), 0);
  ASSERT_EQ(::symlink("..", dir.Join("sub/up").c_str()), 0);
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), Options()),
              StatusIs(kInvalid, HasSubstr(dir.Join("sub/up") +
                                           ": symbolic link to an enclosing directory")));
}

TEST(ManifestBuilderTest, RefusesFileNamesThatAreNotValidPaths) {
  TempDir dir;
  WriteFileOrDie(dir.Join("bad\\name"), "x");
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), Options()),
              StatusIs(kInvalid, HasSubstr("path \"bad\\\\name\" contains a backslash")));
}

TEST(ManifestBuilderTest, SkipsNonRegularFiles) {
  TempDir dir;
  WriteFileOrDie(dir.Join("a"), "a");
  ASSERT_EQ(::mkfifo(dir.Join("fifo").c_str(), 0600), 0);
  absl::StatusOr<Manifest> m = BuildManifestFromDirectory(dir.path(), Options());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->artifacts.size(), 1u);
}

TEST(ManifestBuilderTest, OptionErrors) {
  TempDir dir;
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), Options("bad name")),
              StatusIs(kInvalid, HasSubstr("manifest name: expected 1 to 128 characters")));
  ManifestBuildOptions o = Options();
  o.version = 0;
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), o),
              StatusIs(kInvalid, HasSubstr("manifest version: expected an integer from 1")));
  EXPECT_THAT(BuildManifestFromDirectory(dir.Join("missing"), Options()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing: cannot open directory")));
  WriteFileOrDie(dir.Join("file"), "x");
  EXPECT_THAT(BuildManifestFromDirectory(dir.Join("file"), Options()),
              StatusIs(kInvalid, HasSubstr("file: not a directory")));
}

TEST(ManifestBuilderTest, MergesKernelsFromArrayOrObject) {
  TempDir dir;
  WriteFileOrDie(dir.Join("cubins/a.cubin"), "a");
  WriteFileOrDie(dir.Join("cubins/b.cubin"), "b");
  TempDir meta;
  nlohmann::json kernels = {Kernel("ka", "cubins/a.cubin"), Kernel("kb", "cubins/b.cubin")};
  kernels[1]["k_multiple"] = 128;
  WriteFileOrDie(meta.Join("array.json"), kernels.dump());
  WriteFileOrDie(meta.Join("object.json"), nlohmann::json{{"kernels", kernels}}.dump());
  for (const char* file : {"array.json", "object.json"}) {
    ManifestBuildOptions o = Options();
    o.kernels_file = meta.Join(file);
    absl::StatusOr<Manifest> m = BuildManifestFromDirectory(dir.path(), o);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_EQ(m->kernels.size(), 2u) << file;
    EXPECT_EQ(m->kernels[0].name, "ka");
    EXPECT_EQ(m->kernels[0].function, "f_ka");
    EXPECT_EQ(m->kernels[1].artifact, "cubins/b.cubin");
    EXPECT_EQ(m->kernels[1].extras.at("k_multiple"), "128");
  }
}

TEST(ManifestBuilderTest, KernelErrorsNameTheKernelAndPath) {
  TempDir dir;
  WriteFileOrDie(dir.Join("cubins/a.cubin"), "a");
  TempDir meta;
  ManifestBuildOptions o = Options();
  o.kernels_file = meta.Join("kernels.json");
  WriteFileOrDie(o.kernels_file,
                 nlohmann::json{Kernel("ka", "cubins/a.cubin"), Kernel("kx", "cubins/x.cubin")}.dump());
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), o),
              StatusIs(kInvalid, HasSubstr(o.kernels_file + ": kernel \"kx\": artifact "
                                           "\"cubins/x.cubin\" is not a file under " + dir.path())));
  nlohmann::json bad = nlohmann::json::array({Kernel("ka", "cubins/a.cubin")});
  bad[0]["tile_m"] = "64";
  WriteFileOrDie(o.kernels_file, bad.dump());
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), o),
              StatusIs(kInvalid, HasSubstr(o.kernels_file +
                                           ": [0].tile_m: expected a positive integer, got \"64\"")));
  WriteFileOrDie(o.kernels_file, nlohmann::json{Kernel("ka", "cubins/a.cubin"),
                                                Kernel("ka", "cubins/a.cubin")}.dump());
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), o),
              StatusIs(kInvalid, HasSubstr("[1].name: duplicate \"ka\" (also [0])")));
  o.kernels_file = meta.Join("missing.json");
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), o),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("missing.json")));
}

TEST(ManifestBuilderTest, UnreadableFileIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files regardless of mode";
  TempDir dir;
  WriteFileOrDie(dir.Join("locked"), "x");
  ASSERT_EQ(::chmod(dir.Join("locked").c_str(), 0), 0);
  EXPECT_THAT(BuildManifestFromDirectory(dir.path(), Options()),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("locked")));
}

}  // namespace
}  // namespace cubist
