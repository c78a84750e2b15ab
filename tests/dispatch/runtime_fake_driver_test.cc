// Runtime and MoeGemm (dispatch/runtime.h, dispatch/moe_gemm.h) without a GPU: a real
// manifest and cubin (the stub kernels of tests/fixtures/dispatch/moe_stub.cu), the real
// store and fetcher (file:// source), the real module cache, and the loader's fake
// driver extended to record what cuLaunchKernelEx would have launched.
#include <fcntl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "artifacts/gc.h"
#include "base/sha256.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/dispatch_manifests.h"
#include "tests/testlib/fake_driver.h"
#include "tests/testlib/launch_recording_driver.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::FakeDriver;
using ::cubist::testing::LaunchRecordingDriver;
using ::cubist::testing::FileExists;
using ::cubist::testing::KernelJson;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::StatusIs;
using ::cubist::testing::TempDir;
using ::cubist::testing::TestKernel;
using ::cubist::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kStubPath[] = "cubins/sm_90a/moe_stub.cubin";

std::vector<TestKernel> StubKernels() {
  std::vector<TestKernel> v;
  auto add = [&](std::string name, std::string fn, int tm, int tn) -> TestKernel& {
    TestKernel k;
    k.name = std::move(name);
    k.function = std::move(fn);
    k.artifact = kStubPath;
    k.tile_m = tm;
    k.tile_n = tn;
    k.threads = 128;
    k.shared_mem_bytes = 100000;
    v.push_back(k);
    return v.back();
  };
  add("bf16_swiglu_m64n64", "moe_stub_m64n64", 64, 64);
  // It waits for the previous grid (a real kernel's griddepcontrol.wait); the others,
  // like kernels built before they waited, say nothing and are launched in stream order.
  add("bf16_swiglu_m64n128", "moe_stub_m64n128", 64, 128).extras = "\"pdl\": true";
  {
    TestKernel& k = add("bf16_swiglu_m128n128", "moe_stub_m128n128", 128, 128);
    k.threads = 256;
    k.cluster = {2, 1, 1};
  }
  {
    TestKernel& k = add("mxfp4_bf16_swiglu", "moe_stub_mxfp4", 64, 128);
    k.weight_format = "mxfp4";
    k.tile_k = 128;
    k.extras = "\"k_align\": 128";
  }
  {
    TestKernel& k = add("bf16_swiglu_sm100a", "moe_stub_m64n64", 128, 256);
    k.arch = "sm_100a";
    k.artifact = "cubins/sm_100a/elsewhere.cubin";
  }
  return v;
}

class RuntimeFakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef CUBIST_DISPATCH_STUB_CUBIN
    GTEST_SKIP() << "no nvcc at build time: the stub cubin was not built";
#else
    WriteFileOrDie(dir_.Join(std::string("repo/") + kStubPath),
                   ReadFileOrDie(CUBIST_DISPATCH_STUB_CUBIN));
    manifest_ = dir_.Join("repo/manifest.json");
    WriteManifest(StubKernels());
    options_.manifest = manifest_;
    options_.cache_dir = dir_.Join("cache");
    options_.tuning_file = dir_.Join("tuning.json");
    options_.driver = &driver_;
#endif
  }

  // The manifest of `kernels`, all in the stub cubin (or the sm_100a stand-in).
  void WriteManifest(const std::vector<TestKernel>& kernels) {
    const std::string cubin = ReadFileOrDie(dir_.Join(std::string("repo/") + kStubPath));
    std::vector<std::string> ks;
    for (const TestKernel& k : kernels) ks.push_back(KernelJson(k));
    WriteFileOrDie(
        manifest_,
        absl::StrCat(R"({"schema": "cubist.manifest/1", "name": "stub", "version": 1,
  "artifacts": [{"path": ")", kStubPath, R"(", "sha256": ")", Sha256Hex(cubin),
                     R"(", "size": )", cubin.size(), R"(},
                {"path": "cubins/sm_100a/elsewhere.cubin", "sha256": ")",
                     std::string(64, 'e'), R"(", "size": 10}],
  "kernels": [)", absl::StrJoin(ks, ",\n"), "]}\n"));
  }

  std::unique_ptr<Runtime> Open() {
    auto rt = Runtime::Open(options_);
    EXPECT_TRUE(rt.ok()) << rt.status();
    return rt.ok() ? std::move(*rt) : nullptr;
  }

  static MoeGemmArgs Args(int64_t experts, int64_t tokens, int64_t n, int64_t k) {
    MoeGemmArgs a;
    a.activation = Activation::kSwiglu;
    a.experts = experts;
    a.tokens = tokens;
    a.n = n;
    a.k = k;
    a.a = 0x100000;
    a.b = 0x200000;
    a.offsets = 0x300000;
    a.out = 0x400000;
    return a;
  }

  TempDir dir_;
  std::string manifest_;
  RuntimeOptions options_;
  LaunchRecordingDriver driver_;
};

TEST_F(RuntimeFakeDriverTest, OpenFetchesOnlyThisDevicesArtifactsAndLoadsNothing) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(rt->registry().size(), 5u);
  EXPECT_EQ(rt->sm().number(), 90);
  EXPECT_EQ(rt->device_info().sm_count, 132);
  EXPECT_EQ(rt->device_name(), "Fake H200");
  EXPECT_EQ(rt->driver_version(), 13000);
  EXPECT_EQ(rt->store().Probe(rt->manifest().artifacts[0].sha256, std::nullopt),
            ObjectState::kPresent);
  // The sm_100a artifact (whose made-up hash no source could satisfy) was not asked for.
  EXPECT_EQ(rt->store().Probe(std::string(64, 'e'), std::nullopt), ObjectState::kMissing);
  EXPECT_EQ(driver_.loads(), 0);
  EXPECT_THAT(rt->Function(*rt->registry().Find("bf16_swiglu_sm100a")),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("kernel bf16_swiglu_sm100a (sm_100a) does not run on this "
                                 "SM 90 device (Fake H200)")));
}

TEST_F(RuntimeFakeDriverTest, PreloadLoadsTheImageOnceAndEveryFunction) {
  options_.preload = true;
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  EXPECT_EQ(driver_.loads(), 1);
  EXPECT_EQ(driver_.lookups(), 4);
  auto f = rt->Function(*rt->registry().Find("bf16_swiglu_m64n64"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(driver_.dynamic_shared_limit(*f), 100000);
  EXPECT_EQ(driver_.lookups(), 4);
}

TEST_F(RuntimeFakeDriverTest, RunLaunchesTheSelectedKernelWithItsGeometry) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  // Prefill: the 128x128 tile wins (select_kernel_test has the arithmetic).
  MoeGemmArgs args = Args(8, 8 * 2048, 28672, 4096);
  CUBIST_ASSERT_OK((*gemm)->CanImplement(args));
  auto d = (*gemm)->KernelFor(args);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->kernel->name(), "bf16_swiglu_m128n128");
  EXPECT_FALSE((*d)->from_tuning);
  const int loads = driver_.loads();
  const int lookups = driver_.lookups();

  CUstream stream = reinterpret_cast<CUstream>(0x5157);
  CUBIST_ASSERT_OK((*gemm)->Run(args, stream));
  CUBIST_ASSERT_OK((*gemm)->Run(args, stream));
  auto launches = driver_.launches();
  ASSERT_EQ(launches.size(), 2u);
  const auto& l = launches[0];
  EXPECT_EQ(l.function, (*d)->function);
  // Grid: persistent, min(tiles, SMs x ctas_per_sm). Tiles: the ABI's bound on M tiles,
  // (T + E*(tm-1)) / tm = (16384 + 8*127) / 128 = 135, times N tiles of the output half,
  // (28672/2) / (128/2) = 224: far more than the fake H200's 132 SMs x 1 (the entry names
  // no ctas_per_sm), a whole number of clusters of 2.
  EXPECT_EQ(l.config.gridDimX, 132u);
  EXPECT_EQ(l.config.gridDimY, 1u);
  EXPECT_EQ(l.config.blockDimX, 256u);
  EXPECT_EQ(l.config.blockDimY, 1u);
  EXPECT_EQ(l.config.sharedMemBytes, 100000u);
  EXPECT_EQ(l.config.hStream, stream);
  ASSERT_EQ(l.attrs.size(), 1u);
  EXPECT_EQ(l.attrs[0].id, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
  EXPECT_EQ(l.attrs[0].value.clusterDim.x, 2u);
  EXPECT_EQ(l.attrs[0].value.clusterDim.y, 1u);
  EXPECT_EQ(l.gemm().abi, moe::kMoeGemmAbi);
  EXPECT_EQ(l.gemm().num_experts, 8);
  EXPECT_EQ(l.gemm().num_tokens, 16384);
  EXPECT_EQ(l.gemm().n, 28672);
  EXPECT_EQ(l.gemm().k, 4096);
  EXPECT_EQ(l.gemm().a, reinterpret_cast<const void*>(0x100000));
  EXPECT_EQ(l.gemm().offsets, reinterpret_cast<const int32_t*>(0x300000));
  EXPECT_EQ(l.gemm().out, reinterpret_cast<void*>(0x400000));
  EXPECT_EQ(l.gemm().b_scale, nullptr);
  // The repeated problem was served from the decision cache: no new driver work.
  EXPECT_EQ(driver_.loads(), loads);
  EXPECT_EQ(driver_.lookups(), lookups);
}

TEST_F(RuntimeFakeDriverTest, DecodeProblemGetsTheDecodeTileAndNoClusterAttribute) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  MoeGemmOptions o;
  o.programmatic_dependent_launch = true;
  auto gemm = MoeGemm::Create(*rt, o);
  ASSERT_TRUE(gemm.ok());
  MoeGemmArgs args = Args(128, 128 * 8, 5760, 2880);
  CUBIST_ASSERT_OK((*gemm)->Run(args, nullptr));
  auto launches = driver_.launches();
  ASSERT_EQ(launches.size(), 1u);
  EXPECT_EQ(launches[0].config.blockDimX, 128u);
  // m64n128: (1024 + 128*63) / 64 = 142 M tiles x 2880 / 64 = 45 N tiles, more than
  // 132 SMs x 1: the persistent grid is one CTA per SM.
  EXPECT_EQ(launches[0].config.gridDimX, 132u);
  ASSERT_EQ(launches[0].attrs.size(), 1u);
  EXPECT_EQ(launches[0].attrs[0].id, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  EXPECT_EQ(launches[0].attrs[0].value.programmaticStreamSerializationAllowed, 1);
}

// A kernel that fits two CTAs per SM: a grid of no more CTAs than SMs asks for more than
// half an SM's shared memory, so that no two of its CTAs share an SM (the hardware pairs
// a small grid's CTAs, and under programmatic launch fills each SM the previous grid
// frees with two); a larger grid keeps the kernel's own request and two per SM.
TEST_F(RuntimeFakeDriverTest, SmallGridsOfTwoPerSmKernelsGetAnSmPerCta) {
  TestKernel k;
  k.name = "bf16_swiglu_m64n128_x2";
  k.function = "moe_stub_m64n128";
  k.artifact = kStubPath;
  k.tile_m = 64;
  k.tile_n = 128;
  k.threads = 128;
  k.shared_mem_bytes = 100000;
  k.extras = "\"ctas_per_sm\": 2, \"pdl\": true";
  WriteManifest({k});
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  MoeGemmOptions o;
  o.programmatic_dependent_launch = true;
  auto gemm = MoeGemm::Create(*rt, o);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  // One token's two rows among 8 experts: at most 2 M tiles x 1024/64 = 16 N tiles.
  CUBIST_ASSERT_OK((*gemm)->Run(Args(8, 2, 2048, 512), nullptr));
  // 1,024 rows: (1024 + 8*63) / 64 = 23 M tiles x 16: past 132 x 2, the grid is 264.
  CUBIST_ASSERT_OK((*gemm)->Run(Args(8, 1024, 2048, 512), nullptr));
  const auto launches = driver_.launches();
  ASSERT_EQ(launches.size(), 2u);
  constexpr unsigned kSpread = 228 * 1024 / 2 + 1;  // the fake H200's 228 KiB per SM
  EXPECT_EQ(launches[0].config.gridDimX, 32u);
  EXPECT_EQ(launches[0].config.sharedMemBytes, kSpread);
  EXPECT_EQ(launches[1].config.gridDimX, 264u);
  EXPECT_EQ(launches[1].config.sharedMemBytes, 100000u);
  // The function may take the larger request, raised once when the kernel was decided.
  EXPECT_EQ(driver_.dynamic_shared_limit(launches[0].function), static_cast<int>(kSpread));
  // A device that refuses the raise launches small grids as before.
  driver_.FailSetAttribute(CUDA_ERROR_INVALID_VALUE);
  auto plain = MoeGemm::Create(*rt, o);
  ASSERT_TRUE(plain.ok());
  CUBIST_ASSERT_OK((*plain)->Run(Args(8, 2, 2048, 512), nullptr));
  EXPECT_EQ(driver_.launches().back().config.sharedMemBytes, 100000u);
}

// Programmatic serialization only for a kernel whose entry says it waits ("pdl"): one that
// does not could read its inputs before the previous kernel (which may let it launch
// early) has written them. Without the option, no kernel gets it.
TEST_F(RuntimeFakeDriverTest, ProgrammaticLaunchOnlyForKernelsThatWait) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  const MoeGemmArgs args = Args(128, 128 * 8, 5760, 2880);
  auto attrs_of = [&](const std::string& pinned, bool pdl) {
    MoeGemmOptions o;
    o.pinned_kernel = pinned;
    o.programmatic_dependent_launch = pdl;
    auto gemm = MoeGemm::Create(*rt, o);
    EXPECT_TRUE(gemm.ok()) << gemm.status();
    const size_t before = driver_.launches().size();
    EXPECT_TRUE((*gemm)->Run(args, nullptr).ok());
    const auto launches = driver_.launches();
    EXPECT_EQ(launches.size(), before + 1);
    return launches.back().attrs.size();
  };
  EXPECT_EQ(attrs_of("bf16_swiglu_m64n128", true), 1u);
  EXPECT_EQ(attrs_of("bf16_swiglu_m64n128", false), 0u);
  EXPECT_EQ(attrs_of("bf16_swiglu_m64n64", true), 0u);
}

// MoeGemmArgs::settled_inputs is the kernel's kMoeGemmFlagSettledInputs bit; a plain call
// leaves the flags 0, so that no kernel reads its offsets or weights before its wait.
TEST_F(RuntimeFakeDriverTest, SettledInputsReachTheKernelOnlyWhenSaid) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt, MoeGemmOptions{});
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  MoeGemmArgs args = Args(128, 128 * 8, 5760, 2880);
  ASSERT_TRUE((*gemm)->Run(args, nullptr).ok());
  EXPECT_EQ(driver_.launches().back().gemm().flags, 0);
  args.settled_inputs = true;
  ASSERT_TRUE((*gemm)->Run(args, nullptr).ok());
  EXPECT_EQ(driver_.launches().back().gemm().flags, moe::kMoeGemmFlagSettledInputs);
}

// The expert counts generation 1 alone served before generation 2 ran groups of experts:
// a multiple of 1,024 runs as that many full groups, and 1,024 as one launch.
TEST_F(RuntimeFakeDriverTest, ExpertCountsThatAreMultiplesOfAGroupRunFullGroups) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  size_t seen = 0;
  for (const int64_t experts : {1024, 2048, 4096}) {
    SCOPED_TRACE(experts);
    const MoeGemmArgs args = Args(experts, experts, 256, 512);
    CUBIST_ASSERT_OK((*gemm)->CanImplement(args));
    CUBIST_ASSERT_OK((*gemm)->Run(args, nullptr));
    const auto launches = driver_.launches();
    ASSERT_EQ(launches.size() - seen, static_cast<size_t>(experts / 1024));
    for (size_t i = seen; i < launches.size(); ++i) {
      const moe::MoeGemmParams p = launches[i].gemm();
      const uintptr_t group = i - seen;  // experts 1024 * group onwards
      EXPECT_EQ(p.num_experts, 1024);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p.offsets), 0x300000 + 4 * 1024 * group);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p.b), 0x200000 + 2 * 256 * 512 * 1024 * group);
    }
    seen = launches.size();
  }
}

TEST_F(RuntimeFakeDriverTest, MoreExpertsThanOneLaunchSchedulesRunAsGroupsOfExperts) {
  // A kernel schedules at most 1024 experts per launch; 2500 run as three
  // launches over experts 0..1023, 1024..2047 and 2048..2499.
  std::vector<TestKernel> kernels = StubKernels();
  TestKernel tma;
  tma.name = "nvfp4_swiglu_tma";
  tma.function = "moe_stub_tma";
  tma.artifact = kStubPath;
  tma.weight_format = tma.activation_format = "nvfp4";
  tma.abi = moe::kMoeGemmAbi;
  tma.tile_m = 64;
  tma.tile_n = 128;
  tma.tile_k = 256;
  tma.threads = 384;
  tma.shared_mem_bytes = 100000;
  tma.extras = "\"ctas_per_sm\": 1, \"max_experts\": 1024";
  kernels.push_back(tma);
  WriteManifest(kernels);
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  constexpr int64_t kE = 2500, kN = 256, kK = 512;
  MoeGemmArgs args = Args(kE, 4096, kN, kK);
  args.weight_format = args.activation_format = DataFormat::kNvfp4;
  args.a_scale = 0x500000;
  args.a_global_scale = 0x510000;
  args.b_scale = 0x600000;
  args.b_global_scale = 0x700000;
  args.alpha = 0x710000;
  args.beta = 0x720000;
  args.limit = 0x730000;
  args.bias = 0x800000;
  CUBIST_ASSERT_OK((*gemm)->CanImplement(args));
  auto d = (*gemm)->KernelFor(args);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->kernel->name(), "nvfp4_swiglu_tma");
  CUBIST_ASSERT_OK((*gemm)->Run(args, nullptr));

  const auto launches = driver_.launches();
  ASSERT_EQ(launches.size(), 3u);
  const int64_t b_bytes = kN * kK / 2, scale_bytes = kN * kK / 16;  // per expert
  const int64_t firsts[] = {0, 1024, 2048};
  const int32_t counts[] = {1024, 1024, 452};
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    const moe::MoeGemmParams p = launches[i].gemm();
    const int64_t f = firsts[i];
    auto at = [](int64_t base, int64_t offset) {
      return reinterpret_cast<const void*>(base + offset);
    };
    EXPECT_EQ(p.abi, moe::kMoeGemmAbi);
    EXPECT_EQ(p.num_experts, counts[i]);
    EXPECT_EQ(p.num_tokens, 4096) << "offsets stay absolute rows of A and out";
    EXPECT_EQ(p.a, at(0x100000, 0));
    EXPECT_EQ(p.a_scale, at(0x500000, 0));
    EXPECT_EQ(p.a_global_scale, at(0x510000, 0));
    EXPECT_EQ(p.out, at(0x400000, 0));
    EXPECT_EQ(p.offsets, at(0x300000, 4 * f));
    EXPECT_EQ(p.b, at(0x200000, b_bytes * f));
    EXPECT_EQ(p.b_scale, at(0x600000, scale_bytes * f));
    EXPECT_EQ(p.b_global_scale, at(0x700000, 4 * f));
    EXPECT_EQ(p.alpha, at(0x710000, 4 * f));
    EXPECT_EQ(p.beta, at(0x720000, 4 * f));
    EXPECT_EQ(p.limit, at(0x730000, 4 * f));
    EXPECT_EQ(p.bias, at(0x800000, 4 * kN * f));
  }
  // B's tensor map of each launch covers that group's experts only; A's is shared.
  std::vector<FakeDriver::TensorMap> b_maps;
  for (const FakeDriver::TensorMap& m : driver_.tensor_maps()) {
    if (m.address != 0x100000) b_maps.push_back(m);
  }
  ASSERT_EQ(b_maps.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b_maps[i], (FakeDriver::TensorMap{static_cast<uintptr_t>(0x200000 + b_bytes * firsts[i]),
                                                static_cast<uint64_t>(counts[i] * kN),
                                                static_cast<uint64_t>(kK / 2)}));
  }
}

TEST_F(RuntimeFakeDriverTest, BadArgumentsAreRefusedWithoutLaunching) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok());
  MoeGemmArgs args = Args(8, 512, 1024, 512);
  args.a = 0x100008;
  EXPECT_THAT((*gemm)->CanImplement(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("moe_gemm arguments: a = 0x100008 is not 16-byte aligned")));
  EXPECT_THAT((*gemm)->Run(args, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("16-byte aligned")));
  args = Args(8, 512, 1024, 512);
  args.weight_format = DataFormat::kMxfp4;
  EXPECT_THAT((*gemm)->Run(args, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b_scale is null but required for mxfp4 x bf16")));
  args.b_scale = 0x500000;
  CUBIST_EXPECT_OK((*gemm)->CanImplement(args));
  args.k = 2880;  // not a multiple of the kernel's k_align 128
  EXPECT_THAT((*gemm)->CanImplement(args),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("nearest: mxfp4_bf16_swiglu (shape: K=2880 is not a "
                                 "multiple of 128 (the kernel's k_align))")));
  args = Args(8, 512, 1024, 512);
  args.activation = Activation::kGeglu;
  EXPECT_THAT((*gemm)->Run(args, nullptr),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no kernel for moe_gemm{weights=bf16 activations=bf16 "
                                 "activation=geglu experts=8 tokens=512 (64/expert) n=1024 "
                                 "k=512 sm=90 sms=132}")));
  args = Args(8, 512, 1024, 512);
  args.alpha = 0x600004;  // fp32 arrays need 4-byte alignment only
  CUBIST_EXPECT_OK((*gemm)->CanImplement(args));
  args.alpha = 0x600002;
  EXPECT_THAT((*gemm)->Run(args, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("alpha = 0x600002 is not 4-byte aligned")));
  // The stub manifest states no N alignment; the kernel family's own check still
  // refuses an output width that is not a multiple of 8.
  args = Args(8, 512, 1000, 512);
  EXPECT_THAT((*gemm)->CanImplement(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("moe_gemm: output width 500 (N/2) is not a multiple of 8; "
                                 "pad N (each half, when gated) to a multiple of 8 (kernel ")));
  args = Args(8, int64_t{1} << 32, 1024, 512);
  EXPECT_THAT((*gemm)->CanImplement(args),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens=4294967296")));
  EXPECT_TRUE(driver_.launches().empty());
}

TEST_F(RuntimeFakeDriverTest, EmptyBatchLaunchesNothing) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok());
  MoeGemmArgs args = Args(8, 0, 1024, 512);
  args.a = 0;
  args.out = 0;
  CUBIST_ASSERT_OK((*gemm)->Run(args, nullptr));
  EXPECT_TRUE(driver_.launches().empty());
}

// Global scales go with fp8 and nvfp4 weights, whose kernels read them (nvfp4 x bf16:
// A's too, the layer's decoded nvfp4 inputs); any other kernel would ignore them, so a
// call passing one is refused before any launch, whether through Run or CanImplement.
TEST_F(RuntimeFakeDriverTest, GlobalScalesOnlyWhereTheKernelsReadThem) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok());
  MoeGemmArgs args = Args(8, 64, 1024, 512);  // bf16 x bf16
  args.a_global_scale = 0x600000;
  EXPECT_THAT(ValidateMoeGemmArgs(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a_global_scale is set, but bf16 x bf16 kernels read global "
                                 "scales only with fp8 or nvfp4 weights and would ignore it; "
                                 "leave it 0")));
  EXPECT_THAT((*gemm)->Run(args, nullptr), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("a_global_scale is set")));
  EXPECT_THAT((*gemm)->CanImplement(args), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("a_global_scale is set")));
  args.a_global_scale = 0;
  args.weight_format = DataFormat::kMxfp4;
  args.b_scale = 0x700000;
  args.b_global_scale = 0x600000;
  EXPECT_THAT(ValidateMoeGemmArgs(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b_global_scale is set, but mxfp4 x bf16 kernels")));
  args.weight_format = DataFormat::kNvfp4;
  args.a_global_scale = 0x600010;
  CUBIST_EXPECT_OK(ValidateMoeGemmArgs(args));
  EXPECT_TRUE(driver_.launches().empty());
}

// The output format of a call: out_scale exactly with fp8 output, fp8 only from kernels
// that write it (this manifest has none), and no other format; refused before any launch.
TEST_F(RuntimeFakeDriverTest, OutScaleGoesWithFp8OutputInTheArguments) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok());
  MoeGemmArgs args = Args(8, 64, 1024, 512);
  args.out_scale = 0x600000;
  EXPECT_THAT(ValidateMoeGemmArgs(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("out_scale is set but output_format is bf16 (bf16 output has "
                                 "no scale); leave out_scale 0, or ask for output_format fp8")));
  EXPECT_THAT((*gemm)->Run(args, nullptr), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("out_scale is set")));
  args.output_format = DataFormat::kFp8;
  args.out_scale = 0;
  EXPECT_THAT(ValidateMoeGemmArgs(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("out_scale is null but output_format is fp8")));
  EXPECT_THAT((*gemm)->Run(args, nullptr), StatusIs(absl::StatusCode::kInvalidArgument,
                                                    HasSubstr("out_scale is null")));
  args.out_scale = 0x600002;
  EXPECT_THAT(ValidateMoeGemmArgs(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("out_scale = 0x600002 is not 4-byte aligned")));
  args.out_scale = 0x600000;
  CUBIST_EXPECT_OK(ValidateMoeGemmArgs(args));
  EXPECT_THAT((*gemm)->CanImplement(args),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("output format: kernel writes bf16, problem wants fp8")));
  args.output_format = DataFormat::kNvfp4;
  EXPECT_THAT(ValidateMoeGemmArgs(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("output_format nvfp4 is not one the moe_gemm kernels write; "
                                 "use bf16 or fp8")));
  EXPECT_TRUE(driver_.launches().empty());
}

TEST_F(RuntimeFakeDriverTest, EmptyBatchNeedsNoActivationPointers) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok());
  MoeGemmArgs args = Args(8, 0, 1024, 512);
  args.weight_format = DataFormat::kMxfp4;
  args.b_scale = 0x500000;
  args.a = 0;
  args.out = 0;
  CUBIST_EXPECT_OK((*gemm)->CanImplement(args));
  CUBIST_EXPECT_OK((*gemm)->Run(args, nullptr));
  // Shape checks still apply to an empty batch; the weights must still be there.
  args.n = 1000;
  EXPECT_THAT((*gemm)->CanImplement(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("moe_gemm: output width 500 (N/2) is not a multiple of 8")));
  args.n = 1024;
  args.b_scale = 0;
  EXPECT_THAT((*gemm)->Run(args, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("b_scale is null but required for mxfp4 x bf16")));
  // Block-scaled activations: no a_scale needed without tokens, required with them.
  args = Args(8, 0, 1024, 512);
  args.weight_format = DataFormat::kFp8Block;
  args.activation_format = DataFormat::kFp8Block;
  args.b_scale = 0x500000;
  args.a = 0;
  args.out = 0;
  CUBIST_EXPECT_OK(ValidateMoeGemmArgs(args));
  CUBIST_EXPECT_OK((*gemm)->Run(args, nullptr));  // no kernel needed for nothing to do
  args.tokens = 64;
  args.a = 0x100000;
  args.out = 0x400000;
  EXPECT_THAT(ValidateMoeGemmArgs(args),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a_scale is null but required for fp8-block x fp8-block")));
  EXPECT_TRUE(driver_.launches().empty());
}

TEST_F(RuntimeFakeDriverTest, TunedWinnerIsUsedAndForeignTuningIgnored) {
  MoeGemmArgs args = Args(8, 8 * 2048, 28672, 4096);
  MoeProblem p;
  p.activation = Activation::kSwiglu;
  p.experts = 8;
  p.tokens = 8 * 2048;
  p.n = 28672;
  p.k = 4096;
  TuningRecord foreign{{"Fake H200", 12000, ""}, "moe_gemm", BucketOf(p).ToString(),
                       "bf16_swiglu_m64n128", 1.0, 3};
  {
    auto rt = Open();
    ASSERT_NE(rt, nullptr);
    foreign.context.manifest = rt->manifest().digest;
    CUBIST_ASSERT_OK(RecordTuning(options_.tuning_file, foreign));  // another driver
  }
  {
    auto rt = Open();
    ASSERT_NE(rt, nullptr);
    auto gemm = MoeGemm::Create(*rt);
    ASSERT_TRUE(gemm.ok());
    auto d = (*gemm)->KernelFor(args);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ((*d)->kernel->name(), "bf16_swiglu_m128n128");  // the cost model's choice
    TuningRecord mine = foreign;
    mine.context = rt->tuning_context();
    mine.kernel = "bf16_swiglu_m64n64";
    CUBIST_ASSERT_OK(RecordTuning(options_.tuning_file, mine));
  }
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok());
  auto d = (*gemm)->KernelFor(args);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->kernel->name(), "bf16_swiglu_m64n64");
  EXPECT_TRUE((*d)->from_tuning);
  // Same bucket (tokens per expert 1025..2048 round to 2048): same tuned kernel.
  args.tokens = 8 * 1500;
  d = (*gemm)->KernelFor(args);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->kernel->name(), "bf16_swiglu_m64n64");
}

TEST_F(RuntimeFakeDriverTest, PinnedKernel) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  MoeGemmOptions o;
  o.pinned_kernel = "bf16_swiglu_m64n64";
  auto gemm = MoeGemm::Create(*rt, o);
  ASSERT_TRUE(gemm.ok());
  auto d = (*gemm)->KernelFor(Args(8, 8 * 2048, 28672, 4096));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->kernel->name(), "bf16_swiglu_m64n64");
  o.pinned_kernel = "nope";
  EXPECT_THAT(MoeGemm::Create(*rt, o),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("pinned kernel 'nope'")));
}

TEST_F(RuntimeFakeDriverTest, ManyThreadsShareDecisions) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  auto gemm = MoeGemm::Create(*rt);
  ASSERT_TRUE(gemm.ok());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        MoeGemmArgs args = Args(8, 64 * (1 + (i + t) % 4), 1024, 512);
        if (!(*gemm)->Run(args, nullptr).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(driver_.launches().size(), 400u);
  EXPECT_EQ(driver_.loads(), 1);
}

// Issue 28, item 13: the bytes handed to the driver are the bytes the manifest names.
// An object changed in place with its publish stamp put back (a disk fault, or a writer
// that restores mtime) passes every stat; the hash at load refuses it before the driver
// sees it, removes it, and the next call fetches and loads the right bytes.
TEST_F(RuntimeFakeDriverTest, AChangedCubinNeverReachesTheDriver) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  const Artifact& a = rt->manifest().artifacts[0];
  const std::string object = rt->store().ObjectPath(a.sha256);
  struct stat st;
  ASSERT_EQ(::stat(object.c_str(), &st), 0);
  ASSERT_EQ(::chmod(object.c_str(), 0644), 0);
  std::string bytes = ReadFileOrDie(object);
  bytes[bytes.size() / 2] ^= 0x40;
  WriteFileOrDie(object, bytes);
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(::utimensat(AT_FDCWD, object.c_str(), times, 0), 0);
  ASSERT_EQ(rt->store().Probe(a.sha256, a.size), ObjectState::kPresent) << "stats cannot tell";

  const KernelEntry& k = *rt->registry().Find("bf16_swiglu_m64n64");
  EXPECT_THAT(rt->Function(k),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr(absl::StrCat("kernel artifact ", kStubPath, " of ")),
                             HasSubstr(absl::StrCat("sha256 mismatch: expected ", a.sha256,
                                                    ", got ", Sha256Hex(bytes))),
                             HasSubstr("removed from the cache"))));
  EXPECT_EQ(driver_.loads(), 0);
  EXPECT_EQ(rt->store().Probe(a.sha256, a.size), ObjectState::kMissing);
  auto f = rt->Function(k);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(driver_.loads(), 1);
  EXPECT_EQ(rt->modules().stats().bytes_hashed, 2 * *a.size);
}

TEST_F(RuntimeFakeDriverTest, TheLoadHashCanBeTurnedOffExplicitly) {
  options_.skip_load_hash = true;
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  ASSERT_TRUE(rt->Function(*rt->registry().Find("bf16_swiglu_m64n64")).ok());
  EXPECT_EQ(driver_.loads(), 1);
  EXPECT_EQ(rt->modules().stats().bytes_hashed, 0u);
}

// The lease of a lazily loading engine: while the Runtime lives, gc keeps its
// manifest's objects, kept manifest or not; once it is gone they are garbage again.
TEST_F(RuntimeFakeDriverTest, GcNeverTakesTheKernelsOfALiveRuntime) {
  auto rt = Open();
  ASSERT_NE(rt, nullptr);
  const std::string sha = rt->manifest().artifacts[0].sha256;
  auto gc = CollectGarbage(rt->store(), GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->roots_in_use, 1);
  EXPECT_EQ(gc->objects_removed, 0);
  EXPECT_EQ(rt->store().Probe(sha, std::nullopt), ObjectState::kPresent);
  ASSERT_TRUE(rt->Function(*rt->registry().Find("bf16_swiglu_m64n64")).ok());

  const Store store = rt->store();
  rt.reset();
  gc = CollectGarbage(store, GcOptions{});
  ASSERT_TRUE(gc.ok()) << gc.status();
  EXPECT_EQ(gc->roots_in_use, 0);
  EXPECT_EQ(gc->objects_removed, 1);
}

TEST(RuntimeOpenTest, MissingManifestIsNotFound) {
  TempDir dir;
  LaunchRecordingDriver driver;
  RuntimeOptions o;
  o.manifest = dir.Join("nope/manifest.json");
  o.cache_dir = dir.Join("cache");
  o.driver = &driver;
  EXPECT_THAT(Runtime::Open(o), StatusIs(absl::StatusCode::kNotFound, HasSubstr("nope")));
}

}  // namespace
}  // namespace cubist
