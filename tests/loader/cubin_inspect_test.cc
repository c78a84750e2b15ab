// Inspection of well-formed cubins and fatbins: nvcc-built fixtures (skipped without
// nvcc) and synthetic ones (always run).
#include <algorithm>

#include "loader/cubin.h"
#include "tests/testlib/cubin_builder.h"
#include "tests/testlib/loader_fixtures.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::BuildCubin;
using ::cubist::testing::BuildFatbin;
using ::cubist::testing::FakeCubinSpec;
using ::cubist::testing::FakeFatbinEntry;
using ::cubist::testing::FakeKernel;
using ::cubist::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const KernelInfo* Find(const ImageInfo& image, const std::string& name) {
  for (const KernelInfo& k : image.kernels) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::vector<std::string> Names(const ImageInfo& image) {
  std::vector<std::string> out;
  for (const KernelInfo& k : image.kernels) out.push_back(k.name);
  return out;
}

// --- nvcc fixtures -------------------------------------------------------------------

TEST(CubinInspectNvcc, Sm80KernelsAndMetadata) {
  CUBIST_FIXTURE_OR_SKIP(bytes, "kernels_sm_80.cubin");
  absl::StatusOr<CubinInfo> info = InspectCubin(bytes);
  CUBIST_ASSERT_OK(info);
  EXPECT_EQ(info->container, CubinInfo::Container::kCubin);
  ASSERT_EQ(info->images.size(), 1u);
  const ImageInfo& img = info->images[0];
  EXPECT_EQ(img.kind, ImageInfo::Kind::kCubin);
  EXPECT_EQ(img.sm.ToString(), "sm_80");
  EXPECT_EQ(img.elf_class, 64);
  EXPECT_EQ(img.size, bytes.size());
  EXPECT_FALSE(info->HasPtx());
  // nvcc 12.8+ writes ABI version 8 with the SM in bits 8-15.
  if (img.abi_version >= 8) EXPECT_EQ((img.e_flags >> 8) & 0xff, 80u);
  ASSERT_TRUE(img.toolkit_version.has_value());
  EXPECT_GE(*img.toolkit_version, 120);
  EXPECT_THAT(img.producer, HasSubstr("ptxas"));
  ASSERT_TRUE(img.virtual_sm.has_value());
  EXPECT_EQ(img.virtual_sm->number(), 80);

  EXPECT_THAT(Names(img), ElementsAre("add_one", "scale", "smem_stage"));
  const KernelInfo* add_one = Find(img, "add_one");
  ASSERT_NE(add_one, nullptr);
  EXPECT_EQ(add_one->static_shared_bytes, 256);  // float tile[64]
  EXPECT_EQ(add_one->param_bytes, 12);           // float*, int
  EXPECT_EQ(add_one->param_count, 2);
  ASSERT_TRUE(add_one->registers.has_value());
  EXPECT_GT(*add_one->registers, 0);
  EXPECT_LT(*add_one->registers, 64);
  EXPECT_FALSE(add_one->max_threads.has_value());
  EXPECT_GT(add_one->code_bytes, 0);

  const KernelInfo* scale = Find(img, "scale");
  ASSERT_NE(scale, nullptr);
  EXPECT_EQ(scale->max_threads, 128);  // __launch_bounds__(128)
  EXPECT_EQ(scale->param_bytes, 16);   // float*, float, int (+ padding)
  EXPECT_EQ(scale->param_count, 3);
  EXPECT_EQ(scale->static_shared_bytes, 0);

  const KernelInfo* stage = Find(img, "smem_stage");
  ASSERT_NE(stage, nullptr);
  EXPECT_EQ(stage->param_bytes, 24);
  EXPECT_EQ(stage->param_count, 4);
}

TEST(CubinInspectNvcc, VariantsFromNvcc) {
  struct Case {
    const char* file;
    const char* sm;
  } cases[] = {{"kernels_sm_90.cubin", "sm_90"},
               {"kernels_sm_90a.cubin", "sm_90a"},
               {"kernels_sm_100a.cubin", "sm_100a"},
               {"kernels_sm_100f.cubin", "sm_100f"}};
  int checked = 0;
  for (const Case& c : cases) {
    auto bytes = ::cubist::testing::ReadCubinFixture(c.file);
    if (!bytes) continue;
    absl::StatusOr<CubinInfo> info = InspectCubin(*bytes);
    CUBIST_ASSERT_OK(info);
    ASSERT_EQ(info->images.size(), 1u);
    EXPECT_EQ(info->images[0].sm.ToString(), c.sm) << c.file;
    EXPECT_EQ(info->images[0].kernels.size(), 3u) << c.file;
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no nvcc fixtures built";
}

TEST(CubinInspectNvcc, Sm90StaticSharedIncludesReservedKiB) {
  CUBIST_FIXTURE_OR_SKIP(bytes, "kernels_sm_90a.cubin");
  absl::StatusOr<CubinInfo> info = InspectCubin(bytes);
  CUBIST_ASSERT_OK(info);
  const KernelInfo* add_one = Find(info->images[0], "add_one");
  ASSERT_NE(add_one, nullptr);
  // 256 bytes of tile plus the 1 KiB that sm_90 code reserves for the system.
  EXPECT_EQ(add_one->static_shared_bytes, 256 + 1024);
}

TEST(CubinInspectNvcc, Fatbin) {
  CUBIST_FIXTURE_OR_SKIP(bytes, "kernels.fatbin");
  absl::StatusOr<CubinInfo> info = InspectCubin(bytes);
  CUBIST_ASSERT_OK(info);
  EXPECT_EQ(info->container, CubinInfo::Container::kFatbin);
  EXPECT_TRUE(info->HasPtx());
  std::vector<std::string> cubins, ptx;
  for (const ImageInfo& img : info->images) {
    if (img.kind == ImageInfo::Kind::kCubin) {
      cubins.push_back(img.sm.ToString());
      if (!img.compressed) {
        EXPECT_THAT(Names(img), ElementsAre("add_one", "scale", "smem_stage"));
        // The image's bytes are where the fatbin says they are.
        EXPECT_EQ(bytes.substr(img.offset, 4), std::string("\x7f" "ELF", 4));
      }
    } else if (img.kind == ImageInfo::Kind::kPtx) {
      ptx.push_back(img.sm.ToString());
    }
  }
  std::sort(cubins.begin(), cubins.end());
  EXPECT_THAT(cubins, ElementsAre("sm_80", "sm_90a"));
  EXPECT_THAT(ptx, ElementsAre("sm_90"));
}

TEST(CubinInspectNvcc, InspectFileNamesThePath) {
  absl::StatusOr<CubinInfo> missing = InspectCubinFile("/nonexistent/x.cubin");
  EXPECT_THAT(missing, StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/x.cubin")));
  ::cubist::testing::TempDir dir;
  ::cubist::testing::WriteFileOrDie(dir.Join("bad.cubin"), "hello world");
  EXPECT_THAT(InspectCubinFile(dir.Join("bad.cubin")),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(dir.Join("bad.cubin") + ": not a cubin or fatbin")));
}

// --- synthetic cubins ----------------------------------------------------------------

TEST(CubinInspectSynthetic, KernelFields) {
  FakeCubinSpec spec;
  spec.sm = 90;
  spec.kernels = {FakeKernel{"k_one", 40, 256, 48, 5, 2048, 512},
                  FakeKernel{"a_first", 8, 0, 8, 1, 0, 64}};
  absl::StatusOr<CubinInfo> info = InspectCubin(BuildCubin(spec));
  CUBIST_ASSERT_OK(info);
  const ImageInfo& img = info->images[0];
  EXPECT_EQ(img.sm.ToString(), "sm_90");
  EXPECT_EQ(img.abi_version, 8);
  EXPECT_EQ(img.toolkit_version, 130);
  EXPECT_EQ(img.producer, "ptxas Cuda compilation tools, release 13.0, V13.0.88");
  ASSERT_THAT(Names(img), ElementsAre("a_first", "k_one"));
  const KernelInfo& k = img.kernels[1];
  EXPECT_EQ(k.registers, 40);
  EXPECT_EQ(k.max_threads, 256);
  EXPECT_EQ(k.param_bytes, 48);
  EXPECT_EQ(k.param_count, 5);
  EXPECT_EQ(k.static_shared_bytes, 2048);
  EXPECT_EQ(k.code_bytes, 512);
  EXPECT_EQ(k.frame_bytes, 0);
  EXPECT_EQ(img.kernels[0].registers, 8);
  EXPECT_FALSE(img.kernels[0].max_threads.has_value());
}

TEST(CubinInspectSynthetic, ArchVariantFromCompatAttributeAlone) {
  FakeCubinSpec spec;
  spec.sm = 90;
  spec.variant = 'a';
  spec.with_notes = false;  // only .nv.compat says `a`
  absl::StatusOr<CubinInfo> info = InspectCubin(BuildCubin(spec));
  CUBIST_ASSERT_OK(info);
  EXPECT_EQ(info->images[0].sm.ToString(), "sm_90a");
}

TEST(CubinInspectSynthetic, FamilyVariantFromPtxasCommandLine) {
  FakeCubinSpec spec;
  spec.sm = 100;
  spec.variant = 'f';
  absl::StatusOr<CubinInfo> info = InspectCubin(BuildCubin(spec));
  CUBIST_ASSERT_OK(info);
  EXPECT_EQ(info->images[0].sm.ToString(), "sm_100f");
  EXPECT_EQ(info->images[0].e_flags, 0x06006402u);
}

TEST(CubinInspectSynthetic, OldAbiLayout) {
  FakeCubinSpec spec;
  spec.sm = 90;
  spec.variant = 'a';
  spec.abi_version = 7;
  spec.with_notes = false;
  std::string bytes = BuildCubin(spec);
  absl::StatusOr<CubinInfo> info = InspectCubin(bytes);
  CUBIST_ASSERT_OK(info);
  EXPECT_EQ(info->images[0].abi_version, 7);
  EXPECT_EQ(info->images[0].sm.ToString(), "sm_90a");
  ASSERT_TRUE(info->images[0].virtual_sm.has_value());
  EXPECT_EQ(info->images[0].virtual_sm->number(), 90);

  spec.variant = 0;
  spec.sm = 86;
  info = InspectCubin(BuildCubin(spec));
  CUBIST_ASSERT_OK(info);
  EXPECT_EQ(info->images[0].sm.ToString(), "sm_86");
}

TEST(CubinInspectSynthetic, CommandLineForAnotherSmIsIgnored) {
  // A tkinfo that names a different SM than e_flags must not change the variant.
  FakeCubinSpec spec;
  spec.sm = 90;
  spec.variant = 'f';  // builder writes "-arch sm_90f", e_flags say 90: consistent
  std::string bytes = BuildCubin(spec);
  size_t pos = bytes.find("-arch sm_90f");
  ASSERT_NE(pos, std::string::npos);
  bytes.replace(pos, 12, "-arch sm_80f");
  absl::StatusOr<CubinInfo> info = InspectCubin(bytes);
  CUBIST_ASSERT_OK(info);
  EXPECT_EQ(info->images[0].sm.ToString(), "sm_90");
}

TEST(CubinInspectSynthetic, FatbinVariantsFromEntryFlags) {
  FakeCubinSpec a;
  a.sm = 90;
  a.with_notes = false;
  FakeCubinSpec f;
  f.sm = 100;
  f.with_notes = false;
  std::string fat = BuildFatbin({
      FakeFatbinEntry{2, 90, 0x100011, BuildCubin(a)},
      FakeFatbinEntry{2, 100, 0x200011, BuildCubin(f)},
      FakeFatbinEntry{1, 80, 0x11, std::string(".version 9.0\n.target sm_80\n\0\0\0", 30)},
  });
  absl::StatusOr<CubinInfo> info = InspectCubin(fat);
  CUBIST_ASSERT_OK(info);
  ASSERT_EQ(info->images.size(), 3u);
  EXPECT_EQ(info->images[0].sm.ToString(), "sm_90a");
  EXPECT_EQ(info->images[1].sm.ToString(), "sm_100f");
  EXPECT_EQ(info->images[2].kind, ImageInfo::Kind::kPtx);
  EXPECT_EQ(info->images[2].sm.ToString(), "sm_80");
  EXPECT_EQ(info->Cubins().size(), 2u);
  EXPECT_TRUE(info->HasPtx());
}

TEST(CubinInspectSynthetic, FatbinEntryThatDisagreesWithItsElfIsRefused) {
  FakeCubinSpec spec;
  spec.sm = 80;
  std::string fat = BuildFatbin({FakeFatbinEntry{2, 90, 0x11, BuildCubin(spec)}});
  EXPECT_THAT(InspectCubin(fat),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("declares sm_90 but holds a cubin for sm_80")));
}

TEST(CubinInspectSynthetic, CompressedEntriesAreReportedNotParsed) {
  std::string fat = BuildFatbin({FakeFatbinEntry{2, 90, 0x2011, std::string(100, '\x5a')}});
  absl::StatusOr<CubinInfo> info = InspectCubin(fat);
  CUBIST_ASSERT_OK(info);
  ASSERT_EQ(info->images.size(), 1u);
  EXPECT_TRUE(info->images[0].compressed);
  EXPECT_TRUE(info->images[0].kernels.empty());
  EXPECT_EQ(info->images[0].sm.ToString(), "sm_90");
}

TEST(SmTargetTest, ParseAndPrint) {
  struct Case {
    const char* text;
    int major, minor;
    SmTarget::Variant variant;
    const char* printed;
  } cases[] = {
      {"sm_90a", 9, 0, SmTarget::Variant::kArch, "sm_90a"},
      {"sm_100f", 10, 0, SmTarget::Variant::kFamily, "sm_100f"},
      {"sm_80", 8, 0, SmTarget::Variant::kPlain, "sm_80"},
      {"compute_89", 8, 9, SmTarget::Variant::kPlain, "sm_89"},
      {"121a", 12, 1, SmTarget::Variant::kArch, "sm_121a"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<SmTarget> sm = SmTarget::Parse(c.text);
    CUBIST_ASSERT_OK(sm);
    EXPECT_EQ(sm->major, c.major) << c.text;
    EXPECT_EQ(sm->minor, c.minor) << c.text;
    EXPECT_EQ(sm->variant, c.variant) << c.text;
    EXPECT_EQ(sm->ToString(), c.printed);
  }
  for (const char* bad : {"", "sm_", "sm_9", "sm_9000", "sm_x0", "gfx90a", "sm_90b", "sm_05"}) {
    EXPECT_THAT(SmTarget::Parse(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("expected sm_<major><minor>")))
        << bad;
  }
}

}  // namespace
}  // namespace cubist
