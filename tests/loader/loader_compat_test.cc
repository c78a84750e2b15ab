// SM compatibility rules and the messages that refuse an image before any driver call.
#include "loader/compat.h"

#include "tests/testlib/cubin_builder.h"
#include "tests/testlib/loader_fixtures.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

SmTarget Sm(const char* s) { return *SmTarget::Parse(s); }

TEST(LoaderCompat, SassRules) {
  // Same major, minor at least as high.
  EXPECT_TRUE(SassRunsOn(Sm("sm_80"), {8, 0}));
  EXPECT_TRUE(SassRunsOn(Sm("sm_80"), {8, 6}));
  EXPECT_TRUE(SassRunsOn(Sm("sm_86"), {8, 9}));
  EXPECT_FALSE(SassRunsOn(Sm("sm_86"), {8, 0}));
  EXPECT_FALSE(SassRunsOn(Sm("sm_80"), {9, 0}));  // never across majors
  EXPECT_FALSE(SassRunsOn(Sm("sm_90"), {10, 0}));
  EXPECT_TRUE(SassRunsOn(Sm("sm_90"), {9, 0}));
  // `a`: exactly that SM.
  EXPECT_TRUE(SassRunsOn(Sm("sm_90a"), {9, 0}));
  EXPECT_FALSE(SassRunsOn(Sm("sm_90a"), {10, 0}));
  EXPECT_TRUE(SassRunsOn(Sm("sm_100a"), {10, 0}));
  EXPECT_FALSE(SassRunsOn(Sm("sm_100a"), {10, 3}));
  // `f`: its family.
  EXPECT_TRUE(SassRunsOn(Sm("sm_100f"), {10, 0}));
  EXPECT_TRUE(SassRunsOn(Sm("sm_100f"), {10, 3}));
  EXPECT_FALSE(SassRunsOn(Sm("sm_100f"), {11, 0}));
  EXPECT_FALSE(SassRunsOn(Sm("sm_100f"), {12, 0}));  // FlashInfer #4107
  EXPECT_FALSE(SassRunsOn(Sm("sm_103f"), {10, 0}));
  EXPECT_TRUE(SassRunsOn(Sm("sm_120f"), {12, 1}));
}

TEST(LoaderCompat, PtxRules) {
  EXPECT_TRUE(PtxRunsOn(Sm("compute_80"), {9, 0}));   // JIT forward
  EXPECT_TRUE(PtxRunsOn(Sm("compute_80"), {12, 0}));
  EXPECT_FALSE(PtxRunsOn(Sm("compute_90"), {8, 9}));
  EXPECT_TRUE(PtxRunsOn(Sm("compute_90a"), {9, 0}));
  EXPECT_FALSE(PtxRunsOn(Sm("compute_90a"), {10, 0}));
  EXPECT_TRUE(PtxRunsOn(Sm("compute_100f"), {10, 3}));
  EXPECT_FALSE(PtxRunsOn(Sm("compute_100f"), {12, 0}));
}

CubinInfo OneCubin(const char* sm) {
  CubinInfo info;
  ImageInfo img;
  img.sm = Sm(sm);
  info.images.push_back(img);
  return info;
}

TEST(LoaderCompat, RefusalNamesBothSms) {
  EXPECT_THAT(CheckCompatible(OneCubin("sm_80"), {9, 0}, "load k.cubin"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("load k.cubin: cubin for sm_80 cannot run on this "
                                       "sm_90 device"),
                             HasSubstr("same major version (sm_8x)"),
                             HasSubstr("use a cubin built for sm_90"))));
  EXPECT_THAT(CheckCompatible(OneCubin("sm_90a"), {10, 0}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cubin for sm_90a cannot run on this sm_100 device"),
                             HasSubstr("runs only on sm_90 itself"))));
  EXPECT_THAT(CheckCompatible(OneCubin("sm_86"), {8, 0}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("needs a device of the same major with minor >= 6")));
  CUBIST_EXPECT_OK(CheckCompatible(OneCubin("sm_90a"), {9, 0}));
  CUBIST_EXPECT_OK(CheckCompatible(OneCubin("sm_100f"), {10, 3}));
}

TEST(LoaderCompat, FatbinNeedsOneRunnableImage) {
  CubinInfo fat;
  fat.container = CubinInfo::Container::kFatbin;
  ImageInfo a;
  a.sm = Sm("sm_80");
  ImageInfo b;
  b.sm = Sm("sm_90a");
  fat.images = {a, b};
  CUBIST_EXPECT_OK(CheckCompatible(fat, {8, 6}));
  CUBIST_EXPECT_OK(CheckCompatible(fat, {9, 0}));
  EXPECT_THAT(CheckCompatible(fat, {10, 0}),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("fatbin has no image for this sm_100 device"),
                             HasSubstr("it holds sm_80, sm_90a"))));
  EXPECT_EQ(BestImageFor(fat, {9, 0})->sm.ToString(), "sm_90a");
  EXPECT_EQ(BestImageFor(fat, {8, 9})->sm.ToString(), "sm_80");
  EXPECT_EQ(BestImageFor(fat, {10, 0}), nullptr);

  // PTX rescues a newer device.
  ImageInfo ptx;
  ptx.kind = ImageInfo::Kind::kPtx;
  ptx.sm = Sm("compute_80");
  fat.images.push_back(ptx);
  CUBIST_EXPECT_OK(CheckCompatible(fat, {10, 0}));
  EXPECT_EQ(BestImageFor(fat, {10, 0})->kind, ImageInfo::Kind::kPtx);
  EXPECT_EQ(BestImageFor(fat, {9, 0})->sm.ToString(), "sm_90a");  // SASS beats PTX
}

TEST(LoaderCompat, NvccFatbinOnDevices) {
  CUBIST_FIXTURE_OR_SKIP(bytes, "kernels.fatbin");
  absl::StatusOr<CubinInfo> info = InspectCubin(bytes);
  CUBIST_ASSERT_OK(info);
  CUBIST_EXPECT_OK(CheckCompatible(*info, {9, 0}));
  CUBIST_EXPECT_OK(CheckCompatible(*info, {8, 0}));
  CUBIST_EXPECT_OK(CheckCompatible(*info, {10, 0}));  // through compute_90 PTX
  EXPECT_THAT(CheckCompatible(*info, {7, 5}),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("sm_75")));
}

}  // namespace
}  // namespace cubist
