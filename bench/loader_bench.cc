// Loader benchmark: the module cache against the raw driver calls it wraps, side by side
// in one run, for a small (~8 KB) and a large (~1 MB) cubin.
//
//   first use:  raw cuModuleLoadData + cuModuleGetFunction
//               raw cuLibraryLoadData + cuLibraryGetKernel + cuKernelGetFunction
//               ModuleCache AddImage + GetFunction (library and module paths; bytes from
//               the verified store, and bytes hashed at load)
//   cached:     raw cuModuleGetFunction / cuKernelGetFunction on a loaded image
//               ModuleCache::GetFunction(FunctionId) hit (1 and 16 threads), and the
//               by-name convenience path
//
// Images are unloaded after each benchmark's timed loop, never inside it. The cubins come
// from tests/loader/CMakeLists.txt ($CUBIST_TEST_CUBIN_DIR, else <build>/tests/cubins). Without a
// driver or a GPU the program says so and exits 0. After the runs it prints each of ours
// as a ratio of its raw baseline ("ratios" lines), which docs/benchmarks.md quotes.
// Run it with --benchmark_repetitions=5 --benchmark_enable_random_interleaving=true so
// that raw and cached runs alternate in time; the ratios then use medians.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "loader/context.h"
#include "loader/driver_api.h"
#include "loader/module_cache.h"

namespace cubist {
namespace {

struct Env {
  DriverApi* driver = nullptr;
  PrimaryContext ctx;
  std::string small;  // kernels_sm_90a.cubin (or the fatbin off sm_90)
  std::string large;  // large_sm_90a.cubin
  std::string small_fn = "add_one";
  std::string large_fn = "_Z10long_chainILi0EEvPKfPf";
};
Env* env = nullptr;

// The file's bytes, or "" when it is missing (the benchmarks then skip).
std::string ReadFile(const std::string& path) {
  return ReadFileToString(path).value_or("");
}

const std::string& Bytes(int which) { return which == 0 ? env->small : env->large; }
const std::string& Fn(int which) { return which == 0 ? env->small_fn : env->large_fn; }
const char* Label(int which) { return which == 0 ? "small" : "large"; }

void Check(CUresult r, benchmark::State& state, const char* what) {
  if (r != CUDA_SUCCESS) {
    state.SkipWithError(absl::StrCat(what, ": ", CuResultToString(*env->driver, r)).c_str());
  }
}

// --- first use ------------------------------------------------------------------------

void BM_RawModuleFirstUse(benchmark::State& state) {
  DriverApi& d = *env->driver;
  const std::string& bytes = Bytes(state.range(0));
  std::vector<CUmodule> modules;
  modules.reserve(state.max_iterations);
  for (auto _ : state) {
    CUmodule m = nullptr;
    CUfunction f = nullptr;
    Check(d.ModuleLoadData(&m, bytes.data()), state, "cuModuleLoadData");
    Check(d.ModuleGetFunction(&f, m, Fn(state.range(0)).c_str()), state, "cuModuleGetFunction");
    benchmark::DoNotOptimize(f);
    modules.push_back(m);
  }
  for (CUmodule m : modules) (void)d.ModuleUnload(m);
  state.SetLabel(Label(state.range(0)));
}

void BM_RawLibraryFirstUse(benchmark::State& state) {
  DriverApi& d = *env->driver;
  const std::string& bytes = Bytes(state.range(0));
  std::vector<CUlibrary> libs;
  libs.reserve(state.max_iterations);
  for (auto _ : state) {
    CUlibrary lib = nullptr;
    CUkernel k = nullptr;
    CUfunction f = nullptr;
    Check(d.LibraryLoadData(&lib, bytes.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
          state, "cuLibraryLoadData");
    Check(d.LibraryGetKernel(&k, lib, Fn(state.range(0)).c_str()), state, "cuLibraryGetKernel");
    Check(d.KernelGetFunction(&f, k), state, "cuKernelGetFunction");
    benchmark::DoNotOptimize(f);
    libs.push_back(lib);
  }
  for (CUlibrary l : libs) (void)d.LibraryUnload(l);
  state.SetLabel(Label(state.range(0)));
}

// range(0): small/large; range(1): 1 library API, 0 module API; range(2): 1 hash at load.
void BM_CacheFirstUse(benchmark::State& state) {
  ModuleCache::Options o;
  o.prefer_library_api = state.range(1) == 1;
  auto cache = ModuleCache::Create(*env->driver, env->ctx.get(), o);
  if (!cache.ok()) {
    state.SkipWithError(std::string(cache.status().message()).c_str());
    return;
  }
  const std::string& bytes = Bytes(state.range(0));
  ImageOptions io;
  if (state.range(2) == 1) {
    io.expected_sha256 = Sha256Hex(bytes);
  } else {
    io.from_verified_store = true;
  }
  // The caller hands over bytes it owns; make those copies outside the timed loop.
  std::vector<std::string> copies(state.max_iterations, bytes);
  size_t i = 0;
  for (auto _ : state) {
    absl::StatusOr<ImageId> img = (*cache)->AddImage("bench.cubin", std::move(copies[i++]), io);
    absl::StatusOr<CUfunction> f = (*cache)->GetFunction(*img, Fn(state.range(0)));
    if (!f.ok()) {
      state.SkipWithError(std::string(f.status().message()).c_str());
      break;
    }
    benchmark::DoNotOptimize(*f);
  }
  state.SetLabel(absl::StrCat(Label(state.range(0)), state.range(1) ? " library" : " module",
                              state.range(2) ? " hashed" : " store"));
  // Destroying the cache unloads everything, outside the timed loop.
}

// --- cached lookups --------------------------------------------------------------------

struct Loaded {
  std::unique_ptr<ModuleCache> cache;
  ImageId image;
  FunctionId fn;
  CUmodule module = nullptr;
  CUlibrary library = nullptr;
  CUkernel kernel = nullptr;
};
Loaded* loaded = nullptr;

void SetUpLoaded() {
  loaded = new Loaded;
  loaded->cache = std::move(ModuleCache::Create(*env->driver, env->ctx.get())).value();
  ImageOptions io;
  io.from_verified_store = true;
  loaded->image = *loaded->cache->AddImage("small", env->small, io);
  loaded->fn = *loaded->cache->AddFunction(loaded->image, env->small_fn);
  (void)loaded->cache->Preload({loaded->fn});
  DriverApi& d = *env->driver;
  (void)d.ModuleLoadData(&loaded->module, env->small.data());
  (void)d.LibraryLoadData(&loaded->library, env->small.data(), nullptr, nullptr, 0, nullptr,
                          nullptr, 0);
  (void)d.LibraryGetKernel(&loaded->kernel, loaded->library, env->small_fn.c_str());
}

void BM_RawModuleGetFunction(benchmark::State& state) {
  CUfunction f = nullptr;
  for (auto _ : state) {
    CUresult r = env->driver->ModuleGetFunction(&f, loaded->module, env->small_fn.c_str());
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(f);
  }
}

void BM_RawKernelGetFunction(benchmark::State& state) {
  CUfunction f = nullptr;
  for (auto _ : state) {
    CUresult r = env->driver->KernelGetFunction(&f, loaded->kernel);
    benchmark::DoNotOptimize(r);
    benchmark::DoNotOptimize(f);
  }
}

void BM_CacheGetFunctionHit(benchmark::State& state) {
  ModuleCache& cache = *loaded->cache;
  FunctionId id = loaded->fn;
  for (auto _ : state) {
    absl::StatusOr<CUfunction> f = cache.GetFunction(id);
    benchmark::DoNotOptimize(f);
  }
}

void BM_CacheGetFunctionByNameHit(benchmark::State& state) {
  ModuleCache& cache = *loaded->cache;
  for (auto _ : state) {
    absl::StatusOr<CUfunction> f = cache.GetFunction(loaded->image, env->small_fn);
    benchmark::DoNotOptimize(f);
  }
}

// Iteration counts are fixed so that every image loaded in a timed loop stays resident
// until the loop ends (2000 x 8 KB, 200 x 1 MB).
void RegisterAll() {
  for (int which : {0, 1}) {
    int iters = which == 0 ? 2000 : 200;
    benchmark::RegisterBenchmark("first/raw_module", BM_RawModuleFirstUse)
        ->Arg(which)->Iterations(iters)->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark("first/raw_library", BM_RawLibraryFirstUse)
        ->Arg(which)->Iterations(iters)->Unit(benchmark::kMicrosecond)->UseRealTime();
    for (int lib : {1, 0}) {
      for (int hash : {0, 1}) {
        benchmark::RegisterBenchmark("first/cache", BM_CacheFirstUse)
            ->Args({which, lib, hash})->Iterations(iters)->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
      }
    }
  }
  benchmark::RegisterBenchmark("cached/raw_cuModuleGetFunction", BM_RawModuleGetFunction)
      ->Unit(benchmark::kNanosecond);
  benchmark::RegisterBenchmark("cached/raw_cuKernelGetFunction", BM_RawKernelGetFunction)
      ->Unit(benchmark::kNanosecond);
  benchmark::RegisterBenchmark("cached/cache_GetFunction_id", BM_CacheGetFunctionHit)
      ->Unit(benchmark::kNanosecond)->Threads(1)->Threads(16);
  benchmark::RegisterBenchmark("cached/cache_GetFunction_name", BM_CacheGetFunctionByNameHit)
      ->Unit(benchmark::kNanosecond);
}

// Keeps every run's per-iteration real time (ns) for the ratio table.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (r.error_occurred) continue;
      // With --benchmark_repetitions, keep the median of each and ignore single runs.
      if (r.repetitions > 1 &&
          (r.run_type != Run::RT_Aggregate || r.aggregate_name != "median")) {
        continue;
      }
      double ns = r.GetAdjustedRealTime() *
                  (r.time_unit == benchmark::kMicrosecond   ? 1e3
                   : r.time_unit == benchmark::kMillisecond ? 1e6
                                                            : 1.0);
      times[r.run_name.str() + (r.report_label.empty() ? "" : " [" + r.report_label + "]")] = ns;
    }
  }
  std::map<std::string, double> times;
};

void PrintRatios(const std::map<std::string, double>& t) {
  auto find = [&](const std::string& prefix, const std::string& label) -> double {
    for (const auto& [name, ns] : t) {
      if (name.rfind(prefix, 0) == 0 && (label.empty() || name.find("[" + label + "]") != std::string::npos)) {
        return ns;
      }
    }
    return 0;
  };
  std::printf("\nratios (ours / raw baseline, same run; < 1 is faster):\n");
  for (const char* size : {"small", "large"}) {
    double raw_lib = find("first/raw_library/" + std::string(size == std::string("small") ? "0" : "1"), size);
    double raw_mod = find("first/raw_module/" + std::string(size == std::string("small") ? "0" : "1"), size);
    for (const char* path : {"library", "module"}) {
      for (const char* src : {"store", "hashed"}) {
        std::string label = absl::StrCat(size, " ", path, " ", src);
        double ours = find("first/cache/", label);
        double raw = std::string(path) == "library" ? raw_lib : raw_mod;
        if (ours > 0 && raw > 0) {
          std::printf("ratios first-use %-22s ours %9.1f us  raw %9.1f us  ratio %.2f\n",
                      label.c_str(), ours / 1e3, raw / 1e3, ours / raw);
        }
      }
    }
  }
  if (find("cached/", "") == 0) return;
  double hit = find("cached/cache_GetFunction_id", "");
  double by_name = find("cached/cache_GetFunction_name", "");
  double raw_mod = find("cached/raw_cuModuleGetFunction", "");
  double raw_kernel = find("cached/raw_cuKernelGetFunction", "");
  std::printf("ratios cached id lookup %.2f ns; vs cuModuleGetFunction %.1f ns: ratio %.3f; "
              "vs cuKernelGetFunction %.1f ns: ratio %.3f\n",
              hit, raw_mod, raw_mod > 0 ? hit / raw_mod : 0, raw_kernel,
              raw_kernel > 0 ? hit / raw_kernel : 0);
  std::printf("ratios cached by-name lookup %.1f ns (ratio to cuModuleGetFunction %.2f)\n",
              by_name, raw_mod > 0 ? by_name / raw_mod : 0);
}

std::string CubinDir() {
  const char* e = std::getenv("CUBIST_TEST_CUBIN_DIR");
  return e != nullptr && *e ? e : std::string(CUBIST_BINARY_DIR) + "/tests/cubins";
}

}  // namespace
}  // namespace cubist

int main(int argc, char** argv) {
  using namespace cubist;
  benchmark::Initialize(&argc, argv);
  absl::StatusOr<DriverApi*> driver = GetDriver();
  if (!driver.ok()) {
    std::printf("loader_bench: skipped: %s\n", std::string(driver.status().message()).c_str());
    return 0;
  }
  env = new Env;
  env->driver = *driver;
  auto ctx = PrimaryContext::Retain(**driver, 0);
  if (!ctx.ok() || !ctx->MakeCurrent().ok()) {
    std::printf("loader_bench: skipped: %s\n", std::string(ctx.status().message()).c_str());
    return 0;
  }
  env->ctx = std::move(*ctx);
  std::string dir = CubinDir();
  env->small = ReadFile(dir + (env->ctx.sm() == DeviceSm{9, 0} ? "/kernels_sm_90a.cubin"
                                                                : "/kernels.fatbin"));
  env->large = ReadFile(dir + "/large_sm_90a.cubin");
  if (env->small.empty() || env->large.empty() || env->ctx.sm() != DeviceSm{9, 0}) {
    std::printf("loader_bench: skipped: needs an sm_90 device and the cubins in %s\n",
                dir.c_str());
    return 0;
  }
  int version = 0;
  (void)env->driver->DriverGetVersion(&version);
  char name[256] = {};
  (void)env->driver->DeviceGetName(name, sizeof(name), env->ctx.device());
  const char* lazy = std::getenv("CUDA_MODULE_LOADING");
  std::printf("loader_bench: %s (%s), driver %d, small %zu bytes, large %zu bytes, "
              "CUDA_MODULE_LOADING=%s\n",
              name, env->ctx.sm().ToString().c_str(), version, env->small.size(),
              env->large.size(), lazy ? lazy : "(default: LAZY)");
  SetUpLoaded();
  RegisterAll();
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  PrintRatios(reporter.times);
  benchmark::Shutdown();
  return 0;
}
