// GPU tests of the published moe_gemm family: every kernel of a built artifact directory
// is loaded THROUGH THE LOADER (ModuleCache over the dlopen'ed driver table, hash-checked
// against the manifest), run on fresh random inputs in its formats with the output
// poisoned first (and a poisoned guard after it), and compared with the CPU reference
// (dispatch/reference.h) within the tolerance stated for its format pair.
//
// The artifact directory is $CUBIST_MOE_ARTIFACTS, else <build>/moe-artifacts; build it
// with scripts/build-artifacts DIR (the whole family) or --small. Without a GPU, a driver
// or the directory the GPU tests skip, saying why. $CUBIST_MOE_RESULTS, when set, names a
// file that receives one line per kernel and problem (docs/gpu-results.md).
//
// The host-side shape checks (kernels/moe_gemm_check.h) are tested here too; they need
// no GPU.
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/status_macros.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/moe_gemm_launch.h"
#include "dispatch/moe_quantize_reference.h"
#include "dispatch/registry.h"
#include "dispatch/moe_types.h"
#include "dispatch/reference.h"
#include "dispatch/runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_check.h"
#include "loader/context.h"
#include "loader/device_memory.h"
#include "loader/driver_api.h"
#include "loader/module_cache.h"
#include "manifest/manifest_parser.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/random_problem.h"
#include "tests/testlib/temp_files.h"

namespace cubist::testing {
namespace {

using ::testing::HasSubstr;
using namespace cubist::moe;
using namespace cubist::reference;

std::optional<MoeFormat> ParseFormat(const std::string& s) {
  auto f = ::cubist::ParseDataFormat(s);
  if (!f.ok() || !MoeGemmEncodes(*f)) return std::nullopt;
  return *f;
}
std::optional<MoeActivation> ParseAct(const std::string& s) {
  auto a = ::cubist::ParseActivation(s);
  if (!a.ok() || !MoeGemmEncodes(*a)) return std::nullopt;
  return *a;
}

std::string ArtifactDir() {
  const char* env = std::getenv("CUBIST_MOE_ARTIFACTS");
  return env && *env ? std::string(env) : BinaryDir() + "/moe-artifacts";
}

// ---- Host-side checks (no GPU). ----

MoeGemmParams ValidParams() {
  alignas(16) static uint8_t buf[64];
  MoeGemmParams p = MoeGemmParamsInit();
  p.num_experts = 4;
  p.num_tokens = 100;
  p.n = 256;
  p.k = 2880;
  p.a = p.b = p.out = buf;
  p.a_scale = p.b_scale = buf;
  p.offsets = reinterpret_cast<const int32_t*>(buf);
  return p;
}

TEST(MoeGemmCheckTest, AcceptsAValidLaunch) {
  EXPECT_EQ(MoeGemmCheck(ValidParams(), {kMxfp4, kBf16, kSwiglu, 64, 128}), "");
  EXPECT_EQ(MoeGemmCheck(ValidParams(), {kBf16, kBf16, kIdentity, 128, 256}), "");
}

TEST(MoeGemmCheckTest, RejectsKNotAMultipleOfTheFormatsBlock) {
  MoeGemmParams p = ValidParams();
  p.k = 100;
  EXPECT_THAT(MoeGemmCheck(p, {kMxfp4, kBf16, kSwiglu, 64, 128}),
              HasSubstr("K = 100 is not a positive multiple of 32 (mxfp4 x bf16 kernels"));
  p.k = 2872;  // a multiple of 8 (bf16 is fine), not of 16 (fp8)
  EXPECT_EQ(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 64, 128}), "");
  EXPECT_THAT(MoeGemmCheck(p, {kFp8, kFp8, kIdentity, 64, 128}),
              HasSubstr("pad K with zeros to a multiple of 16"));
}

TEST(MoeGemmCheckTest, RejectsBadNAndOutputWidth) {
  MoeGemmParams p = ValidParams();
  p.n = 255;
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kSwiglu, 64, 128}),
              HasSubstr("N = 255 must be positive and even for the gated activation swiglu"));
  p.n = 264;  // out 132: not a multiple of 8
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kGeglu, 64, 128}),
              HasSubstr("output width 132 (N/2) is not a multiple of 8"));
  EXPECT_EQ(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 64, 128}), "");
}

TEST(MoeGemmCheckTest, RejectsMissingScalesMisalignmentAndAbi) {
  MoeGemmParams p = ValidParams();
  p.b_scale = nullptr;
  EXPECT_THAT(MoeGemmCheck(p, {kMxfp4, kMxfp8, kIdentity, 64, 128}),
              HasSubstr("mxfp4 x mxfp8 needs block scales (b_scale is null)"));
  EXPECT_EQ(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 64, 128}), "");
  p = ValidParams();
  p.b = static_cast<const uint8_t*>(p.b) + 8;
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 64, 128}),
              HasSubstr("16-byte aligned"));
  p = ValidParams();
  p.abi = 0;
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 64, 128}),
              HasSubstr("has abi 0, this build fills 5"));
}

TEST(MoeGemmCheckTest, OnlyVersionThreeKernelsTakeABias) {
  MoeGemmParams p = ValidParams();
  static const float kBias[4] = {};
  p.bias = kBias;
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 128, 256, kMoeGemmAbiV2}),
              HasSubstr("the kernel takes parameter struct version 2, which has no bias; a "
                        "bias needs a version-3 kernel"));
  EXPECT_EQ(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 128, 256, kMoeGemmAbiV3}), "");
  p.bias = reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(kBias) + 2);
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 128, 256, kMoeGemmAbiV3}),
              HasSubstr("(scales, alpha, beta, limit, bias) must be 4-byte aligned"));
}

// Version 4: out_scale goes with fp8 output, both ways, and fp8 rows are 16-column pieces.
TEST(MoeGemmCheckTest, OutScaleGoesWithFp8OutputOnly) {
  MoeGemmParams p = ValidParams();
  MoeGemmKernelDesc fp8_out{kFp8, kFp8, kSwiglu, 64, 128, kMoeGemmAbiV4, kFp8};
  EXPECT_THAT(MoeGemmCheck(p, fp8_out),
              HasSubstr("out_scale is null, but the kernel writes fp8 (output_format fp8); "
                        "pass the output's fp32 [1] dequantization scale in out_scale"));
  alignas(16) static const float kScale[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  p.out_scale = kScale;
  EXPECT_EQ(MoeGemmCheck(p, fp8_out), "");
  EXPECT_THAT(MoeGemmCheck(p, {kFp8, kFp8, kSwiglu, 64, 128, kMoeGemmAbiV3}),
              HasSubstr("out_scale is set, but the kernel writes bf16 and never reads it; "
                        "leave out_scale null, or use a kernel whose output_format is fp8"));
  p.out_scale = reinterpret_cast<const float*>(reinterpret_cast<uintptr_t>(kScale) + 2);
  EXPECT_THAT(MoeGemmCheck(p, fp8_out),
              HasSubstr("out_scale must be 4-byte aligned (one fp32); pass the address of "
                        "an fp32 [1] array"));
  p.out_scale = kScale;
  fp8_out.abi = kMoeGemmAbiV3;
  EXPECT_THAT(MoeGemmCheck(p, fp8_out),
              HasSubstr("the kernel writes fp8 but takes parameter struct version 3, which "
                        "has no out_scale; rebuild it"));
  fp8_out.abi = kMoeGemmAbiV4;
  p.n = 272;  // out 136: a multiple of 8, not of 16
  EXPECT_THAT(MoeGemmCheck(p, fp8_out),
              HasSubstr("output width 136 (N/2) is not a multiple of 16 (fp8-output kernels "
                        "store 16-byte pieces of e4m3); pad N (each half, when gated) to a "
                        "multiple of 16"));
  p.out_scale = nullptr;
  EXPECT_EQ(MoeGemmCheck(p, {kFp8, kFp8, kSwiglu, 64, 128, kMoeGemmAbiV3}), "");
  fp8_out.output_format = kNvfp4;
  EXPECT_THAT(MoeGemmCheck(ValidParams(), fp8_out),
              HasSubstr("the kernel writes nvfp4; moe_gemm kernels write bf16 or fp8"));
}

// Global scales go with fp8 and nvfp4 weights, whose epilogues read them; any other
// kernel would ignore them.
TEST(MoeGemmCheckTest, GlobalScalesOnlyWhereTheKernelsReadThem) {
  MoeGemmParams p = ValidParams();
  alignas(16) static const float kScale[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  p.a_global_scale = kScale;
  EXPECT_THAT(MoeGemmCheck(p, {kMxfp4, kBf16, kSwiglu, 64, 128}),
              HasSubstr("a_global_scale is set, but mxfp4 x bf16 kernels read global scales "
                        "only with fp8 or nvfp4 weights and would ignore it"));
  EXPECT_EQ(MoeGemmCheck(p, {kNvfp4, kBf16, kSwiglu, 64, 128}), "");
  EXPECT_EQ(MoeGemmCheck(p, {kFp8, kFp8, kSwiglu, 64, 128}), "");
  p.a_global_scale = nullptr;
  p.b_global_scale = kScale;
  EXPECT_THAT(MoeGemmCheck(p, {kFp8Block, kFp8Block, kIdentity, 64, 128}),
              HasSubstr("b_global_scale is set, but fp8-block x fp8-block kernels"));
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 64, 128}),
              HasSubstr("b_global_scale is set, but bf16 x bf16 kernels"));
}

// Version 5: a_row_map goes with kernels that gather A, both ways, with a divisor and A's
// rows of at least 1 and 4-byte alignment.
TEST(MoeGemmCheckTest, RowMapGoesWithGatheringKernelsOnly) {
  MoeGemmParams p = ValidParams();
  MoeGemmKernelDesc gather{kBf16, kBf16, kSwiglu, 128, 128, kMoeGemmAbiV5};
  gather.a_gather = true;
  EXPECT_THAT(MoeGemmCheck(p, gather),
              HasSubstr("a_row_map is null, but the kernel gathers A's rows through it (entry "
                        "a_gather); pass the int32 [T] row map"));
  alignas(16) static const int32_t kMap[4] = {};
  p.a_row_map = kMap;
  p.a_row_divisor = 8;
  p.a_rows = 13;
  EXPECT_EQ(MoeGemmCheck(p, gather), "");
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kSwiglu, 128, 128, kMoeGemmAbiV3}),
              HasSubstr("a_row_map is set, but the kernel reads A's rows in order and would "
                        "ignore it"));
  p.a_row_divisor = 0;
  EXPECT_THAT(MoeGemmCheck(p, gather),
              HasSubstr("a_row_divisor = 0 and a_rows = 13 must both be at least 1"));
  p.a_row_divisor = 8;
  p.a_rows = 0;
  EXPECT_THAT(MoeGemmCheck(p, gather), HasSubstr("a_row_divisor = 8 and a_rows = 0"));
  p.a_rows = 13;
  p.a_row_map = reinterpret_cast<const int32_t*>(reinterpret_cast<uintptr_t>(kMap) + 2);
  EXPECT_THAT(MoeGemmCheck(p, gather), HasSubstr("a_row_map must be 4-byte aligned"));
  p.a_row_map = kMap;
  gather.abi = kMoeGemmAbiV4;
  EXPECT_THAT(MoeGemmCheck(p, gather),
              HasSubstr("the kernel gathers A but takes parameter struct version 4, which has "
                        "no a_row_map; rebuild it"));
}

TEST(MoeGemmCheckTest, OneLaunchBoundsExpertsAndRows) {
  MoeGemmParams p = ValidParams();
  const MoeGemmKernelDesc tma{kBf16, kBf16, kIdentity, 128, 256, kMoeGemmAbiV2};
  EXPECT_EQ(MoeGemmCheck(p, tma), "");
  p.num_experts = kMoeGemmTmaMaxExperts + 1;
  EXPECT_THAT(MoeGemmCheck(p, tma),
              HasSubstr("E = 1025 exceeds the 1024 experts one launch schedules; launch "
                        "groups of at most that many experts"));
  p.num_experts = 1000;
  p.n = 4 * 1024 * 1024;  // 4e9 weight rows: past a TMA coordinate
  EXPECT_THAT(MoeGemmCheck(p, tma), HasSubstr("weight rows exceed a TMA coordinate"));
  p = ValidParams();
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 128, 256, 6}),
              HasSubstr("the kernel takes parameter struct version 6, this build fills "
                        "versions 2 to 5"));
  // Generation 1's version is retired: the check names the fix.
  EXPECT_THAT(MoeGemmCheck(p, {kBf16, kBf16, kIdentity, 64, 128, 1}),
              HasSubstr("moe_gemm: the kernel's parameter struct version 1 (generation "
                        "1) is retired and no longer launched; rebuild the family with "
                        "scripts/build-artifacts"));
}

TEST(MoeGemmAbiTest, PersistentGridIsCappedBySmsAndTiles) {
  MoeGemmParams p = ValidParams();
  p.num_experts = 128;
  p.num_tokens = 128 * 128;
  p.n = 5760;
  // 254 M tiles (the bound) x 45 output tiles: far more than 132 x 2.
  EXPECT_EQ(MoeGemmPersistentGridFor(p, kSwiglu, 128, 128, 132, 2).x, 264u);
  p.num_experts = 1;
  p.num_tokens = 64;
  p.n = 256;
  EXPECT_EQ(MoeGemmPersistentGridFor(p, kIdentity, 64, 128, 132, 2).x, 2u);  // 1 x 2 tiles
  p.num_tokens = 0;
  // No rows: (0 + 63) / 64 = 0 tiles, and a grid is never empty.
  EXPECT_EQ(MoeGemmPersistentGridFor(p, kIdentity, 64, 128, 132, 2).x, 1u);
  EXPECT_GE(MoeGemmPersistentGridFor(p, kIdentity, 128, 128, 0, 0).x, 1u);
}

TEST(MoeGemmAbiTest, GridIsAnUpperBoundOnTiles) {
  MoeGemmParams p = ValidParams();
  p.num_experts = 3;
  p.num_tokens = 130;  // e.g. 1 + 64 + 65 rows: 1 + 1 + 2 = 4 tiles of 64
  p.n = 512;
  EXPECT_EQ(MoeGemmMaxMTiles(130, 3, 64), 4);  // (130 + 3*63) / 64
  EXPECT_EQ(MoeGemmNTiles(512, kIdentity, 128), 4);
  EXPECT_EQ(MoeGemmNTiles(512, kSwiglu, 128), 4);  // 256 out cols / 64
  // With room for every tile, the persistent grid is the bound itself.
  EXPECT_EQ(MoeGemmPersistentGridFor(p, kIdentity, 64, 128, 132, 1).x, 4u * 4u);
  EXPECT_EQ(MoeGemmPersistentGridFor(p, kSwiglu, 64, 128, 132, 1).x, 4u * 4u);
}

// Max over every split of T rows among E experts of sum ceil(rows / tm) (exhaustive).
int64_t MostMTiles(int64_t t, int64_t e, int64_t tm) {
  if (e == 1) return (t + tm - 1) / tm;
  int64_t best = 0;
  for (int64_t here = 0; here <= t; ++here) {
    best = std::max(best, (here + tm - 1) / tm + MostMTiles(t - here, e - 1, tm));
  }
  return best;
}

TEST(MoeGemmAbiTest, MTileBoundIsTightForEverySplit) {
  // T rows reach at most min(T, E) experts: the bound is the most any split needs, no
  // more (a grid sized by E alone gave one decode token's GEMM every expert's tile).
  for (int64_t tm : {1, 2, 3, 64}) {
    for (int64_t e = 1; e <= 5; ++e) {
      for (int64_t t = 0; t <= 12; ++t) {
        EXPECT_EQ(MoeGemmMaxMTiles(t, e, tm), MostMTiles(t, e, tm))
            << "T " << t << " E " << e << " tm " << tm;
      }
    }
  }
  EXPECT_EQ(MoeGemmMaxMTiles(2, 8, 64), 2);      // Mixtral, one token: 2 experts
  EXPECT_EQ(MoeGemmMaxMTiles(8, 256, 64), 8);    // DeepSeek-V3, one token: 8 experts
  EXPECT_EQ(MoeGemmMaxMTiles(128, 128, 64), 128);  // Qwen3, 16 tokens
  MoeGemmParams p = ValidParams();
  p.num_experts = 8;
  p.num_tokens = 2;
  p.n = 4096;
  EXPECT_EQ(MoeGemmPersistentGridFor(p, kIdentity, 64, 128, 132, 2).x, 2u * 32u);
}

// ---- fp8 output (version 4): the comparison the GPU test below makes. ----

// The e4m3 bytes an fp8-output kernel must write for its bf16 twin's output `bf16`
// ([rows, cols] bit patterns): the layer's fp8 quantizer (dispatch/
// moe_quantize_reference.h, exactly cubist_moe_quantize_fp8) with dequantization scale s.
std::vector<uint8_t> Fp8OfBf16(const std::vector<uint16_t>& bf16, int rows, int cols, float s) {
  return QuantizeActivations(kFp8, bf16, rows, cols, s).data;
}

// "" when `got` equals `want` byte for byte, else how many bytes differ and the first
// (row, column, both bytes), for rows of `cols` bytes.
std::string CompareFp8Bytes(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                            int cols) {
  if (got.size() != want.size()) {
    return absl::StrFormat("%d bytes, want %d", got.size(), want.size());
  }
  size_t first = got.size(), differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want[i]) continue;
    if (differ++ == 0) first = i;
  }
  if (differ == 0) return "";
  return absl::StrFormat("%d of %d bytes differ; first at row %d, column %d: got 0x%02x, "
                         "want 0x%02x",
                         differ, got.size(), first / cols, first % cols, got[first],
                         want[first]);
}

// The expected bytes follow the documented rule (saturating round-to-nearest-even of
// x / s, NaN 0x7F), and the comparison names the first differing element.
TEST(MoeGemmFp8OutputTest, ExpectedBytesAndTheComparison) {
  // 1, -2.5, 1000, NaN, 0.013671875 (7 x 2^-9), 0, then 1, 1
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC020, 0x447A, 0x7FC0, 0x3C60, 0x0000,
                                      0x3F80, 0x3F80};
  const std::vector<uint8_t> want = Fp8OfBf16(bf16, 2, 4, 2.0f);
  // 1/2 = 0.5 -> 0x30; -1.25 -> 0xBA; 500 saturates to 448 -> 0x7E; NaN -> 0x7F;
  // 7 x 2^-9 / 2 = 3.5 x 2^-9, halfway between the subnormals 3 and 4 x 2^-9: to even,
  // 0x04; 0 -> 0x00.
  EXPECT_EQ(want, (std::vector<uint8_t>{0x30, 0xBA, 0x7E, 0x7F, 0x04, 0x00, 0x30, 0x30}));
  EXPECT_EQ(CompareFp8Bytes(want, want, 4), "");
  std::vector<uint8_t> got = want;
  got[6] = 0x31;
  got[7] = 0x2F;
  EXPECT_EQ(CompareFp8Bytes(got, want, 4),
            "2 of 8 bytes differ; first at row 1, column 2: got 0x31, want 0x30");
  got.pop_back();
  EXPECT_EQ(CompareFp8Bytes(got, want, 4), "7 bytes, want 8");
}

// ---- GPU. ----

struct GpuEnv {
  DriverApi* driver = nullptr;
  PrimaryContext ctx;
  std::unique_ptr<ModuleCache> cache;
  Stream stream;
  Manifest manifest;
  std::string dir;
  int sm_count = 0;
  std::string skip_reason;
};

GpuEnv& Env() {
  static GpuEnv* env = [] {
    auto* e = new GpuEnv;
    e->dir = ArtifactDir();
    auto driver = GetDriver();
    if (!driver.ok()) {
      e->skip_reason = "no usable CUDA driver/GPU: " + std::string(driver.status().message());
      return e;
    }
    e->driver = *driver;
    auto ctx = PrimaryContext::Retain(*e->driver, 0);
    if (!ctx.ok()) {
      e->skip_reason = "no GPU 0: " + std::string(ctx.status().message());
      return e;
    }
    e->ctx = std::move(*ctx);
    CUdevice dev = 0;
    if (e->driver->DeviceGet(&dev, 0) != CUDA_SUCCESS ||
        e->driver->DeviceGetAttribute(&e->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                      dev) != CUDA_SUCCESS) {
      e->skip_reason = "cannot read the multiprocessor count of GPU 0";
      return e;
    }
    if (!e->ctx.MakeCurrent().ok() || e->ctx.sm().major != 9) {
      e->skip_reason = "the moe_gemm family is sm_90a; this GPU is another architecture";
      return e;
    }
    if (!FileExists(e->dir + "/manifest.json")) {
      e->skip_reason = "no artifact directory " + e->dir +
                       " (scripts/build-artifacts DIR; set CUBIST_MOE_ARTIFACTS=DIR)";
      return e;
    }
    auto m = ParseManifest(ReadFileOrDie(e->dir + "/manifest.json"), e->dir + "/manifest.json");
    if (!m.ok()) {
      e->skip_reason = "manifest: " + std::string(m.status().message());
      return e;
    }
    e->manifest = std::move(*m);
    auto cache = ModuleCache::Create(*e->driver, e->ctx.get());
    auto stream = Stream::Create(*e->driver);
    if (!cache.ok() || !stream.ok()) {
      e->skip_reason = "module cache or stream: " +
                       std::string((cache.ok() ? stream.status() : cache.status()).message());
      return e;
    }
    e->cache = std::move(*cache);
    e->stream = std::move(*stream);
    return e;
  }();
  return *env;
}

#define CUBIST_REQUIRE_GPU()                                            \
  do {                                                                  \
    if (!Env().skip_reason.empty()) GTEST_SKIP() << Env().skip_reason;  \
  } while (0)

template <typename T>
absl::StatusOr<DeviceBuffer> Upload(DriverApi& d, const std::vector<T>& v) {
  if (v.empty()) return DeviceBuffer();
  CUBIST_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(d, v.size() * sizeof(T)));
  CUBIST_RETURN_IF_ERROR(b.CopyFromHost(v.data(), v.size() * sizeof(T)));
  return b;
}

// A problem's inputs on the device plus a poisoned output with a guard band.
struct DeviceProblem {
  DeviceBuffer a, b, a_scale, b_scale, a_gs, b_gs, offsets, alpha, beta, limit, bias, out;
  size_t out_bytes = 0;  // the kernel's output; the guard follows

  absl::Status Init(DriverApi& d, const MoeProblemData& p) {
    CUBIST_ASSIGN_OR_RETURN(a, Upload(d, p.a));
    CUBIST_ASSIGN_OR_RETURN(b, Upload(d, p.b));
    CUBIST_ASSIGN_OR_RETURN(a_scale, Upload(d, p.a_scale));
    CUBIST_ASSIGN_OR_RETURN(b_scale, Upload(d, p.b_scale));
    CUBIST_ASSIGN_OR_RETURN(a_gs, Upload(d, p.a_global_scale));
    CUBIST_ASSIGN_OR_RETURN(b_gs, Upload(d, p.b_global_scale));
    CUBIST_ASSIGN_OR_RETURN(offsets, Upload(d, p.offsets));
    CUBIST_ASSIGN_OR_RETURN(alpha, Upload(d, p.alpha));
    CUBIST_ASSIGN_OR_RETURN(beta, Upload(d, p.beta));
    CUBIST_ASSIGN_OR_RETURN(limit, Upload(d, p.limit));
    CUBIST_ASSIGN_OR_RETURN(bias, Upload(d, p.bias));
    CUBIST_ASSIGN_OR_RETURN(out, DeviceBuffer::Allocate(
                                     d, size_t(p.num_tokens) * p.n * 2 + kGuard));
    return absl::OkStatus();
  }

  MoeGemmParams Params(const MoeProblemData& p, MoeActivation act) {
    MoeGemmParams q = MoeGemmParamsInit();
    auto ptr = [](const DeviceBuffer& b) -> void* {
      return b.size() ? reinterpret_cast<void*>(b.get()) : nullptr;
    };
    q.num_experts = p.num_experts;
    q.num_tokens = p.num_tokens;
    q.n = p.n;
    q.k = p.k;
    q.a = ptr(a);
    q.b = ptr(b);
    q.a_scale = ptr(a_scale);
    q.b_scale = ptr(b_scale);
    q.a_global_scale = static_cast<const float*>(ptr(a_gs));
    q.b_global_scale = static_cast<const float*>(ptr(b_gs));
    q.offsets = static_cast<const int32_t*>(ptr(offsets));
    q.alpha = static_cast<const float*>(ptr(alpha));
    q.beta = static_cast<const float*>(ptr(beta));
    q.limit = static_cast<const float*>(ptr(limit));
    q.bias = static_cast<const float*>(ptr(bias));
    q.out = ptr(out);
    out_bytes = size_t(p.num_tokens) * MoeGemmOutCols(p.n, act) * 2;
    return q;
  }
  static constexpr size_t kGuard = 4096;
};

struct ProblemCase {
  std::string name;
  MoeProblemShape shape;
  void (*mutate)(MoeProblemData*) = nullptr;  // applied after MakeRandomProblem
};

// gpt-oss's experts add a bias after each GEMM: one per expert and B row, O(1) like C,
// drawn from the problem's own seed so that every kernel of the pair sees the same.
void AddBias(MoeProblemData* p) {
  std::mt19937_64 rng(static_cast<uint64_t>(p->n) * 7919 + p->num_experts);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  p->bias.resize(static_cast<size_t>(p->num_experts) * p->n);
  for (float& b : p->bias) b = u(rng);
}

// mxfp4 weights whose block scales span more than 11 binades in one row of each expert
// (row 3: block 1 raised by 2^13, above 2^0) and one NaN scale (expert 2, row 10, block
// 0): tiles holding those rows take the general loop of kernels/moe_gemm_fp4_fp8.cu,
// which applies both block scales per block, and the k-tiles holding them in
// kernels/moe_gemm_fp4.cu's permuted kernels are flagged for the two-multiply decode;
// every other row of those tiles checks that path with ordinary data, and the other
// k-tiles check the one-multiply decode beside it.
void WidenScales(MoeProblemData* p) {
  const int kb = p->k / 32;
  for (int e = 0; e < p->num_experts; ++e) {
    uint8_t& s = p->b_scale[(static_cast<size_t>(e) * p->n + 3) * kb + 1];
    s = static_cast<uint8_t>(std::min(254, s + 13));
  }
  if (p->num_experts > 2) p->b_scale[(2 * static_cast<size_t>(p->n) + 10) * kb] = 0xFF;
}

std::vector<ProblemCase> Problems(MoeFormat w, MoeFormat a) {
  // ragged: 12 experts with 0, 1, 7, 63..65, 127..129, 200 rows; N with a tail for
  // tile_n 256; K with a partial 128-deep k-tile and scale rows that start unaligned;
  // random per-expert alpha, beta, limit. gptoss: K = 2880 (gpt-oss), N/2 = 576, larger
  // experts, default activation parameters. last: every token in the last expert.
  std::vector<ProblemCase> out;
  out.push_back({"ragged", {w, a, 384, 320, RaggedCounts(12, 0), true, true, true}});
  out.push_back({"gptoss", {w, a, 1152, 2880, {40, 0, 300, 17, 128, 256}, false, false, false}});
  out.push_back({"last", {w, a, 128, 256, {0, 0, 0, 0, 0, 0, 0, 77}, false, true, false}});
  // A bias row per expert (parameter struct version 3).
  out.push_back({"bias", {w, a, 384, 320, RaggedCounts(12, 3), true, true, true}, AddBias});
  if (w == kFp8Block) {
    // N/2 = 224: a gated tile's 64 gate rows (224.., 288.., ...) straddle two 128-row
    // scale blocks, so the kernels take their general scale loop (per-group block select)
    // instead of the per-tile one that every other problem here takes.
    out.push_back({"straddle", {w, a, 448, 384, {5, 130, 0, 64}, false, true, false}});
    // N/2 = 200, an odd multiple of 8: the 128x192 tiles' gate halves split inside a unit
    // of four groups, so gated 128x192 kernels take their per-group promotion
    // (kernels/moe_gemm_block_split.h) instead of the lo/hi one.
    out.push_back({"oddhalf", {w, a, 400, 384, {5, 130, 0, 64}, false, true, false}});
    // 160 tiles of 128x192 (20 M tiles x 8 N tiles) on at most 132 SMs with 3 k-tiles
    // each: CTAs run several tiles, so the 192-column kernels' stage ring and scale slots
    // carry their slot and parity across tiles and an odd k-tile count.
    out.push_back({"persistent", {w, a, 1536, 384, {1300, 1132}, false, true, false}});
  }
  if (w == kMxfp4) {
    out.push_back({"widescale", {w, a, 256, 512, {70, 0, 130, 5}, false, true, false},
                   WidenScales});
  }
  return out;
}

TEST(MoeGemmGpuTest, EveryKernelMatchesTheReference) {
  CUBIST_REQUIRE_GPU();
  GpuEnv& env = Env();
  DriverApi& d = *env.driver;
  ASSERT_FALSE(env.manifest.kernels.empty()) << "manifest lists no kernel";

  // Kernels grouped by format pair, so each pair's inputs are made and uploaded once.
  std::map<std::pair<MoeFormat, MoeFormat>, std::vector<const KernelSpec*>> by_pair;
  for (const KernelSpec& k : env.manifest.kernels) {
    if (k.op != kMoeGemmOp) continue;
    auto w = ParseFormat(k.weight_format), a = ParseFormat(k.activation_format);
    ASSERT_TRUE(w && a && ParseAct(k.activation)) << k.name;
    // fp8-output kernels (version 4) are compared with their bf16 twins below.
    if (KernelOutputFormat(k) == "fp8") {
      EXPECT_EQ(k.abi, kMoeGemmAbiV4) << k.name;
      continue;
    }
    // Kernels that gather A (version 5) are compared with their twins below.
    if (KernelGathersA(k)) {
      EXPECT_EQ(k.abi, kMoeGemmAbiV5) << k.name;
      continue;
    }
    EXPECT_EQ(k.abi, kMoeGemmAbiV3) << k.name;
    by_pair[{*w, *a}].push_back(&k);
  }

  std::unique_ptr<std::ofstream> results;
  if (const char* r = std::getenv("CUBIST_MOE_RESULTS"); r && *r) {
    results = std::make_unique<std::ofstream>(r, std::ios::app);
  }
  int launched = 0, passed = 0;
  uint64_t seed = 1000;
  for (const auto& [pair, kernels] : by_pair) {
    for (const ProblemCase& pc : Problems(pair.first, pair.second)) {
      SCOPED_TRACE(pc.name);
      MoeProblemData prob = MakeRandomProblem(pc.shape, ++seed);
      if (pc.mutate != nullptr) pc.mutate(&prob);
      const std::vector<double> c = ReferenceGemm(prob);
      const double c_max = MaxAbs(c);
      DeviceProblem dev;
      ASSERT_TRUE(dev.Init(d, prob).ok());
      std::map<MoeActivation, std::vector<double>> refs;
      for (const KernelSpec* k : kernels) {
        SCOPED_TRACE(k->name);
        const MoeActivation act = *ParseAct(k->activation);
        if (!refs.count(act)) refs[act] = ApplyActivation(prob, c, act);
        const std::vector<double>& ref = refs[act];

        const Artifact* art = env.manifest.FindArtifact(k->artifact);
        ASSERT_NE(art, nullptr);
        auto img = env.cache->AddImageFile(env.dir + "/" + k->artifact,
                                           {.expected_sha256 = art->sha256});
        ASSERT_TRUE(img.ok()) << img.status();
        auto fid = env.cache->AddFunction(*img, k->function, k->shared_mem_bytes);
        ASSERT_TRUE(fid.ok()) << fid.status();
        auto fn = env.cache->GetFunction(*fid);
        ASSERT_TRUE(fn.ok()) << fn.status();

        auto info = MoeGemmKernelInfoOf(*k);
        ASSERT_TRUE(info.ok()) << info.status();
        if (!prob.bias.empty() && info->abi < kMoeGemmAbiV3) continue;  // reads no bias
        MoeGemmParams params = dev.Params(prob, act);
        const MoeGemmKernelDesc desc{pair.first, pair.second, act, k->tile_m, k->tile_n,
                                     info->abi};
        ASSERT_EQ(MoeGemmCheck(params, desc), "");
        MoeGemmLaunch launch;
        const absl::Status prep = PrepareMoeGemmLaunch(d, *info, params, env.sm_count, &launch);
        ASSERT_TRUE(prep.ok()) << prep;
        const MoeGemmGrid grid = launch.grid;
        ASSERT_TRUE(dev.out.FillAsync(0xFF, env.stream.get()).ok());  // bf16 NaN
        ASSERT_TRUE(CuCheck(d,
                            d.LaunchKernel(*fn, grid.x, grid.y, grid.z, k->threads, 1, 1,
                                           k->shared_mem_bytes, env.stream.get(),
                                           launch.kernel_params(), nullptr),
                            "launch " + k->name)
                        .ok());
        const absl::Status sync = env.stream.Synchronize();
        ASSERT_TRUE(sync.ok()) << sync;  // a fault poisons the context: stop here
        ++launched;
        std::vector<uint16_t> out(ref.size());
        std::vector<uint8_t> guard(DeviceProblem::kGuard);
        ASSERT_TRUE(dev.out.CopyToHost(out.data(), dev.out_bytes).ok());
        ASSERT_TRUE(dev.out.CopyToHost(guard.data(), guard.size(), dev.out_bytes).ok());
        EXPECT_EQ(std::count(guard.begin(), guard.end(), 0xFF), int(guard.size()))
            << "wrote past the end of out";
        const Comparison cmp =
            CompareBf16(out, ref, ToleranceFor(pair.first, pair.second), c_max);
        EXPECT_TRUE(cmp.ok) << cmp.summary;
        passed += cmp.ok;
        const std::string line = absl::StrFormat("%-48s %-7s %s %s", k->name, pc.name,
                                                 cmp.ok ? "PASS" : "FAIL", cmp.summary);
        std::printf("%s\n", line.c_str());
        if (results) *results << line << "\n";
      }
    }
  }
  std::printf("moe_gemm: %d of %d launches within tolerance\n", passed, launched);
  if (results) *results << "moe_gemm: " << passed << " of " << launched << " passed\n";
}

// Loads kernel `k` through the module cache, launches it on `params` and waits.
absl::Status LaunchAndWait(GpuEnv& env, const KernelSpec& k, const MoeGemmParams& params) {
  DriverApi& d = *env.driver;
  const Artifact* art = env.manifest.FindArtifact(k.artifact);
  if (art == nullptr) return absl::NotFoundError("no artifact " + k.artifact);
  CUBIST_ASSIGN_OR_RETURN(auto img, env.cache->AddImageFile(env.dir + "/" + k.artifact,
                                                            {.expected_sha256 = art->sha256}));
  CUBIST_ASSIGN_OR_RETURN(auto fid, env.cache->AddFunction(img, k.function, k.shared_mem_bytes));
  CUBIST_ASSIGN_OR_RETURN(CUfunction fn, env.cache->GetFunction(fid));
  CUBIST_ASSIGN_OR_RETURN(MoeGemmKernelInfo info, MoeGemmKernelInfoOf(k));
  MoeGemmKernelDesc desc{info.weight_format, info.activation_format, info.activation,
                         k.tile_m, k.tile_n, info.abi, info.output_format};
  desc.a_gather = info.a_gather;
  if (std::string e = MoeGemmCheck(params, desc); !e.empty()) {
    return absl::InvalidArgumentError(e);
  }
  MoeGemmLaunch launch;
  CUBIST_RETURN_IF_ERROR(PrepareMoeGemmLaunch(d, info, params, env.sm_count, &launch));
  CUBIST_RETURN_IF_ERROR(CuCheck(d,
                                 d.LaunchKernel(fn, launch.grid.x, launch.grid.y, launch.grid.z,
                                                k.threads, 1, 1, k.shared_mem_bytes,
                                                env.stream.get(), launch.kernel_params(),
                                                nullptr),
                                 "launch " + k.name));
  return env.stream.Synchronize();
}

// The moe_gemm kernels of `m` that `is_variant` picks (e4m3 output, the gather of A), each
// with its twin: the kernel named as it without `suffix`, which must exist and write bf16
// reading A in order (checked here: a variant without its twin is a failure).
std::vector<std::pair<const KernelSpec*, const KernelSpec*>> VariantsAndTwins(
    const Manifest& m, bool (*is_variant)(const KernelSpec&), std::string_view suffix) {
  std::vector<std::pair<const KernelSpec*, const KernelSpec*>> out;
  for (const KernelSpec& k : m.kernels) {
    if (k.op != kMoeGemmOp || !is_variant(k)) continue;
    const std::string twin = k.name.substr(0, k.name.rfind(suffix));
    auto it = std::find_if(m.kernels.begin(), m.kernels.end(),
                           [&](const KernelSpec& t) { return t.name == twin; });
    EXPECT_NE(it, m.kernels.end()) << k.name << " has no twin " << twin;
    if (it == m.kernels.end()) continue;
    EXPECT_EQ(KernelOutputFormat(*it), "bf16") << twin;
    EXPECT_FALSE(KernelGathersA(*it)) << twin;
    out.emplace_back(&k, &*it);
  }
  return out;
}

// Every fp8-output kernel (version 4, "_ofp8") writes, byte for byte, what the layer's
// fp8 quantizer makes of its bf16 twin's output (the same kernel but for the output; the
// test above checks the twin against the reference), on every problem of the pair, with a
// scale that saturates the largest quarter of the values. Nothing past its e4m3 rows.
TEST(MoeGemmGpuTest, Fp8OutputKernelsWriteTheQuantizedOutputOfTheirBf16Twins) {
  CUBIST_REQUIRE_GPU();
  GpuEnv& env = Env();
  DriverApi& d = *env.driver;
  const auto fused = VariantsAndTwins(
      env.manifest, [](const KernelSpec& k) { return KernelOutputFormat(k) == "fp8"; }, "_ofp8");
  if (fused.empty()) {
    GTEST_SKIP() << "the manifest has no fp8-output kernel (scripts/build-artifacts builds "
                    "them with the fp8 pair)";
  }
  int compared = 0;
  uint64_t seed = 5000;
  for (const ProblemCase& pc : Problems(kFp8, kFp8)) {
    SCOPED_TRACE(pc.name);
    MoeProblemData prob = MakeRandomProblem(pc.shape, ++seed);
    if (pc.mutate != nullptr) pc.mutate(&prob);
    DeviceProblem dev;
    ASSERT_TRUE(dev.Init(d, prob).ok());
    auto scale_buf = DeviceBuffer::Allocate(d, 16);
    ASSERT_TRUE(scale_buf.ok()) << scale_buf.status();
    const int rows = prob.offsets.back();  // the rows the experts own (and the kernels write)
    for (const auto& [k, twin] : fused) {
      SCOPED_TRACE(k->name);
      const MoeActivation act = *ParseAct(k->activation);
      const int cols = MoeGemmOutCols(prob.n, act);
      MoeGemmParams params = dev.Params(prob, act);
      ASSERT_TRUE(dev.out.Fill(0xFF).ok());
      const absl::Status twin_run = LaunchAndWait(env, *twin, params);
      ASSERT_TRUE(twin_run.ok()) << twin_run;
      std::vector<uint16_t> bf16(static_cast<size_t>(rows) * cols);
      ASSERT_TRUE(dev.out.CopyToHost(bf16.data(), bf16.size() * 2).ok());
      float amax = 0.0f;
      for (uint16_t v : bf16) amax = std::max(amax, std::fabs(Bf16ToFloat(v)));
      const float s = std::max(amax, 1e-30f) * 0.75f / 448.0f;
      ASSERT_TRUE(scale_buf->CopyFromHost(&s, sizeof(s)).ok());
      params.out_scale = reinterpret_cast<const float*>(scale_buf->get());
      ASSERT_TRUE(dev.out.Fill(0xFF).ok());
      const absl::Status run = LaunchAndWait(env, *k, params);
      ASSERT_TRUE(run.ok()) << run;
      const size_t bytes = static_cast<size_t>(rows) * cols;
      std::vector<uint8_t> got(bytes), guard(DeviceProblem::kGuard);
      ASSERT_TRUE(dev.out.CopyToHost(got.data(), bytes).ok());
      ASSERT_TRUE(dev.out.CopyToHost(guard.data(), guard.size(),
                                     static_cast<size_t>(prob.num_tokens) * cols)
                      .ok());
      EXPECT_EQ(std::count(guard.begin(), guard.end(), 0xFF), int(guard.size()))
          << "wrote past the end of out";
      const std::string diff = CompareFp8Bytes(got, Fp8OfBf16(bf16, rows, cols, s), cols);
      EXPECT_EQ(diff, "");
      std::printf("%-48s %-7s %s %s\n", k->name.c_str(), pc.name.c_str(),
                  diff.empty() ? "PASS" : "FAIL", diff.empty() ? "exact" : diff.c_str());
      ++compared;
    }
  }
  std::printf("moe_gemm fp8 output: %d kernel x problem comparisons\n", compared);
}

// Every kernel that gathers A (version 5, "_gather") writes, bit for bit, what its twin
// reading A in order (the same kernel but for its producer) writes on the gathered rows,
// on every problem of the pair: A's rows scrambled, each row's map entry token x 3 +
// slot (divisor 3, as the layer's top_k), and every 17th row pointing at no row (a
// negative entry, or a quotient past a_rows), which reads zeros - the twin's row there is
// zero. Nothing past out's rows.
TEST(MoeGemmGpuTest, GatheringKernelsMatchTheirTwinsOnTheGatheredRows) {
  CUBIST_REQUIRE_GPU();
  GpuEnv& env = Env();
  DriverApi& d = *env.driver;
  const auto gathering = VariantsAndTwins(
      env.manifest, [](const KernelSpec& k) { return KernelGathersA(k); }, "_gather");
  if (gathering.empty()) {
    GTEST_SKIP() << "the manifest has no kernel that gathers A (scripts/build-artifacts "
                    "builds them with the bf16 pair)";
  }
  constexpr int kDivisor = 3;
  int compared = 0;
  uint64_t seed = 7000;
  for (const ProblemCase& pc : Problems(kBf16, kBf16)) {
    SCOPED_TRACE(pc.name);
    MoeProblemData prob = MakeRandomProblem(pc.shape, ++seed);
    if (pc.mutate != nullptr) pc.mutate(&prob);
    const int t = prob.num_tokens;
    const size_t row_bytes = static_cast<size_t>(prob.k) * 2;
    std::vector<int> perm(t);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(static_cast<uint32_t>(seed)));
    std::vector<uint8_t> source(static_cast<size_t>(t) * row_bytes);
    std::vector<int32_t> map(t);
    for (int r = 0; r < t; ++r) {
      std::copy_n(prob.a.begin() + r * row_bytes, row_bytes, source.begin() + perm[r] * row_bytes);
      if (r % 17 == 5 || r % 17 == 11) {
        map[r] = r % 17 == 5 ? -1 - r : (t + r) * kDivisor;
        std::fill_n(prob.a.begin() + r * row_bytes, row_bytes, uint8_t{0});
      } else {
        map[r] = perm[r] * kDivisor + r % kDivisor;
      }
    }
    DeviceProblem dev;
    ASSERT_TRUE(dev.Init(d, prob).ok());  // the twin's A: the gathered rows
    auto source_buf = Upload(d, source);
    ASSERT_TRUE(source_buf.ok()) << source_buf.status();
    auto map_buf = Upload(d, map);
    ASSERT_TRUE(map_buf.ok()) << map_buf.status();
    for (const auto& [k, twin] : gathering) {
      SCOPED_TRACE(k->name);
      const MoeActivation act = *ParseAct(k->activation);
      MoeGemmParams params = dev.Params(prob, act);
      const size_t bytes = dev.out_bytes + DeviceProblem::kGuard;
      std::vector<uint8_t> want(bytes), got(bytes);
      ASSERT_TRUE(dev.out.Fill(0xFF).ok());
      const absl::Status twin_run = LaunchAndWait(env, *twin, params);
      ASSERT_TRUE(twin_run.ok()) << twin_run;
      ASSERT_TRUE(dev.out.CopyToHost(want.data(), bytes).ok());
      params.a = reinterpret_cast<const void*>(source_buf->get());
      params.a_row_map = reinterpret_cast<const int32_t*>(map_buf->get());
      params.a_row_divisor = kDivisor;
      params.a_rows = t;
      ASSERT_TRUE(dev.out.Fill(0xFF).ok());
      const absl::Status run = LaunchAndWait(env, *k, params);
      ASSERT_TRUE(run.ok()) << run;
      ASSERT_TRUE(dev.out.CopyToHost(got.data(), bytes).ok());
      EXPECT_EQ(std::count(got.end() - DeviceProblem::kGuard, got.end(), 0xFF),
                int(DeviceProblem::kGuard))
          << "wrote past the end of out";
      const bool same = got == want;
      EXPECT_TRUE(same) << "outputs differ from the twin's in some bits";
      std::printf("%-48s %-7s %s\n", k->name.c_str(), pc.name.c_str(),
                  same ? "PASS exact" : "FAIL");
      ++compared;
    }
  }
  std::printf("moe_gemm gather: %d kernel x problem comparisons\n", compared);
}

// More experts than one launch schedules (1,024): MoeGemm runs them as
// launches over groups of experts (dispatch/moe_gemm_launch.h MoeGemmExpertGroup), each
// with its own offsets, B, scales, activation parameters and bias. Through the dispatcher
// (pinned to each version-3 SwiGLU kernel in turn), against the reference; rows in every
// group and on the groups' edges (experts 1023/1024 and 2047/2048).
TEST(MoeGemmGpuTest, ManyExpertsRunAsLaunchesOverGroupsOfExperts) {
  CUBIST_REQUIRE_GPU();
  GpuEnv& env = Env();
  DriverApi& d = *env.driver;
  TempDir dir;
  RuntimeOptions o;
  o.manifest = env.dir + "/manifest.json";
  o.cache_dir = dir.Join("cache");
  o.tuning_file = "none";
  auto rt = Runtime::Open(o);
  ASSERT_TRUE(rt.ok()) << rt.status();
  ASSERT_TRUE((*rt)->MakeCurrent().ok());
  std::vector<int> counts(2500, 0);
  for (auto [e, rows] : {std::pair{0, 5}, {700, 64}, {1023, 3}, {1024, 17}, {1500, 130},
                         {2047, 1}, {2048, 40}, {2499, 70}}) {
    counts[e] = rows;
  }
  std::map<std::pair<MoeFormat, MoeFormat>, std::vector<const KernelSpec*>> by_pair;
  for (const KernelSpec& k : env.manifest.kernels) {
    if (k.op == kMoeGemmOp && k.activation == "swiglu" && KernelOutputFormat(k) == "bf16" &&
        !KernelGathersA(k)) {
      by_pair[{*ParseFormat(k.weight_format), *ParseFormat(k.activation_format)}].push_back(&k);
    }
  }
  ASSERT_FALSE(by_pair.empty()) << "the family has no swiglu kernel";
  int launched = 0, passed = 0;
  uint64_t seed = 7000;
  for (const auto& [pair, kernels] : by_pair) {
    MoeProblemData prob =
        MakeRandomProblem({pair.first, pair.second, 256, 256, counts, true, true, true}, ++seed);
    AddBias(&prob);
    const std::vector<double> c = ReferenceGemm(prob);
    const std::vector<double> ref = ApplyActivation(prob, c, kSwiglu);
    DeviceProblem dev;
    ASSERT_TRUE(dev.Init(d, prob).ok());
    const MoeGemmParams p = dev.Params(prob, kSwiglu);
    MoeGemmArgs args;
    args.weight_format = pair.first;
    args.activation_format = pair.second;
    args.activation = kSwiglu;
    args.experts = p.num_experts;
    args.tokens = p.num_tokens;
    args.n = p.n;
    args.k = p.k;
    auto at = [](const void* q) { return reinterpret_cast<CUdeviceptr>(q); };
    args.a = at(p.a);
    args.b = at(p.b);
    args.a_scale = at(p.a_scale);
    args.b_scale = at(p.b_scale);
    args.a_global_scale = at(p.a_global_scale);
    args.b_global_scale = at(p.b_global_scale);
    args.offsets = at(p.offsets);
    args.alpha = at(p.alpha);
    args.beta = at(p.beta);
    args.limit = at(p.limit);
    args.bias = at(p.bias);
    args.out = at(p.out);
    for (const KernelSpec* k : kernels) {
      SCOPED_TRACE(k->name);
      MoeGemmOptions go;
      go.pinned_kernel = k->name;
      auto gemm = MoeGemm::Create(**rt, go);
      ASSERT_TRUE(gemm.ok()) << gemm.status();
      const absl::Status can = (*gemm)->CanImplement(args);
      ASSERT_TRUE(can.ok()) << can;
      ASSERT_TRUE(dev.out.FillAsync(0xFF, env.stream.get()).ok());
      const absl::Status run = (*gemm)->Run(args, env.stream.get());
      ASSERT_TRUE(run.ok()) << run;
      const absl::Status sync = env.stream.Synchronize();
      ASSERT_TRUE(sync.ok()) << sync;
      ++launched;
      std::vector<uint16_t> out(ref.size());
      std::vector<uint8_t> guard(DeviceProblem::kGuard);
      ASSERT_TRUE(dev.out.CopyToHost(out.data(), dev.out_bytes).ok());
      ASSERT_TRUE(dev.out.CopyToHost(guard.data(), guard.size(), dev.out_bytes).ok());
      EXPECT_EQ(std::count(guard.begin(), guard.end(), 0xFF), int(guard.size()))
          << "wrote past the end of out";
      const Comparison cmp =
          CompareBf16(out, ref, ToleranceFor(pair.first, pair.second), MaxAbs(c));
      EXPECT_TRUE(cmp.ok) << cmp.summary;
      passed += cmp.ok;
      std::printf("%-48s E=2500 %s %s\n", k->name.c_str(), cmp.ok ? "PASS" : "FAIL",
                  cmp.summary.c_str());
    }
  }
  std::printf("moe_gemm, E = 2500 in groups: %d of %d kernels within tolerance\n", passed,
              launched);
}

// A problem whose every expert is empty launches (the grid is never empty) and writes
// nothing, for a kernel of each parameter-struct version in the manifest.
TEST(MoeGemmGpuTest, NoTokensWritesNothing) {
  CUBIST_REQUIRE_GPU();
  GpuEnv& env = Env();
  DriverApi& d = *env.driver;
  std::map<int, const KernelSpec*> by_abi;  // the last kernel of each version
  for (const KernelSpec& s : env.manifest.kernels) {
    if (s.op == kMoeGemmOp) by_abi[s.abi] = &s;
  }
  ASSERT_FALSE(by_abi.empty());
  for (const auto& [abi, k] : by_abi) {
    SCOPED_TRACE(k->name);
    MoeProblemShape shape{*ParseFormat(k->weight_format), *ParseFormat(k->activation_format),
                          256, 256, {0, 0, 0, 0}};
    MoeProblemData prob = MakeRandomProblem(shape, 9);
    prob.num_tokens = 0;
    DeviceProblem dev;
    ASSERT_TRUE(dev.Init(d, prob).ok());
    const MoeActivation act = *ParseAct(k->activation);
    MoeGemmParams params = dev.Params(prob, act);
    params.a = params.out = reinterpret_cast<void*>(dev.out.get());  // T = 0: any valid ptr
    if (KernelOutputFormat(*k) == "fp8") {  // version 4: an fp8 output needs its scale
      params.out_scale = reinterpret_cast<const float*>(dev.out.get());
    }
    if (KernelGathersA(*k)) {  // version 5: a row map (never read without rows)
      params.a_row_map = reinterpret_cast<const int32_t*>(dev.out.get());
      params.a_row_divisor = 1;
      params.a_rows = 1;
    }
    auto img = env.cache->AddImageFile(
        env.dir + "/" + k->artifact,
        {.expected_sha256 = env.manifest.FindArtifact(k->artifact)->sha256});
    ASSERT_TRUE(img.ok());
    auto fn = env.cache->GetFunction(*img, k->function);
    ASSERT_TRUE(fn.ok()) << fn.status();
    ASSERT_TRUE(dev.out.Fill(0xFF).ok());
    auto info = MoeGemmKernelInfoOf(*k);
    ASSERT_TRUE(info.ok()) << info.status();
    MoeGemmLaunch launch;
    ASSERT_TRUE(PrepareMoeGemmLaunch(d, *info, params, env.sm_count, &launch).ok());
    ASSERT_TRUE(CuCheck(d, d.LaunchKernel(*fn, launch.grid.x, 1, 1, k->threads, 1, 1,
                                          k->shared_mem_bytes, env.stream.get(),
                                          launch.kernel_params(), nullptr),
                        "launch")
                    .ok());
    ASSERT_TRUE(env.stream.Synchronize().ok());
    std::vector<uint8_t> guard(DeviceProblem::kGuard);
    ASSERT_TRUE(dev.out.CopyToHost(guard.data(), guard.size()).ok());
    EXPECT_EQ(std::count(guard.begin(), guard.end(), 0xFF), int(guard.size()));
  }
}

}  // namespace
}  // namespace cubist::testing
