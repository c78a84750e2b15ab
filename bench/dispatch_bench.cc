// Dispatch benchmarks (docs/benchmarks.md, "## Dispatch").
//
//   dispatch_bench [--manifest M] [google-benchmark flags]
//       CPU: a warm decision-cache lookup, and cold selection over the manifest's kernels
//       (a synthetic 120-kernel registry without --manifest).
//       GPU (with --manifest and a device): MoeGemm::KernelFor on a known problem, and
//       the host time of MoeGemm::Run against a raw cuLaunchKernelEx of the same kernel
//       with the same parameters (tiny problem, stream synchronised every 256 launches
//       outside the timed region).
//   dispatch_bench --startup M [--runs N]
//       Process start to the first finished kernel, in fresh processes (fork + exec of
//       this binary): cubist (Runtime::Open on the full manifest, MoeGemm::Create, Run,
//       synchronise) against the raw driver path (cuInit, primary context, read the
//       cubin, cuModuleLoadData, cuModuleGetFunction, shared-memory attribute, launch,
//       synchronise). The cache must already hold the kernel (one cubist run first).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "artifacts/cache_dir.h"
#include "artifacts/manifest_source.h"
#include "artifacts/store.h"
#include "base/file_util.h"
#include "loader/context.h"
#include "base/status_macros.h"
#include "benchmark/benchmark.h"
#include "dispatch/decision_cache.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/registry.h"
#include "dispatch/runtime.h"
#include "dispatch/selector.h"
#include "loader/device_memory.h"

namespace cubist {
namespace {

std::string g_manifest;

// The tiny problem the launch benchmarks use: launch cost dominates its run time.
MoeGemmArgs TinyArgs() {
  MoeGemmArgs a;
  a.activation = Activation::kIdentity;
  a.experts = 8;
  a.tokens = 64;
  a.n = 256;
  a.k = 256;
  return a;
}

MoeProblem SampleProblem(int i) {
  MoeProblem p;
  p.activation = Activation::kSwiglu;
  p.experts = 128;
  p.tokens = 128 * (1 + i % 64);
  p.n = 5760;
  p.k = 2880;
  p.sm_count = 132;
  return p;
}

void BM_DecisionCacheHit(benchmark::State& state) {
  DecisionCache<MoeProblem, MoeGemmDecision> cache(4096);
  std::vector<MoeProblem> keys;
  for (int i = 0; i < 64; ++i) {
    keys.push_back(SampleProblem(i));
    cache.Insert(keys.back(), MoeGemmDecision{});
  }
  size_t i = 0;
  for (auto _ : state) {
    const MoeGemmDecision* d = cache.Find(keys[i++ & 63]);
    benchmark::DoNotOptimize(d);
  }
}
BENCHMARK(BM_DecisionCacheHit);

absl::StatusOr<Manifest> BenchManifest() {
  if (!g_manifest.empty()) {
    OpenManifestOptions o;
    CUBIST_ASSIGN_OR_RETURN(OpenedManifest m, OpenManifest(g_manifest, o));
    return std::move(m.manifest);
  }
  Manifest m;
  m.source = "<synthetic>";
  const char* formats[][2] = {{"bf16", "bf16"}, {"fp8", "fp8"}, {"fp8-block", "fp8-block"},
                              {"mxfp4", "bf16"}, {"mxfp4", "mxfp8"}, {"nvfp4", "nvfp4"}};
  const char* acts[] = {"identity", "relu2", "swiglu", "geglu", "situ"};
  const int tiles[][3] = {{64, 128, 64}, {64, 128, 128}, {128, 128, 128}, {128, 256, 64}};
  for (auto& f : formats) {
    for (const char* act : acts) {
      for (auto& t : tiles) {
        KernelSpec k;
        k.name = absl::StrCat("moe_gemm_tma_", f[0], "_", f[1], "_", act, "_m", t[0], "n", t[1], "k", t[2]);
        k.artifact = k.name + ".cubin";
        k.function = k.name;
        k.arch = "sm_90a";
        k.op = "moe_gemm";
        k.abi = moe::kMoeGemmAbi;
        k.weight_format = f[0];
        k.activation_format = f[1];
        k.activation = act;
        k.tile_m = t[0];
        k.tile_n = t[1];
        k.tile_k = t[2];
        k.threads = 256;
        k.stages = 4;
        k.shared_mem_bytes = 99456;
        m.artifacts.push_back(Artifact{k.artifact, std::string(64, 'a'), 1, {}});
        m.kernels.push_back(std::move(k));
      }
    }
  }
  return m;
}

void BM_SelectCold(benchmark::State& state) {
  auto m = BenchManifest();
  if (!m.ok()) return state.SkipWithError(std::string(m.status().message()).c_str());
  auto r = Registry::Create(*m);
  if (!r.ok()) return state.SkipWithError(std::string(r.status().message()).c_str());
  MoeProblem p = SampleProblem(7);
  for (auto _ : state) {
    auto c = SelectKernel(*r, p);
    benchmark::DoNotOptimize(c);
  }
  state.counters["kernels"] = static_cast<double>(r->size());
}
BENCHMARK(BM_SelectCold);

// ---- GPU ------------------------------------------------------------------------

struct Gpu {
  std::unique_ptr<Runtime> rt;
  std::unique_ptr<MoeGemm> gemm;
  DeviceBuffer a, b, offsets, out;
  Stream stream;
  MoeGemmArgs args;
  const MoeGemmDecision* decision = nullptr;
};

Gpu* g_gpu = nullptr;

absl::StatusOr<std::unique_ptr<Gpu>> OpenGpu() {
  auto g = std::make_unique<Gpu>();
  RuntimeOptions o;
  o.manifest = g_manifest;
  o.prefetch = false;
  CUBIST_ASSIGN_OR_RETURN(g->rt, Runtime::Open(o));
  CUBIST_RETURN_IF_ERROR(g->rt->MakeCurrent());
  CUBIST_ASSIGN_OR_RETURN(g->gemm, MoeGemm::Create(*g->rt));
  DriverApi& d = g->rt->driver();
  MoeGemmArgs& a = g->args;
  a = TinyArgs();
  CUBIST_ASSIGN_OR_RETURN(g->a, DeviceBuffer::Allocate(d, a.tokens * a.k * 2));
  CUBIST_ASSIGN_OR_RETURN(g->b, DeviceBuffer::Allocate(d, a.experts * a.n * a.k * 2));
  CUBIST_ASSIGN_OR_RETURN(g->out, DeviceBuffer::Allocate(d, a.tokens * a.n * 2));
  CUBIST_RETURN_IF_ERROR(g->a.Fill(0x3C));  // bf16 0x3C3C: about 0.0115
  CUBIST_RETURN_IF_ERROR(g->b.Fill(0x3C));
  std::vector<int32_t> off(a.experts + 1);
  for (int e = 0; e <= a.experts; ++e) off[e] = static_cast<int32_t>(e * a.tokens / a.experts);
  CUBIST_ASSIGN_OR_RETURN(g->offsets, DeviceBuffer::Allocate(d, off.size() * 4));
  CUBIST_RETURN_IF_ERROR(g->offsets.CopyFromHost(off.data(), off.size() * 4));
  a.a = g->a.get();
  a.b = g->b.get();
  a.offsets = g->offsets.get();
  a.out = g->out.get();
  CUBIST_ASSIGN_OR_RETURN(g->stream, Stream::Create(d));
  CUBIST_RETURN_IF_ERROR(g->gemm->CanImplement(a));
  CUBIST_ASSIGN_OR_RETURN(g->decision, g->gemm->KernelFor(a));
  CUBIST_RETURN_IF_ERROR(g->gemm->Run(a, g->stream.get()));
  CUBIST_RETURN_IF_ERROR(g->stream.Synchronize());
  return g;
}

void BM_MoeGemmKernelForWarm(benchmark::State& state) {
  for (auto _ : state) {
    auto d = g_gpu->gemm->KernelFor(g_gpu->args);
    benchmark::DoNotOptimize(d);
  }
}

constexpr int kSyncEvery = 256;

void BM_MoeGemmRunHost(benchmark::State& state) {
  int n = 0;
  for (auto _ : state) {
    absl::Status s = g_gpu->gemm->Run(g_gpu->args, g_gpu->stream.get());
    if (!s.ok()) return state.SkipWithError(std::string(s.message()).c_str());
    if (++n % kSyncEvery == 0) {
      state.PauseTiming();
      (void)g_gpu->stream.Synchronize();
      state.ResumeTiming();
    }
  }
  (void)g_gpu->stream.Synchronize();
}

void BM_RawLaunchKernelExHost(benchmark::State& state) {
  // What an engine would write by hand: the same function, grid, block, shared memory
  // and parameter struct (MoeGemmLaunch::Config, as the op's), set up once, then
  // cuLaunchKernelEx in the loop.
  // For a version-2 (TMA) kernel the tensor maps are encoded here, once, as an engine
  // that prepared its launch by hand would.
  const MoeGemmDecision& d = *g_gpu->decision;
  const MoeGemmArgs& a = g_gpu->args;
  moe::MoeGemmParams p = moe::MoeGemmParamsInit();
  p.num_experts = static_cast<int32_t>(a.experts);
  p.num_tokens = static_cast<int32_t>(a.tokens);
  p.n = static_cast<int32_t>(a.n);
  p.k = static_cast<int32_t>(a.k);
  p.a = reinterpret_cast<const void*>(a.a);
  p.b = reinterpret_cast<const void*>(a.b);
  p.offsets = reinterpret_cast<const int32_t*>(a.offsets);
  p.out = reinterpret_cast<void*>(a.out);
  MoeGemmLaunch prepared;
  if (!PrepareMoeGemmLaunch(g_gpu->rt->driver(), d.info, p, g_gpu->rt->device_info().sm_count,
                            &prepared)
           .ok()) {
    return state.SkipWithError("PrepareMoeGemmLaunch failed");
  }
  const CUlaunchConfig config =
      prepared.Config(d.block, d.shared_mem_bytes, d.cluster,
                      /*programmatic_dependent_launch=*/false, g_gpu->stream.get());
  void** params = prepared.kernel_params();
  DriverApi& driver = g_gpu->rt->driver();
  int n = 0;
  for (auto _ : state) {
    CUresult r = driver.LaunchKernelEx(&config, d.function, params, nullptr);
    if (r != CUDA_SUCCESS) return state.SkipWithError("cuLaunchKernelEx failed");
    if (++n % kSyncEvery == 0) {
      state.PauseTiming();
      (void)g_gpu->stream.Synchronize();
      state.ResumeTiming();
    }
  }
  (void)g_gpu->stream.Synchronize();
}

// ---- process start to first kernel --------------------------------------------------

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int ChildCubist() {
  RuntimeOptions o;
  o.manifest = g_manifest;
  o.prefetch = false;
  auto rt = Runtime::Open(o);
  if (!rt.ok()) return std::fprintf(stderr, "%s\n", std::string(rt.status().message()).c_str()), 1;
  if (!(*rt)->MakeCurrent().ok()) return 1;
  auto gemm = MoeGemm::Create(**rt);
  if (!gemm.ok()) return 1;
  DriverApi& d = (*rt)->driver();
  MoeGemmArgs a = TinyArgs();
  auto ab = DeviceBuffer::Allocate(d, a.tokens * a.k * 2);
  auto bb = DeviceBuffer::Allocate(d, a.experts * a.n * a.k * 2);
  auto ob = DeviceBuffer::Allocate(d, a.tokens * a.n * 2);
  auto fb = DeviceBuffer::Allocate(d, (a.experts + 1) * 4);
  if (!ab.ok() || !bb.ok() || !ob.ok() || !fb.ok()) return 1;
  std::vector<int32_t> off(a.experts + 1);
  for (int e = 0; e <= a.experts; ++e) off[e] = static_cast<int32_t>(e * a.tokens / a.experts);
  if (!fb->CopyFromHost(off.data(), off.size() * 4).ok()) return 1;
  a.a = ab->get();
  a.b = bb->get();
  a.out = ob->get();
  a.offsets = fb->get();
  absl::Status s = (*gemm)->Run(a, nullptr);
  if (s.ok()) s = CuCheck(d, d.CtxSynchronize(), "sync");
  if (!s.ok()) return std::fprintf(stderr, "%s\n", std::string(s.message()).c_str()), 1;
  return 0;
}

int ChildRaw(const std::string& cubin, const std::string& function, int smem, int threads,
             int tile_m, int tile_n, int abi, int ctas_per_sm) {
  auto driver = GetDriver();
  if (!driver.ok()) return 1;
  DriverApi& d = **driver;
  CUdevice dev;
  CUcontext ctx;
  if (d.DeviceGet(&dev, 0) || d.DevicePrimaryCtxRetain(&ctx, dev) || d.CtxSetCurrent(ctx)) return 1;
  auto bytes = ReadFileToString(cubin);
  if (!bytes.ok()) return 1;
  CUmodule module;
  CUfunction f;
  if (d.ModuleLoadData(&module, bytes->data()) ||
      d.ModuleGetFunction(&f, module, function.c_str()))
    return 1;
  if (smem > 48 * 1024 &&
      d.FuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
    return 1;
  MoeGemmArgs a = TinyArgs();
  CUdeviceptr pa, pb, po, pf;
  if (d.MemAlloc(&pa, a.tokens * a.k * 2) || d.MemAlloc(&pb, a.experts * a.n * a.k * 2) ||
      d.MemAlloc(&po, a.tokens * a.n * 2) || d.MemAlloc(&pf, (a.experts + 1) * 4))
    return 1;
  std::vector<int32_t> off(a.experts + 1);
  for (int e = 0; e <= a.experts; ++e) off[e] = static_cast<int32_t>(e * a.tokens / a.experts);
  if (d.MemcpyHtoD(pf, off.data(), off.size() * 4)) return 1;
  moe::MoeGemmParams p = moe::MoeGemmParamsInit();
  p.num_experts = 8;
  p.num_tokens = 64;
  p.n = 256;
  p.k = 256;
  p.a = reinterpret_cast<const void*>(pa);
  p.b = reinterpret_cast<const void*>(pb);
  p.offsets = reinterpret_cast<const int32_t*>(pf);
  p.out = reinterpret_cast<void*>(po);
  // The kernel needs its two tensor maps: the same host calls an engine would make.
  MoeGemmKernelInfo info;
  info.abi = abi;
  info.activation = moe::kIdentity;
  info.tile_m = tile_m;
  info.tile_n = tile_n;
  info.ctas_per_sm = ctas_per_sm;
  int sms = 0;
  if (d.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)) return 1;
  MoeGemmLaunch launch;
  if (!PrepareMoeGemmLaunch(d, info, p, sms, &launch).ok()) return 1;
  const moe::MoeGemmGrid grid = launch.grid;
  CUlaunchConfig c = {};
  c.gridDimX = grid.x;
  c.gridDimY = c.gridDimZ = 1;
  c.blockDimX = threads;
  c.blockDimY = c.blockDimZ = 1;
  c.sharedMemBytes = smem;
  if (d.LaunchKernelEx(&c, f, launch.kernel_params(), nullptr) || d.CtxSynchronize()) return 1;
  return 0;
}

// The cubist path of a child, phase by phase, with the public pieces Runtime::Open is
// made of (to see where its time goes); printed to stdout.
int ChildPhases() {
  int64_t t = NowNs();
  auto lap = [&](const char* what) {
    const int64_t now = NowNs();
    std::printf("  %-34s %8.2f ms\n", what, (now - t) / 1e6);
    t = now;
  };
  auto driver = GetDriver();
  if (!driver.ok()) return 1;
  lap("dlopen libcuda + cuInit");
  auto ctx = PrimaryContext::Retain(**driver, 0);
  if (!ctx.ok()) return 1;
  lap("primary context");
  auto root = ResolveCacheDir("");
  auto store = Store::Open(*root, true);
  if (!store.ok()) return 1;
  lap("store open");
  OpenManifestOptions mo;
  mo.store = &*store;
  auto opened = OpenManifest(g_manifest, mo);
  if (!opened.ok()) return 1;
  lap("read + check + parse manifest");
  auto reg = Registry::Create(opened->manifest);
  if (!reg.ok()) return 1;
  lap("registry");
  RuntimeOptions o;
  o.manifest = g_manifest;
  o.prefetch = false;
  auto rt = Runtime::Open(o);
  if (!rt.ok() || !(*rt)->MakeCurrent().ok()) return 1;
  lap("Runtime::Open (warm driver)");
  auto gemm = MoeGemm::Create(**rt);
  if (!gemm.ok()) return 1;
  MoeGemmArgs a = TinyArgs();
  auto d = (*gemm)->KernelFor(a);
  if (!d.ok()) return 1;
  lap("select + load the kernel");
  return 0;
}

// Runs this binary with `args` and returns the wall time from fork to exit, in ms.
double TimeChild(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  const int64_t t0 = NowNs();
  pid_t pid = fork();
  if (pid == 0) {
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  const int64_t t1 = NowNs();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1;
  return (t1 - t0) / 1e6;
}

int Startup(const std::string& self, int runs) {
  OpenManifestOptions mo;
  auto opened = OpenManifest(g_manifest, mo);
  if (!opened.ok()) return std::fprintf(stderr, "%s\n", std::string(opened.status().message()).c_str()), 1;
  auto reg = Registry::Create(opened->manifest);
  if (!reg.ok()) return 1;
  MoeProblem p;
  MoeGemmArgs a = TinyArgs();
  p.experts = a.experts;
  p.tokens = a.tokens;
  p.n = a.n;
  p.k = a.k;
  p.activation = a.activation;
  SelectOptions so;
  so.abi = moe::kMoeGemmAbi;
  auto best = SelectKernel(*reg, p, so);
  if (!best.ok()) return std::fprintf(stderr, "%s\n", std::string(best.status().message()).c_str()), 1;
  auto root = ResolveCacheDir("");
  auto store = Store::Open(*root, true);
  if (!store.ok()) return 1;
  const KernelSpec& k = best->kernel->spec;
  const std::string cubin = store->ObjectPath(opened->manifest.FindArtifact(k.artifact)->sha256);
  // Warm the cache (and the page cache) once.
  if (TimeChild({self, "--child-cubist", "--manifest", g_manifest}) < 0) {
    std::fprintf(stderr, "cubist child failed\n");
    return 1;
  }
  std::vector<double> cub, raw;
  for (int i = 0; i < runs; ++i) {
    cub.push_back(TimeChild({self, "--child-cubist", "--manifest", g_manifest}));
    raw.push_back(TimeChild({self, "--child-raw", cubin, k.function,
                             std::to_string(k.shared_mem_bytes), std::to_string(k.threads),
                             std::to_string(k.tile_m), std::to_string(k.tile_n),
                             std::to_string(k.abi),
                             k.extras.count("ctas_per_sm") ? k.extras.at("ctas_per_sm") : "1"}));
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("startup to first finished kernel (%d runs each, %zu kernels in the manifest, "
              "kernel %s):\n  cubist  median %.1f ms (min %.1f, max %.1f)\n  raw     "
              "median %.1f ms (min %.1f, max %.1f)\n  ratio   %.3f\n",
              runs, reg->size(), k.name.c_str(), median(cub),
              *std::min_element(cub.begin(), cub.end()), *std::max_element(cub.begin(), cub.end()),
              median(raw), *std::min_element(raw.begin(), raw.end()),
              *std::max_element(raw.begin(), raw.end()), median(cub) / median(raw));
  std::printf("phases of one cubist start:\n");
  std::fflush(stdout);
  TimeChild({self, "--child-phases", "--manifest", g_manifest});
  return 0;
}

}  // namespace
}  // namespace cubist

int main(int argc, char** argv) {
  using namespace cubist;
  std::vector<char*> rest = {argv[0]};
  std::string mode;
  int runs = 10;
  std::vector<std::string> child_args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--manifest" && i + 1 < argc) {
      g_manifest = argv[++i];
    } else if (a == "--startup" && i + 1 < argc) {
      mode = "startup";
      g_manifest = argv[++i];
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (a == "--child-cubist") {
      mode = "child-cubist";
    } else if (a == "--child-phases") {
      mode = "child-phases";
    } else if (a == "--child-raw") {
      mode = "child-raw";
      for (++i; i < argc; ++i) child_args.push_back(argv[i]);
    } else {
      rest.push_back(argv[i]);
    }
  }
  if (mode == "child-cubist") return ChildCubist();
  if (mode == "child-phases") return ChildPhases();
  if (mode == "child-raw") {
    if (child_args.size() != 8) return 2;
    return ChildRaw(child_args[0], child_args[1], std::stoi(child_args[2]),
                    std::stoi(child_args[3]), std::stoi(child_args[4]), std::stoi(child_args[5]),
                    std::stoi(child_args[6]), std::stoi(child_args[7]));
  }
  if (mode == "startup") return Startup("/proc/self/exe", runs);

  std::unique_ptr<Gpu> gpu;
  if (!g_manifest.empty()) {
    auto g = OpenGpu();
    if (g.ok()) {
      gpu = std::move(*g);
      g_gpu = gpu.get();
      std::printf("GPU: %s, kernel %s\n", gpu->rt->device_name().c_str(),
                  gpu->decision->kernel->name().c_str());
      benchmark::RegisterBenchmark("BM_MoeGemmKernelForWarm", BM_MoeGemmKernelForWarm);
      benchmark::RegisterBenchmark("BM_MoeGemmRunHost", BM_MoeGemmRunHost);
      benchmark::RegisterBenchmark("BM_RawLaunchKernelExHost", BM_RawLaunchKernelExHost);
      benchmark::RegisterBenchmark("BM_MoeGemmRunHost/again", BM_MoeGemmRunHost);
      benchmark::RegisterBenchmark("BM_RawLaunchKernelExHost/again", BM_RawLaunchKernelExHost);
    } else {
      std::printf("GPU benchmarks skipped: %s\n", std::string(g.status().message()).c_str());
    }
  }
  int bargc = static_cast<int>(rest.size());
  benchmark::Initialize(&bargc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  g_gpu = nullptr;
  return 0;
}
