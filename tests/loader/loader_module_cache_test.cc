// The module cache against a fake driver: loads once, looks up once, unloads on
// destruction, refuses before the driver sees anything, and behaves under 16 threads.
#include "loader/module_cache.h"

#include <thread>
#include <vector>

#include "absl/synchronization/barrier.h"
#include "base/sha256.h"
#include "loader/context.h"
#include "tests/testlib/cubin_builder.h"
#include "tests/testlib/fake_driver.h"
#include "tests/testlib/loader_fixtures.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::BuildCubin;
using ::cubist::testing::FakeCubinSpec;
using ::cubist::testing::FakeDriver;
using ::cubist::testing::FakeKernel;
using ::cubist::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Cubin(int sm = 90, char variant = 0) {
  FakeCubinSpec spec;
  spec.sm = sm;
  spec.variant = variant;
  spec.kernels = {FakeKernel{"gemm"}, FakeKernel{"gemm_big_smem"}, FakeKernel{"other"}};
  return BuildCubin(spec);
}

ImageOptions Checked(const std::string& bytes) {
  ImageOptions o;
  o.expected_sha256 = Sha256Hex(bytes);
  return o;
}

class ModuleCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { ctx_ = driver_.context_of(0); }
  std::unique_ptr<ModuleCache> NewCache(ModuleCache::Options o = {}) {
    absl::StatusOr<std::unique_ptr<ModuleCache>> c = ModuleCache::Create(driver_, ctx_, o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(c).value();
  }
  FakeDriver driver_;
  CUcontext ctx_ = nullptr;
};

TEST_F(ModuleCacheTest, RegistrationIsLazy) {
  auto cache = NewCache();
  EXPECT_EQ(cache->device_sm(), (DeviceSm{9, 0}));
  std::string bytes = Cubin();
  absl::StatusOr<ImageId> img = cache->AddImage("k.cubin", bytes, Checked(bytes));
  CUBIST_ASSERT_OK(img);
  absl::StatusOr<FunctionId> fn = cache->AddFunction(*img, "gemm");
  CUBIST_ASSERT_OK(fn);
  EXPECT_EQ(driver_.load_calls(), 0);
  EXPECT_EQ(driver_.lookups(), 0);

  absl::StatusOr<CUfunction> f = cache->GetFunction(*fn);
  CUBIST_ASSERT_OK(f);
  EXPECT_NE(*f, nullptr);
  EXPECT_EQ(driver_.loads(), 1);
  EXPECT_EQ(driver_.library_loads(), 1);  // the library API is preferred
  EXPECT_EQ(driver_.lookups(), 1);
  EXPECT_EQ(cache->stats().bytes_hashed, bytes.size());
}

TEST_F(ModuleCacheTest, LookupHappensOncePerFunction) {
  auto cache = NewCache();
  std::string bytes = Cubin();
  ImageId img = *cache->AddImage("k.cubin", bytes, Checked(bytes));
  FunctionId a = *cache->AddFunction(img, "gemm");
  FunctionId b = *cache->AddFunction(img, "other");
  CUfunction fa = *cache->GetFunction(a);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(*cache->GetFunction(a), fa);
  CUfunction fb = *cache->GetFunction(b);
  EXPECT_NE(fa, fb);
  EXPECT_EQ(driver_.loads(), 1);
  EXPECT_EQ(driver_.lookups(), 2);
  EXPECT_EQ(cache->stats().functions_resolved, 2u);
  // Registering again returns the same id; the by-name path shares the slot.
  EXPECT_EQ(*cache->AddFunction(img, "gemm"), a);
  EXPECT_EQ(*cache->GetFunction(img, "gemm"), fa);
  EXPECT_EQ(driver_.lookups(), 2);
}

TEST_F(ModuleCacheTest, SixteenThreadsLoadOnce) {
  auto cache = NewCache();
  driver_.SetLoadDelay(absl::Milliseconds(50));  // keep the race window open
  std::string bytes = Cubin();
  ImageId img = *cache->AddImage("k.cubin", bytes, Checked(bytes));
  FunctionId fn = *cache->AddFunction(img, "gemm");
  constexpr int kThreads = 16;
  absl::Barrier* start = new absl::Barrier(kThreads);
  std::vector<CUfunction> got(kThreads, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      if (start->Block()) delete start;
      absl::StatusOr<CUfunction> f = cache->GetFunction(fn);
      if (f.ok()) got[t] = *f;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(driver_.load_calls(), 1);
  EXPECT_EQ(driver_.lookups(), 1);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_NE(got[t], nullptr) << t;
    EXPECT_EQ(got[t], got[0]) << t;
  }
}

TEST_F(ModuleCacheTest, SixteenThreadsSixteenFunctionsOneImage) {
  auto cache = NewCache();
  driver_.SetLoadDelay(absl::Milliseconds(20));
  FakeCubinSpec spec;
  spec.kernels.clear();
  for (int k = 0; k < 16; ++k) spec.kernels.push_back(FakeKernel{"k" + std::to_string(k)});
  std::string bytes = BuildCubin(spec);
  ImageId img = *cache->AddImage("many.cubin", bytes, Checked(bytes));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      // Each thread registers and resolves its own function concurrently.
      absl::StatusOr<CUfunction> f = cache->GetFunction(img, "k" + std::to_string(t));
      if (!f.ok()) ++failures;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(driver_.load_calls(), 1);
  EXPECT_EQ(driver_.lookups(), 16);
}

TEST_F(ModuleCacheTest, UnloadsOnDestruction) {
  {
    auto cache = NewCache();
    std::string bytes = Cubin();
    ImageId a = *cache->AddImage("a.cubin", bytes, Checked(bytes));
    ImageId b = *cache->AddImage("b.cubin", bytes, Checked(bytes));
    ImageId never = *cache->AddImage("never.cubin", bytes, Checked(bytes));
    (void)never;
    CUBIST_ASSERT_OK(cache->LoadImage(a));
    CUBIST_ASSERT_OK(cache->GetFunction(b, "gemm").status());
    EXPECT_EQ(driver_.live_images(), 2);
    EXPECT_EQ(driver_.unloads(), 0);
  }
  EXPECT_EQ(driver_.unloads(), 2);
  EXPECT_EQ(driver_.live_images(), 0);
}

TEST_F(ModuleCacheTest, ModuleApiFallback) {
  FakeDriver old_driver({FakeDriver::Device{}}, /*library_api=*/false);
  {
    auto cache = *ModuleCache::Create(old_driver, old_driver.context_of(0));
    std::string bytes = Cubin();
    ImageId img = *cache->AddImage("k.cubin", bytes, Checked(bytes));
    CUBIST_ASSERT_OK(cache->GetFunction(img, "gemm").status());
    EXPECT_EQ(old_driver.module_loads(), 1);
    EXPECT_EQ(old_driver.library_loads(), 0);
  }
  EXPECT_EQ(old_driver.unloads(), 1);

  // And by choice, on a driver that has both.
  ModuleCache::Options o;
  o.prefer_library_api = false;
  auto cache = NewCache(o);
  std::string bytes = Cubin();
  ImageId img = *cache->AddImage("k.cubin", bytes, Checked(bytes));
  CUBIST_ASSERT_OK(cache->GetFunction(img, "gemm").status());
  EXPECT_EQ(driver_.module_loads(), 1);
}

TEST_F(ModuleCacheTest, DynamicSharedMemoryAttributeOnceAbove48KiB) {
  auto cache = NewCache();
  std::string bytes = Cubin();
  ImageId img = *cache->AddImage("k.cubin", bytes, Checked(bytes));
  FunctionId small = *cache->AddFunction(img, "gemm", 48 * 1024);
  FunctionId big = *cache->AddFunction(img, "gemm_big_smem", 200 * 1024);
  CUfunction fs = *cache->GetFunction(small);
  CUfunction fb = *cache->GetFunction(big);
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(cache->GetFunction(big).ok());
  EXPECT_EQ(driver_.set_attribute_calls(), 1);
  EXPECT_EQ(driver_.dynamic_shared_limit(fs), -1);
  EXPECT_EQ(driver_.dynamic_shared_limit(fb), 200 * 1024);

  // A later, larger request for a resolved function is applied at registration.
  EXPECT_EQ(*cache->AddFunction(img, "gemm", 64 * 1024), small);
  EXPECT_EQ(driver_.dynamic_shared_limit(fs), 64 * 1024);
  EXPECT_EQ(*cache->AddFunction(img, "gemm", 1024), small);  // smaller: nothing to do
  EXPECT_EQ(driver_.set_attribute_calls(), 2);
}

TEST_F(ModuleCacheTest, AttributeFailureIsReportedAndSticky) {
  auto cache = NewCache();
  driver_.FailSetAttribute(CUDA_ERROR_INVALID_VALUE);
  std::string bytes = Cubin();
  ImageId img = *cache->AddImage("k.cubin", bytes, Checked(bytes));
  FunctionId big = *cache->AddFunction(img, "gemm_big_smem", 300 * 1024);
  EXPECT_THAT(cache->GetFunction(big),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("MAX_DYNAMIC_SHARED_SIZE_BYTES, 307200"),
                             HasSubstr("CUDA_ERROR_INVALID_VALUE"))));
  EXPECT_FALSE(cache->GetFunction(big).ok());
  EXPECT_EQ(driver_.set_attribute_calls(), 1);
}

TEST_F(ModuleCacheTest, HashMismatchIsDataLossBeforeTheDriver) {
  auto cache = NewCache();
  std::string bytes = Cubin();
  ImageOptions o;
  o.expected_sha256 = Sha256Hex("something else");
  ImageId img = *cache->AddImage("cubins/k.cubin", bytes, o);
  EXPECT_THAT(cache->GetFunction(img, "gemm"),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("load cubins/k.cubin: sha256 mismatch: expected " +
                                       o.expected_sha256 + ", got " + Sha256Hex(bytes)),
                             HasSubstr("fetch the artifact again"))));
  EXPECT_EQ(driver_.load_calls(), 0);
  // Sticky: no second hash.
  EXPECT_FALSE(cache->GetFunction(img, "other").ok());
  EXPECT_EQ(cache->stats().bytes_hashed, bytes.size());
}

TEST_F(ModuleCacheTest, HashRequiredUnlessOptedOut) {
  auto cache = NewCache();
  EXPECT_THAT(cache->AddImage("k.cubin", Cubin(), ImageOptions{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no expected sha256")));
  ImageOptions bad;
  bad.expected_sha256 = "ABC";
  EXPECT_THAT(cache->AddImage("k.cubin", Cubin(), bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("64 lowercase hex")));

  ImageOptions store;
  store.from_verified_store = true;
  ImageId a = *cache->AddImage("a", Cubin(), store);
  ImageOptions skip;
  skip.skip_hash_check = true;
  ImageId b = *cache->AddImage("b", Cubin(), skip);
  CUBIST_EXPECT_OK(cache->LoadImage(a));
  CUBIST_EXPECT_OK(cache->LoadImage(b));
  EXPECT_EQ(cache->stats().bytes_hashed, 0u);
}

TEST_F(ModuleCacheTest, IncompatibleImageRefusedBeforeTheDriver) {
  auto cache = NewCache();
  std::string sm80 = Cubin(80);
  ImageId img = *cache->AddImage("cubins/sm_80/k.cubin", sm80, Checked(sm80));
  EXPECT_THAT(cache->GetFunction(img, "gemm"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("load cubins/sm_80/k.cubin"), HasSubstr("sm_80"),
                             HasSubstr("sm_90"))));
  std::string sm100a = Cubin(100, 'a');
  ImageId img2 = *cache->AddImage("b100a", sm100a, Checked(sm100a));
  EXPECT_THAT(cache->LoadImage(img2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cubin for sm_100a cannot run on this sm_90 device")));
  EXPECT_EQ(driver_.load_calls(), 0);
  EXPECT_EQ(cache->stats().load_failures, 2u);

  std::string sm90a = Cubin(90, 'a');
  ImageId ok = *cache->AddImage("b90a", sm90a, Checked(sm90a));
  CUBIST_EXPECT_OK(cache->LoadImage(ok));
}

TEST_F(ModuleCacheTest, MalformedImageRefusedBeforeTheDriver) {
  auto cache = NewCache();
  std::string junk = "\x7f" "ELF but not really";
  ImageId img = *cache->AddImage("junk.cubin", junk, Checked(junk));
  EXPECT_THAT(cache->LoadImage(img),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("load junk.cubin: cubin:")));
  EXPECT_EQ(driver_.load_calls(), 0);
}

TEST_F(ModuleCacheTest, MissingFunctionNamesWhatTheImageHas) {
  auto cache = NewCache();
  std::string bytes = Cubin();
  ImageId img = *cache->AddImage("k.cubin", bytes, Checked(bytes));
  EXPECT_THAT(cache->GetFunction(img, "gemn"),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("function gemn: not found in k.cubin"),
                             HasSubstr("it has gemm, gemm_big_smem, other"))));
  // The image itself stays usable.
  CUBIST_EXPECT_OK(cache->GetFunction(img, "gemm").status());
  EXPECT_EQ(driver_.loads(), 1);
}

TEST_F(ModuleCacheTest, DriverLoadFailureIsStickyAndMapped) {
  auto cache = NewCache();
  driver_.FailNextLoad(CUDA_ERROR_INVALID_IMAGE);
  std::string bytes = Cubin();
  ImageId img = *cache->AddImage("k.cubin", bytes, Checked(bytes));
  EXPECT_THAT(cache->LoadImage(img),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("load k.cubin: cuLibraryLoadData: CUDA_ERROR_INVALID_IMAGE")));
  EXPECT_THAT(cache->GetFunction(img, "gemm"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CUDA_ERROR_INVALID_IMAGE")));
  EXPECT_EQ(driver_.load_calls(), 1);
}

TEST_F(ModuleCacheTest, FileImagesReadLazilyAndRetryWhileMissing) {
  auto cache = NewCache();
  ::cubist::testing::TempDir dir;
  std::string path = dir.Join("late.cubin");
  std::string bytes = Cubin();
  ImageOptions o = Checked(bytes);
  ImageId img = *cache->AddImageFile(path, o);
  EXPECT_EQ(*cache->AddImageFile(path, o), img);  // same path, same id
  EXPECT_THAT(cache->LoadImage(img),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(path)));
  ::cubist::testing::WriteFileOrDie(path, bytes);  // e.g. a fetch finished
  CUBIST_EXPECT_OK(cache->LoadImage(img));
  EXPECT_EQ(driver_.loads(), 1);
}

TEST_F(ModuleCacheTest, PreloadResolvesEverythingUpFront) {
  auto cache = NewCache();
  std::string bytes = Cubin();
  ImageId img = *cache->AddImage("k.cubin", bytes, Checked(bytes));
  FunctionId a = *cache->AddFunction(img, "gemm");
  FunctionId b = *cache->AddFunction(img, "other", 100000);
  CUBIST_ASSERT_OK(cache->Preload({a}));
  EXPECT_EQ(driver_.lookups(), 1);
  CUBIST_ASSERT_OK(cache->PreloadAll());
  EXPECT_EQ(driver_.lookups(), 2);
  EXPECT_EQ(driver_.set_attribute_calls(), 1);
  int calls_before = driver_.load_calls() + driver_.lookups() + driver_.set_attribute_calls();
  CUBIST_EXPECT_OK(cache->GetFunction(a).status());
  CUBIST_EXPECT_OK(cache->GetFunction(b).status());
  EXPECT_EQ(driver_.load_calls() + driver_.lookups() + driver_.set_attribute_calls(),
            calls_before);

  FunctionId missing = *cache->AddFunction(img, "nope");
  EXPECT_THAT(cache->PreloadAll(), StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
  (void)missing;
}

TEST_F(ModuleCacheTest, RestoresTheCallersContext) {
  FakeDriver two({FakeDriver::Device{}, FakeDriver::Device{10, 0, "Fake B200"}});
  auto cache0 = *ModuleCache::Create(two, two.context_of(0));
  auto cache1 = *ModuleCache::Create(two, two.context_of(1));
  EXPECT_EQ(cache1->device_sm(), (DeviceSm{10, 0}));
  ASSERT_EQ(two.CtxSetCurrent(two.context_of(1)), CUDA_SUCCESS);
  std::string bytes = Cubin(90, 'a');
  ImageId img = *cache0->AddImage("k.cubin", bytes, Checked(bytes));
  CUBIST_ASSERT_OK(cache0->GetFunction(img, "gemm").status());
  CUcontext now = nullptr;
  ASSERT_EQ(two.CtxGetCurrent(&now), CUDA_SUCCESS);
  EXPECT_EQ(now, two.context_of(1));
  // The same bytes are refused on the other device of the same process.
  ImageId img1 = *cache1->AddImage("k.cubin", bytes, Checked(bytes));
  EXPECT_THAT(cache1->LoadImage(img1),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("sm_90a cannot run on this sm_100 device")));
}

TEST_F(ModuleCacheTest, BadIds) {
  auto cache = NewCache();
  EXPECT_THAT(cache->GetFunction(FunctionId{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown function id")));
  EXPECT_THAT(cache->AddFunction(ImageId{7}, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown image id 7")));
  EXPECT_THAT(cache->LoadImage(ImageId{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown image id")));
  std::string bytes = Cubin();
  ImageId img = *cache->AddImage("k", bytes, Checked(bytes));
  EXPECT_THAT(cache->AddFunction(img, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty function name")));
  EXPECT_THAT(ModuleCache::Create(driver_, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no context")));
}

TEST(PrimaryContextTest, RetainReleaseAndRange) {
  FakeDriver driver({FakeDriver::Device{}, FakeDriver::Device{10, 0}});
  {
    absl::StatusOr<PrimaryContext> c1 = PrimaryContext::Retain(driver, 1);
    CUBIST_ASSERT_OK(c1);
    EXPECT_EQ(c1->get(), driver.context_of(1));
    EXPECT_EQ(c1->sm(), (DeviceSm{10, 0}));
    PrimaryContext moved = std::move(*c1);
    EXPECT_FALSE(c1->valid());
    EXPECT_TRUE(moved.valid());
    EXPECT_EQ(driver.primary_retains(), 1);
  }
  EXPECT_EQ(driver.primary_releases(), 1);
  EXPECT_THAT(PrimaryContext::Retain(driver, 2),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("device 2: out of range, the driver sees 2 device(s)")));
}

}  // namespace
}  // namespace cubist
