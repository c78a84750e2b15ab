// PrepareMoeGemmLaunch and MoeGemmKernelInfoOf (dispatch/moe_gemm_launch.h) without a GPU:
// the parameter block and grid of version-1 and version-2 launches, the tensor maps the
// driver is asked to encode (recorded by a fake driver), the per-thread map cache, and the
// errors.
#include "dispatch/moe_gemm_launch.h"

#include <cstring>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moe_gemm_abi.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

// Records every cuTensorMapEncodeTiled call and writes a recognisable map.
class MapRecordingDriver : public DriverApi {
 public:
  struct Call {
    CUtensorMapDataType type;
    cuuint32_t rank;
    uint64_t address;
    cuuint64_t dims[2];
    cuuint64_t stride;
    cuuint32_t box[2];
    CUtensorMapSwizzle swizzle;
    CUtensorMapFloatOOBfill oob;
  };
  CUresult TensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
                                void* addr, const cuuint64_t* dim, const cuuint64_t* strides,
                                const cuuint32_t* box, const cuuint32_t*,
                                CUtensorMapInterleave, CUtensorMapSwizzle sw,
                                CUtensorMapL2promotion, CUtensorMapFloatOOBfill oob) override {
    if (result != CUDA_SUCCESS) return result;
    calls.push_back({type, rank, reinterpret_cast<uint64_t>(addr), {dim[0], dim[1]},
                     strides[0], {box[0], box[1]}, sw, oob});
    std::memset(map, 0, sizeof(*map));
    std::memcpy(map, &calls.back().address, 8);  // the map "is" its address
    return CUDA_SUCCESS;
  }
  std::vector<Call> calls;
  CUresult result = CUDA_SUCCESS;
};

moe::MoeGemmParams Params(uint64_t a, uint64_t b) {
  moe::MoeGemmParams p = moe::MoeGemmParamsInit();
  p.num_experts = 128;
  p.num_tokens = 128 * 128;
  p.n = 5760;
  p.k = 2880;
  p.a = reinterpret_cast<const void*>(a);
  p.b = reinterpret_cast<const void*>(b);
  p.offsets = reinterpret_cast<const int32_t*>(0x9000);
  p.out = reinterpret_cast<void*>(0xA000);
  return p;
}

MoeGemmKernelInfo Tma(moe::MoeFormat f, moe::MoeActivation act, int tm, int tn, int per_sm) {
  MoeGemmKernelInfo k;
  k.abi = moe::kMoeGemmAbiV2;
  k.weight_format = k.activation_format = f;
  k.activation = act;
  k.tile_m = tm;
  k.tile_n = tn;
  k.ctas_per_sm = per_sm;
  return k;
}

TEST(MoeGemmLaunchTest, ConfigCarriesTheGridAndOnlyTheAttributesAsked) {
  MoeGemmLaunch l;
  l.grid = moe::MoeGemmGrid{264, 1, 1};
  const unsigned one[3] = {1, 1, 1};
  const CUstream stream = reinterpret_cast<CUstream>(0x5);
  CUlaunchConfig plain = l.Config(384, 200000, one, false, stream);
  EXPECT_EQ(plain.gridDimX, 264u);
  EXPECT_EQ(plain.gridDimY, 1u);
  EXPECT_EQ(plain.blockDimX, 384u);
  EXPECT_EQ(plain.blockDimY, 1u);
  EXPECT_EQ(plain.sharedMemBytes, 200000u);
  EXPECT_EQ(plain.hStream, stream);
  EXPECT_EQ(plain.numAttrs, 0u);
  EXPECT_EQ(plain.attrs, nullptr);

  const unsigned pair[3] = {2, 1, 1};
  CUlaunchConfig both = l.Config(384, 0, pair, true, stream);
  ASSERT_EQ(both.numAttrs, 2u);
  EXPECT_EQ(both.attrs, l.attrs);
  EXPECT_EQ(both.attrs[0].id, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
  EXPECT_EQ(both.attrs[0].value.clusterDim.x, 2u);
  EXPECT_EQ(both.attrs[0].value.clusterDim.y, 1u);
  EXPECT_EQ(both.attrs[0].value.clusterDim.z, 1u);
  EXPECT_EQ(both.attrs[1].id, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
  EXPECT_EQ(both.attrs[1].value.programmaticStreamSerializationAllowed, 1);
}

TEST(MoeGemmLaunchTest, VersionTwoEncodesBothMapsAndAPersistentGrid) {
  MapRecordingDriver d;
  MoeGemmLaunch l;
  const MoeGemmKernelInfo k = Tma(moe::kBf16, moe::kSwiglu, 128, 256, 1);
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, Params(0x11000, 0x22000), 132, &l).ok());
  EXPECT_EQ(l.params.g.abi, moe::kMoeGemmAbiV2);  // the kernel's version, not the caller's
  EXPECT_EQ(l.params.g.n, 5760);
  EXPECT_EQ(*l.kernel_params(), static_cast<void*>(&l.params));
  ASSERT_EQ(d.calls.size(), 2u);
  // A: [T, K] bf16, box 64 elements (128 bytes) x tile_m rows, 128-byte swizzle, zero fill.
  EXPECT_EQ(d.calls[0].type, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
  EXPECT_EQ(d.calls[0].rank, 2u);
  EXPECT_EQ(d.calls[0].address, 0x11000u);
  EXPECT_EQ(d.calls[0].dims[0], 2880u);
  EXPECT_EQ(d.calls[0].dims[1], 16384u);
  EXPECT_EQ(d.calls[0].stride, 2880u * 2);
  EXPECT_EQ(d.calls[0].box[0], 64u);
  EXPECT_EQ(d.calls[0].box[1], 128u);
  EXPECT_EQ(d.calls[0].swizzle, CU_TENSOR_MAP_SWIZZLE_128B);
  EXPECT_EQ(d.calls[0].oob, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  // B: [E*N, K], a box is half the tile's rows when gated (x0 and x1 come separately).
  EXPECT_EQ(d.calls[1].address, 0x22000u);
  EXPECT_EQ(d.calls[1].dims[1], 128u * 5760u);
  EXPECT_EQ(d.calls[1].box[1], 128u);
  uint64_t a_map = 0, b_map = 0;
  std::memcpy(&a_map, &l.params.a_map, 8);
  std::memcpy(&b_map, &l.params.b_map, 8);
  EXPECT_EQ(a_map, 0x11000u);
  EXPECT_EQ(b_map, 0x22000u);
  // 254 M tiles x 12 N tiles = 3048 > 132 SMs: one CTA per SM walks the tiles.
  EXPECT_EQ(l.grid.x, 132u);

  // fp8: one byte per element, 128 elements per box row; a small problem gets one CTA
  // per tile, and two per SM where the kernel says so.
  d.calls.clear();
  moe::MoeGemmParams p = Params(0x31000, 0x42000);
  p.num_experts = 2;
  p.num_tokens = 64;
  p.n = 256;
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, Tma(moe::kFp8, moe::kIdentity, 64, 128, 2), p, 132, &l)
                  .ok());
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].type, CU_TENSOR_MAP_DATA_TYPE_UINT8);
  EXPECT_EQ(d.calls[0].stride, 2880u);
  EXPECT_EQ(d.calls[0].box[0], 128u);
  EXPECT_EQ(d.calls[0].box[1], 64u);
  EXPECT_EQ(d.calls[1].box[1], 128u);
  EXPECT_EQ(l.grid.x, 2u * 2u);  // (64 + 2*63)/64 = 2 M tiles x 2 N tiles
}

TEST(MoeGemmLaunchTest, ClusterKernelsLoadHalfOfBAndLaunchWholeClusters) {
  MapRecordingDriver d;
  MoeGemmLaunch l;
  MoeGemmKernelInfo k = Tma(moe::kBf16, moe::kIdentity, 128, 256, 1);
  k.cluster = 2;
  moe::MoeGemmParams p = Params(0x51000, 0x62000);
  p.num_experts = 1;
  p.num_tokens = 300;  // (300 + 127) / 128 = 3 M tiles
  p.n = 256;           // one N tile: 3 CTAs, rounded up to 2 clusters
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, p, 132, &l).ok());
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].box[1], 128u);  // A: the CTA's own tile_m rows
  EXPECT_EQ(d.calls[1].box[1], 128u);  // B: 256 rows shared by two CTAs
  EXPECT_EQ(l.grid.x, 4u);
}

TEST(MoeGemmLaunchTest, ClusterShapesOtherThanTwoAlongXAreRefused) {
  KernelSpec s;
  s.name = "moe_gemm_tma_bf16_bf16_identity_m128n256k64_c2";
  s.abi = 2;
  s.weight_format = s.activation_format = "bf16";
  s.activation = "identity";
  s.tile_m = 128;
  s.tile_n = 256;
  s.cluster = {2, 1, 1};
  auto k = MoeGemmKernelInfoOf(s);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->cluster, 2);
  s.cluster = {4, 1, 1};
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernel moe_gemm_tma_bf16_bf16_identity_m128n256k64_c2: "
                                 "cluster: [4, 1, 1]; moe_gemm kernels take [1, 1, 1] or "
                                 "[2, 1, 1]")));
}

TEST(MoeGemmLaunchTest, MapsAreCachedPerThreadByPointerShapeAndBox) {
  MapRecordingDriver d;
  MoeGemmLaunch l;
  const MoeGemmKernelInfo k = Tma(moe::kBf16, moe::kIdentity, 128, 128, 1);
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, Params(0x51000, 0x62000), 132, &l).ok());
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, Params(0x51000, 0x62000), 132, &l).ok());
  EXPECT_EQ(d.calls.size(), 2u);  // the repeat was served from the cache
  // New activations, same weights: only A is encoded again.
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, Params(0x71000, 0x62000), 132, &l).ok());
  ASSERT_EQ(d.calls.size(), 3u);
  EXPECT_EQ(d.calls[2].address, 0x71000u);
  // Another token count changes A's shape: encoded again.
  moe::MoeGemmParams p = Params(0x71000, 0x62000);
  p.num_tokens = 100;
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, p, 132, &l).ok());
  ASSERT_EQ(d.calls.size(), 4u);
  EXPECT_EQ(d.calls[3].dims[1], 100u);
  // Another thread has its own cache.
  std::thread([&] {
    MoeGemmLaunch l2;
    ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, Params(0x51000, 0x62000), 132, &l2).ok());
  }).join();
  EXPECT_EQ(d.calls.size(), 6u);
}

TEST(MoeGemmLaunchTest, NoTokensStillEncodesAOneRowMap) {
  MapRecordingDriver d;
  MoeGemmLaunch l;
  moe::MoeGemmParams p = Params(0x81000, 0x92000);
  p.num_tokens = 0;
  ASSERT_TRUE(
      PrepareMoeGemmLaunch(d, Tma(moe::kBf16, moe::kIdentity, 64, 128, 2), p, 132, &l).ok());
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].dims[1], 1u);
  // No rows reach an expert: no M tiles, and a grid is never empty.
  EXPECT_EQ(l.grid.x, 1u);
}

// A kernel that gathers A (version 5) gets its gather fields, and a one-row map at A (it
// reads A through the row map, never the tensor map: one map serves every batch size);
// a kernel that does not gets them zeroed, the padding its older struct had there,
// whatever the caller left in them.
TEST(MoeGemmLaunchTest, GatheringKernelsGetTheRowMapAndAOneRowAMap) {
  MapRecordingDriver d;
  MoeGemmLaunch l;
  moe::MoeGemmParams p = Params(0xA1000, 0xB2000);
  static const int32_t kMap[4] = {};
  p.a_row_map = kMap;
  p.a_row_divisor = 8;
  p.a_rows = 2048;
  MoeGemmKernelInfo k = Tma(moe::kBf16, moe::kSwiglu, 128, 256, 1);
  k.abi = moe::kMoeGemmAbiV5;
  k.a_gather = true;
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, p, 132, &l).ok());
  EXPECT_EQ(l.params.g.abi, moe::kMoeGemmAbiV5);
  EXPECT_EQ(l.params.g.a_row_map, kMap);
  EXPECT_EQ(l.params.g.a_row_divisor, 8);
  EXPECT_EQ(l.params.g.a_rows, 2048);
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].dims[1], 1u) << "a map nothing reads, the same for any a_rows";
  EXPECT_EQ(l.grid.x, 132u) << "the grid still covers the T routed rows";
  p.a_rows = 4096;  // another batch: no new map
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, p, 132, &l).ok());
  EXPECT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(l.params.g.a_rows, 4096);

  d.calls.clear();
  k.abi = moe::kMoeGemmAbiV3;
  k.a_gather = false;
  ASSERT_TRUE(PrepareMoeGemmLaunch(d, k, p, 132, &l).ok());
  EXPECT_EQ(l.params.g.a_row_map, nullptr);
  EXPECT_EQ(l.params.g.a_row_divisor, 0);
  EXPECT_EQ(l.params.g.a_rows, 0);
  ASSERT_EQ(d.calls.size(), 1u) << "B's map comes from the cache";
  EXPECT_EQ(d.calls[0].dims[1], 16384u);
}

TEST(MoeGemmLaunchTest, DriverWithoutTensorMapsIsAPreconditionError) {
  MapRecordingDriver d;
  d.result = CUDA_ERROR_NOT_SUPPORTED;
  MoeGemmLaunch l;
  EXPECT_THAT(PrepareMoeGemmLaunch(d, Tma(moe::kBf16, moe::kIdentity, 64, 128, 2),
                                   Params(0xA1000, 0xB2000), 132, &l),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("cannot encode TMA tensor maps (cuTensorMapEncodeTiled needs "
                                 "CUDA 12.0); update the NVIDIA driver")));
  d.result = CUDA_ERROR_INVALID_VALUE;
  const absl::Status s = PrepareMoeGemmLaunch(d, Tma(moe::kBf16, moe::kIdentity, 64, 128, 2),
                                              Params(0xA1000, 0xB2000), 132, &l);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("moe_gemm: tensor map of a [16384 x 2880] at 0xa1000, "
                                     "box 64 x 64"));
}

TEST(MoeGemmLaunchTest, KernelInfoFromTheManifestEntry) {
  KernelSpec s;
  s.name = "moe_gemm_tma_fp8_fp8_relu2_m64n128k128";
  s.abi = 2;
  s.weight_format = s.activation_format = "fp8";
  s.activation = "relu2";
  s.tile_m = 64;
  s.tile_n = 128;
  s.extras["ctas_per_sm"] = "2";
  auto k = MoeGemmKernelInfoOf(s);
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->abi, 2);
  EXPECT_EQ(k->weight_format, moe::kFp8);
  EXPECT_EQ(k->activation, moe::kRelu2);
  EXPECT_EQ(k->ctas_per_sm, 2);
  s.extras["ctas_per_sm"] = "0";
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernel moe_gemm_tma_fp8_fp8_relu2_m64n128k128: ctas_per_sm: "
                                 "expected an integer in 1..32, got 0")));
  s.extras.erase("ctas_per_sm");
  // "pdl": whether the kernel waits for the previous grid; absent means it does not.
  EXPECT_FALSE(MoeGemmKernelInfoOf(s)->pdl);
  s.extras["pdl"] = "true";
  EXPECT_TRUE(MoeGemmKernelInfoOf(s)->pdl);
  s.extras["pdl"] = "false";
  EXPECT_FALSE(MoeGemmKernelInfoOf(s)->pdl);
  s.extras["pdl"] = "1";
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernel moe_gemm_tma_fp8_fp8_relu2_m64n128k128: pdl: "
                                 "expected true or false, got 1")));
  s.extras.erase("pdl");
  s.abi = 3;  // version 2's struct with the bias
  ASSERT_TRUE(MoeGemmKernelInfoOf(s).ok());
  EXPECT_EQ(MoeGemmKernelInfoOf(s)->abi, 3);
  // Version 5: a_gather, only there (true or false).
  s.extras["a_gather"] = "true";
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a_gather: gathering A needs parameter struct version 5 "
                                 "(a_row_map), the entry says 3")));
  s.abi = 5;
  ASSERT_TRUE(MoeGemmKernelInfoOf(s).ok());
  EXPECT_TRUE(MoeGemmKernelInfoOf(s)->a_gather);
  s.extras["a_gather"] = "yes";
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a_gather: expected true or false, got yes")));
  s.extras["a_gather"] = "false";
  ASSERT_TRUE(MoeGemmKernelInfoOf(s).ok());
  EXPECT_FALSE(MoeGemmKernelInfoOf(s)->a_gather);
  s.extras.erase("a_gather");
  s.abi = 6;
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("abi: parameter struct version 6; this build fills versions "
                                 "2 to 5")));
  s.abi = 0;
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("abi: parameter struct version 0; this build fills versions "
                                 "2 to 5")));
  // Generation 1's version is retired: the entry is refused with the fix.
  s.abi = 1;
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernel moe_gemm_tma_fp8_fp8_relu2_m64n128k128: abi: parameter "
                                 "struct version 1 (generation 1) is retired and no longer "
                                 "launched; rebuild the family with scripts/build-artifacts")));
  // "output_format": what the kernel writes; fp8 only from version 4 (out_scale).
  s.abi = 3;
  EXPECT_EQ(MoeGemmKernelInfoOf(s)->output_format, moe::kBf16);
  s.extras["output_format"] = "\"fp8\"";
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernel moe_gemm_tma_fp8_fp8_relu2_m64n128k128: output_format: "
                                 "fp8 needs parameter struct version 4 (out_scale), the entry "
                                 "says 3; rebuild the kernel with scripts/build-artifacts")));
  s.abi = 4;
  ASSERT_TRUE(MoeGemmKernelInfoOf(s).ok()) << MoeGemmKernelInfoOf(s).status();
  EXPECT_EQ(MoeGemmKernelInfoOf(s)->output_format, moe::kFp8);
  s.extras["output_format"] = "\"bf16\"";
  EXPECT_EQ(MoeGemmKernelInfoOf(s)->output_format, moe::kBf16);
  s.extras["output_format"] = "\"nvfp4\"";
  EXPECT_THAT(MoeGemmKernelInfoOf(s),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("output_format: moe_gemm kernels write bf16 or fp8, got "
                                 "nvfp4")));
  s.extras.erase("output_format");
  s.abi = 3;
  s.weight_format = "fp16";
  EXPECT_THAT(MoeGemmKernelInfoOf(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("weight_format")));
}

}  // namespace
}  // namespace cubist
