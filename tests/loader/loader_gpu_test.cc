// GPU tests of the loader on the real driver. Each skips without a driver or a device
// (CI), and prints what it measured so that docs/gpu-results.md can quote the run.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/barrier.h"
#include "absl/time/clock.h"
#include "base/sha256.h"
#include "loader/context.h"
#include "loader/device_memory.h"
#include "loader/driver_api.h"
#include "loader/module_cache.h"
#include "tests/testlib/loader_fixtures.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::CubinPath;
using ::cubist::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The driver, or skip.
#define DRIVER_OR_SKIP(var)                                             \
  absl::StatusOr<DriverApi*> var##_or = GetDriver();                    \
  if (!var##_or.ok()) GTEST_SKIP() << var##_or.status().message();      \
  DriverApi& var = **var##_or

// The image this device should run: the sm_90a cubin on sm_90, else the fatbin.
std::string ImageFor(DeviceSm sm) {
  if (sm.major == 9 && sm.minor == 0) return CubinPath("kernels_sm_90a.cubin");
  return CubinPath("kernels.fatbin");
}

std::vector<float> RandomFloats(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-100.0f, 100.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Loads the kernels on `ctx`, runs add_one, scale and smem_stage, and checks every
// element. Returns a failure description, or "" when all matched.
void RunKernelsOn(DriverApi& driver, const PrimaryContext& ctx, bool prefer_library,
                  uint64_t seed) {
  ASSERT_TRUE(ctx.MakeCurrent().ok());
  std::string path = ImageFor(ctx.sm());
  if (!::cubist::testing::FileExists(path)) GTEST_SKIP() << path << " not built";
  ModuleCache::Options o;
  o.prefer_library_api = prefer_library;
  auto cache_or = ModuleCache::Create(driver, ctx.get(), o);
  CUBIST_ASSERT_OK(cache_or);
  auto& cache = *cache_or;
  ImageOptions io;
  io.skip_hash_check = true;
  ImageId img = *cache->AddImageFile(path, io);
  constexpr int kSmem = 100 * 1024;  // above the 48 KiB default: needs the attribute
  FunctionId add_one = *cache->AddFunction(img, "add_one");
  FunctionId scale = *cache->AddFunction(img, "scale");
  FunctionId stage = *cache->AddFunction(img, "smem_stage", kSmem);
  CUBIST_ASSERT_OK(cache->Preload({add_one, scale, stage}));

  constexpr int n = 1 << 20;
  std::vector<float> in = RandomFloats(n, seed);
  auto x = DeviceBuffer::Allocate(driver, n * sizeof(float));
  auto y = DeviceBuffer::Allocate(driver, n * sizeof(float));
  CUBIST_ASSERT_OK(x);
  CUBIST_ASSERT_OK(y);
  auto stream = Stream::Create(driver);
  CUBIST_ASSERT_OK(stream);
  CUBIST_ASSERT_OK(x->CopyFromHost(in.data(), n * sizeof(float)));
  CUBIST_ASSERT_OK(y->Fill(0xff));  // poison: NaNs everywhere

  // add_one: x += 1, 64 threads a block (its shared tile holds 64 floats).
  int count = n;
  void* add_args[] = {x->arg(), &count};
  ASSERT_EQ(driver.LaunchKernel(*cache->GetFunction(add_one), n / 64, 1, 1, 64, 1, 1, 0,
                                stream->get(), add_args, nullptr),
            CUDA_SUCCESS);
  // scale: x *= 0.5, at its launch bound of 128 threads.
  float half = 0.5f;
  void* scale_args[] = {x->arg(), &half, &count};
  ASSERT_EQ(driver.LaunchKernel(*cache->GetFunction(scale), n / 128, 1, 1, 128, 1, 1, 0,
                                stream->get(), scale_args, nullptr),
            CUDA_SUCCESS);
  // smem_stage through cuLaunchKernelEx with 100 KiB of dynamic shared memory.
  int smem = kSmem;
  void* stage_args[] = {x->arg(), y->arg(), &count, &smem};
  CUlaunchConfig config = {};
  config.gridDimX = n / 256;
  config.gridDimY = config.gridDimZ = 1;
  config.blockDimX = 256;
  config.blockDimY = config.blockDimZ = 1;
  config.sharedMemBytes = kSmem;
  config.hStream = stream->get();
  CUresult r = driver.LaunchKernelEx(&config, *cache->GetFunction(stage), stage_args, nullptr);
  ASSERT_EQ(r, CUDA_SUCCESS) << CuResultToString(driver, r);
  CUBIST_ASSERT_OK(stream->Synchronize());

  std::vector<float> out(n);
  CUBIST_ASSERT_OK(y->CopyToHost(out.data(), n * sizeof(float)));
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    float want = ((in[i] + 1.0f) * 0.5f) * 2.0f + 100.0f;
    if (!(out[i] == want)) {
      if (++bad < 5) ADD_FAILURE() << "element " << i << ": got " << out[i] << ", want " << want;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(cache->stats().images_loaded, 1u);
  EXPECT_EQ(cache->stats().functions_resolved, 3u);
  EXPECT_EQ(cache->stats().attributes_set, 1u);
  std::printf("[gpu] %s %s: add_one/scale/smem_stage(100 KiB) on %d elements: %d mismatches\n",
              ctx.sm().ToString().c_str(), prefer_library ? "cuLibraryLoadData" : "cuModuleLoadData",
              n, bad);
}

TEST(LoaderGpu, LoadLookupLaunch) {
  DRIVER_OR_SKIP(driver);
  auto ctx = PrimaryContext::Retain(driver, 0);
  CUBIST_ASSERT_OK(ctx);
  int version = 0;
  (void)driver.DriverGetVersion(&version);
  char name[256] = {};
  (void)driver.DeviceGetName(name, sizeof(name), ctx->device());
  std::printf("[gpu] device 0: %s, %s, driver %d\n", name, ctx->sm().ToString().c_str(), version);
  RunKernelsOn(driver, *ctx, /*prefer_library=*/true, 1);
}

TEST(LoaderGpu, ModuleApiPathToo) {
  DRIVER_OR_SKIP(driver);
  auto ctx = PrimaryContext::Retain(driver, 0);
  CUBIST_ASSERT_OK(ctx);
  RunKernelsOn(driver, *ctx, /*prefer_library=*/false, 2);
}

TEST(LoaderGpu, SixteenThreadsLoadOnce) {
  DRIVER_OR_SKIP(driver);
  auto ctx = PrimaryContext::Retain(driver, 0);
  CUBIST_ASSERT_OK(ctx);
  std::string path = ImageFor(ctx->sm());
  if (!::cubist::testing::FileExists(path)) GTEST_SKIP() << path << " not built";
  auto cache = *ModuleCache::Create(driver, ctx->get());
  ImageOptions io;
  io.expected_sha256 = *Sha256File(path);  // the hashed path, this time
  ImageId img = *cache->AddImageFile(path, io);
  FunctionId fn = *cache->AddFunction(img, "add_one");
  constexpr int kThreads = 16;
  absl::Barrier* start = new absl::Barrier(kThreads);
  std::vector<CUfunction> got(kThreads, nullptr);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  absl::Time t0 = absl::Now();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Threads start with no current context; the cache makes its own current.
      if (start->Block()) delete start;
      absl::StatusOr<CUfunction> f = cache->GetFunction(fn);
      if (f.ok()) got[t] = *f; else errors[t] = std::string(f.status().message());
    });
  }
  for (auto& th : threads) th.join();
  double ms = absl::ToDoubleMilliseconds(absl::Now() - t0);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << t;
    EXPECT_EQ(got[t], got[0]) << t;
  }
  EXPECT_NE(got[0], nullptr);
  EXPECT_EQ(cache->stats().images_loaded, 1u);
  EXPECT_EQ(cache->stats().functions_resolved, 1u);
  std::printf("[gpu] 16 threads, one image: %llu load(s), %llu lookup(s), %.2f ms\n",
              static_cast<unsigned long long>(cache->stats().images_loaded),
              static_cast<unsigned long long>(cache->stats().functions_resolved), ms);
}

TEST(LoaderGpu, Sm80CubinRefusedOnHopper) {
  DRIVER_OR_SKIP(driver);
  auto ctx = PrimaryContext::Retain(driver, 0);
  CUBIST_ASSERT_OK(ctx);
  if (ctx->sm().major != 9) GTEST_SKIP() << "needs an sm_9x device";
  std::string path = CubinPath("kernels_sm_80.cubin");
  if (!::cubist::testing::FileExists(path)) GTEST_SKIP() << path << " not built";
  auto cache = *ModuleCache::Create(driver, ctx->get());
  ImageOptions io;
  io.from_verified_store = true;
  ImageId img = *cache->AddImageFile(path, io);
  EXPECT_THAT(cache->GetFunction(img, "add_one"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("cubin for sm_80 cannot run on this sm_90 device"),
                             HasSubstr("same major version (sm_8x)"))));
  EXPECT_EQ(cache->stats().images_loaded, 0u);
  // What the driver itself says when asked anyway (for the record, not for the API).
  std::string bytes = ::cubist::testing::ReadFileOrDie(path);
  CUBIST_ASSERT_OK(ctx->MakeCurrent());
  CUmodule module = nullptr;
  CUresult r = driver.ModuleLoadData(&module, bytes.data());
  std::printf("[gpu] raw cuModuleLoadData(sm_80 cubin) on %s: %s\n",
              ctx->sm().ToString().c_str(), CuResultToString(driver, r).c_str());
  EXPECT_NE(r, CUDA_SUCCESS);
  if (r == CUDA_SUCCESS) (void)driver.ModuleUnload(module);
}

TEST(LoaderGpu, ContextPerDeviceInOneProcess) {
  DRIVER_OR_SKIP(driver);
  int count = 0;
  ASSERT_EQ(driver.DeviceGetCount(&count), CUDA_SUCCESS);
  if (count < 2) GTEST_SKIP() << "only " << count << " device(s)";
  std::vector<PrimaryContext> contexts;
  for (int d = 0; d < count; ++d) {
    auto ctx = PrimaryContext::Retain(driver, d);
    CUBIST_ASSERT_OK(ctx);
    contexts.push_back(std::move(*ctx));
  }
  // One thread per device, each with its own cache, at the same time.
  std::vector<std::thread> threads;
  for (int d = 0; d < count; ++d) {
    threads.emplace_back([&, d] { RunKernelsOn(driver, contexts[d], true, 100 + d); });
  }
  for (auto& t : threads) t.join();
  std::printf("[gpu] %d devices, one process: all ran\n", count);
}

TEST(LoaderGpu, ProcessPerGpu) {
  DRIVER_OR_SKIP(driver);
  if (std::getenv("CUBIST_GPU_TEST_CHILD") != nullptr) GTEST_SKIP() << "child";
  int count = 0;
  ASSERT_EQ(driver.DeviceGetCount(&count), CUDA_SUCCESS);
  // One child per device (two on a single GPU: processes sharing it must work too).
  int children = std::max(count, 2);
  std::vector<pid_t> pids;
  for (int c = 0; c < children; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string visible = std::to_string(c % count);
      setenv("CUDA_VISIBLE_DEVICES", visible.c_str(), 1);
      setenv("CUBIST_GPU_TEST_CHILD", "1", 1);
      execl("/proc/self/exe", "loader_gpu_test", "--gtest_filter=LoaderGpu.LoadLookupLaunch",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  for (size_t c = 0; c < pids.size(); ++c) {
    int status = 0;
    ASSERT_EQ(waitpid(pids[c], &status, 0), pids[c]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child " << c;
  }
  std::printf("[gpu] %d processes over %d device(s): all exited 0\n", children, count);
}

TEST(LoaderGpu, EventsTimeAKernel) {
  DRIVER_OR_SKIP(driver);
  auto ctx = PrimaryContext::Retain(driver, 0);
  CUBIST_ASSERT_OK(ctx);
  CUBIST_ASSERT_OK(ctx->MakeCurrent());
  auto stream = Stream::Create(driver);
  auto a = Event::Create(driver);
  auto b = Event::Create(driver);
  auto buf = DeviceBuffer::Allocate(driver, 256 << 20);
  CUBIST_ASSERT_OK(buf);
  CUBIST_ASSERT_OK(a->Record(stream->get()));
  CUBIST_ASSERT_OK(buf->FillAsync(7, stream->get()));
  CUBIST_ASSERT_OK(b->Record(stream->get()));
  CUBIST_ASSERT_OK(b->Synchronize());
  absl::StatusOr<float> ms = Event::ElapsedMs(*a, *b);
  CUBIST_ASSERT_OK(ms);
  EXPECT_GT(*ms, 0.0f);
  unsigned char probe = 0;
  CUBIST_ASSERT_OK(buf->CopyToHost(&probe, 1, (256 << 20) - 1));
  EXPECT_EQ(probe, 7);
  std::printf("[gpu] memset 256 MiB: %.3f ms (%.0f GB/s)\n", *ms,
              (256.0 * (1 << 20)) / (*ms * 1e6));
}

}  // namespace
}  // namespace cubist
