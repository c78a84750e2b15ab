// Publishing check (CI, no GPU): `scripts/build-artifacts --small` builds a subset of the
// moe_gemm family and the MoE layer's own kernels (one cubin, kernels/moe_layer.cu) into
// the build tree, and the result must be a valid repository: the project's manifest
// parser accepts manifest.json, every artifact's size and SHA-256 match its file, and
// each cubin, inspected by the loader's ELF reader, is sm_90a SASS holding exactly the
// kernels its entries name, with the ABI's parameter size, the block size the entry
// promises and no local-memory frame. Skipped when nvcc is absent.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/moe_gemm_abi.h"
#include "kernels/moe_gemm_layout.h"
#include "kernels/moe_layer_abi.h"
#include "loader/cubin.h"
#include "manifest/manifest_parser.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/temp_files.h"

namespace cubist::testing {
namespace {

using ::testing::HasSubstr;

bool HaveNvcc() {
  const char* env = std::getenv("NVCC");
  if (env && *env) return FileExists(env);
  return RunCommand("command -v nvcc >/dev/null 2>&1") == 0 ||
         FileExists("/usr/local/cuda/bin/nvcc");
}

class MoeArtifactsTest : public ::testing::Test {
 protected:
  // ctest runs each test case in its own process, several at once (-j): they must not
  // build into one directory together. Under a lock, the first process of a ctest run
  // (identified by the parent pid, recorded in a stamp) builds; the others reuse it.
  static void SetUpTestSuite() {
    dir_ = new std::string(BinaryDir() + "/moe-artifacts-small");
    if (!HaveNvcc()) return;
    output_ = new std::string;
    const std::string stamp = *dir_ + ".stamp";
    const std::string run_id = std::to_string(::getppid());
    int lock = ::open((*dir_ + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(lock, 0);
    ASSERT_EQ(::flock(lock, LOCK_EX), 0);
    if (FileExists(stamp) && ReadFileOrDie(stamp) == run_id &&
        FileExists(*dir_ + "/manifest.json")) {
      status_ = 0;
    } else {
      ::unlink(stamp.c_str());
      status_ = RunCommand("rm -rf '" + *dir_ + "' && " + SourceDir() +
                               "/scripts/build-artifacts --small '" + *dir_ +
                               "' 2>&1",
                           output_);
      if (status_ == 0) WriteFileOrDie(stamp, run_id);
    }
    ::close(lock);
  }
  void SetUp() override {
    if (output_ == nullptr) GTEST_SKIP() << "nvcc not found (NVCC, PATH, /usr/local/cuda)";
    ASSERT_EQ(status_, 0) << *output_;
  }
  static std::string* dir_;
  static std::string* output_;
  static int status_;
};
// The layer's kernels (kernels/moe_layer_abi.h's table): function, op, block size,
// parameter struct size. Every build has them, in this order, unless --no-layer.
struct LayerKernel {
  const char* function;
  const char* op;
  int threads;
  int param_bytes;
};
constexpr LayerKernel kLayerKernels[] = {
    {"cubist_moe_route", moe::kMoeRouteOp, moe::kMoeRouteThreads,
     sizeof(moe::MoeRouteParams)},
    {"cubist_moe_route_sort", moe::kMoeRouteOp, moe::kMoeSortThreads,
     sizeof(moe::MoeRouteSortParams)},
    {"cubist_moe_sort_fused", moe::kMoeSortOp, moe::kMoeSortThreads,
     sizeof(moe::MoeSortParams)},
    {"cubist_moe_sort_count", moe::kMoeSortOp, moe::kMoeSortThreads,
     sizeof(moe::MoeSortParams)},
    {"cubist_moe_sort_scan", moe::kMoeSortOp, moe::kMoeSortThreads,
     sizeof(moe::MoeSortParams)},
    {"cubist_moe_sort_scatter", moe::kMoeSortOp, moe::kMoeSortThreads,
     sizeof(moe::MoeSortParams)},
    {"cubist_moe_gather_bf16", moe::kMoeGatherOp, moe::kMoeGatherThreads,
     sizeof(moe::MoeGatherParams)},
    {"cubist_moe_finalize", moe::kMoeFinalizeOp, moe::kMoeFinalizeThreads,
     sizeof(moe::MoeFinalizeParams)},
    {"cubist_moe_sort_masked", moe::kMoeSortOp, moe::kMoeMaskedThreads,
     sizeof(moe::MoeMaskedParams)},
    {"cubist_moe_finalize_masked", moe::kMoeFinalizeOp, moe::kMoeMaskedThreads,
     sizeof(moe::MoeMaskedParams)},
    {"cubist_moe_quantize_fp8", moe::kMoeQuantizeOp, moe::kMoeQuantizeThreads,
     sizeof(moe::MoeQuantizeParams)},
    {"cubist_moe_quantize_fp8_block", moe::kMoeQuantizeOp, moe::kMoeQuantizeThreads,
     sizeof(moe::MoeQuantizeParams)},
    {"cubist_moe_quantize_mxfp8", moe::kMoeQuantizeOp, moe::kMoeQuantizeThreads,
     sizeof(moe::MoeQuantizeParams)},
    {"cubist_moe_quantize_nvfp4", moe::kMoeQuantizeOp, moe::kMoeQuantizeThreads,
     sizeof(moe::MoeQuantizeParams)},
    {"cubist_moe_quantize_nvfp4_decoded", moe::kMoeQuantizeOp, moe::kMoeQuantizeThreads,
     sizeof(moe::MoeQuantizeParams)},
};
constexpr char kLayerCubin[] = "cubins/sm_90a/moe_layer.cubin";
// What --list prints after the selected GEMMs.
constexpr char kLayerList[] =
    "cubist_moe_route\n"
    "cubist_moe_route_sort\n"
    "cubist_moe_sort_fused\n"
    "cubist_moe_sort_count\n"
    "cubist_moe_sort_scan\n"
    "cubist_moe_sort_scatter\n"
    "cubist_moe_gather_bf16\n"
    "cubist_moe_finalize\n"
    "cubist_moe_sort_masked\n"
    "cubist_moe_finalize_masked\n"
    "cubist_moe_quantize_fp8\n"
    "cubist_moe_quantize_fp8_block\n"
    "cubist_moe_quantize_mxfp8\n"
    "cubist_moe_quantize_nvfp4\n"
    "cubist_moe_quantize_nvfp4_decoded\n";

const LayerKernel* FindLayerKernel(const std::string& function) {
  for (const LayerKernel& l : kLayerKernels) {
    if (function == l.function) return &l;
  }
  return nullptr;
}

std::string* MoeArtifactsTest::dir_ = nullptr;
std::string* MoeArtifactsTest::output_ = nullptr;
int MoeArtifactsTest::status_ = -1;

TEST_F(MoeArtifactsTest, ManifestParsesAndDescribesEveryKernel) {
  const std::string path = *dir_ + "/manifest.json";
  auto m = ParseManifest(ReadFileOrDie(path), path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "moe-gemm-sm90a");
  // Without --version: the family's, raised when its set of kernels changed (9: the bf16
  // pair's GEMMs that gather A).
  EXPECT_EQ(m->version, 9);
  // The --small preset: 7 GEMMs in a cubin each (one gathering A), and the layer's 15
  // kernels in one.
  ASSERT_EQ(m->kernels.size(), 22u);
  ASSERT_EQ(m->artifacts.size(), 8u);
  std::set<std::string> formats, layer;
  for (const KernelSpec& k : m->kernels) {
    SCOPED_TRACE(k.name);
    if (const LayerKernel* l = FindLayerKernel(k.function)) {
      layer.insert(k.function);
      EXPECT_EQ(k.name, k.function);
      EXPECT_EQ(k.op, l->op);
      EXPECT_EQ(k.abi, moe::kMoeLayerAbi);
      EXPECT_EQ(k.arch, "sm_90a");
      EXPECT_EQ(k.artifact, kLayerCubin);
      EXPECT_EQ(k.threads, l->threads);
      EXPECT_EQ(k.weight_format, "bf16");
      EXPECT_EQ(k.activation_format, "bf16");
      EXPECT_EQ(k.activation, "identity");
      EXPECT_EQ(k.tile_m, 1);
      EXPECT_EQ(k.tile_n, 1);
      EXPECT_EQ(k.tile_k, 1);
      EXPECT_EQ(k.cluster, (std::array<int, 3>{1, 1, 1}));
      EXPECT_EQ(k.stages, 1);
      EXPECT_EQ(k.shared_mem_bytes, 0);
      EXPECT_THAT(k.extras.at("grid"), HasSubstr("CTA"));
      EXPECT_THAT(k.extras.at("registers"), ::testing::MatchesRegex("[1-9][0-9]*"));
      if (k.function == "cubist_moe_route_sort") {
        EXPECT_EQ(k.extras.at("dynamic_shared"), "\"MoeRouteSortSharedBytes(T, E)\"");
      } else if (k.op == moe::kMoeRouteOp) {
        EXPECT_EQ(k.extras.at("dynamic_shared"), "\"MoeRouteSharedBytes(E)\"");
      } else {
        EXPECT_EQ(k.extras.count("dynamic_shared"), 0u);
      }
      continue;
    }
    EXPECT_EQ(k.op, "moe_gemm");
    // Every kernel is TMA, persistent, and takes the version-3 parameter struct (bias),
    // or version 5 where it gathers A (row r reads A's row a_row_map[r] / divisor).
    EXPECT_TRUE(k.name.starts_with("moe_gemm_tma_"));
    const bool gathers = k.name.ends_with("_gather");
    EXPECT_EQ(k.abi, gathers ? moe::kMoeGemmAbiV5 : moe::kMoeGemmAbiV3);
    EXPECT_EQ(k.extras.count("a_gather"), gathers ? 1u : 0u);
    if (gathers) EXPECT_EQ(k.extras.at("a_gather"), "true");
    EXPECT_EQ(k.arch, "sm_90a");
    EXPECT_EQ(k.function, k.name);
    EXPECT_EQ(k.artifact, "cubins/sm_90a/" + k.name + ".cubin");
    EXPECT_EQ(k.cluster, (std::array<int, 3>{1, 1, 1}));
    // A consumer warpgroup per 64 rows of tile_m and a producer warpgroup; fp4 kernels
    // swap the operands (64 weight rows, of tile_n, per consumer).
    const bool fp4 = k.weight_format == "mxfp4" || k.weight_format == "nvfp4";
    EXPECT_EQ(k.threads, ((fp4 ? k.tile_n : k.tile_m) / 64 + 1) * 128);
    EXPECT_GT(k.shared_mem_bytes, 48 * 1024);
    EXPECT_LE(k.shared_mem_bytes, moe::kMaxDynamicSmem);
    EXPECT_EQ(k.extras.count("exact"), 0u);  // every kernel of the preset is exact
    formats.insert(k.weight_format + "x" + k.activation_format);
    // Extras the dispatcher reads (raw JSON text).
    const bool gated = k.activation == "swiglu" || k.activation == "geglu" ||
                       k.activation == "situ";
    EXPECT_EQ(k.extras.at("gated"), gated ? "true" : "false");
    EXPECT_EQ(k.extras.at("n_multiple"), gated ? "16" : "8");
    EXPECT_THAT(k.extras.at("k_multiple"), ::testing::AnyOf("8", "16", "32"));
    EXPECT_THAT(k.extras.at("grid"), HasSubstr("MoeGemmPersistentGridFor"));
    EXPECT_EQ(k.extras.at("max_experts"), "1024");
    EXPECT_EQ(k.extras.at("pdl"), "true");  // PipelinePrologue waits for the previous grid
    EXPECT_EQ(k.extras.count("decode"), 1u);
    EXPECT_EQ(k.extras.at("decode").find("activations") != std::string::npos,
              k.weight_format == "nvfp4");  // fp4 activations: decoded by converter warps
    // Pipeline depth and CTAs per SM, as kernels/moe_gemm_meta.cc chooses them: 64-row
    // bf16 tiles take 4 stages to fit two CTAs per SM; the fp8 one (16 KiB stages, past two
    // per SM at 4) the deepest that fits, 8; 128-row bf16 tiles 6 of 32 KiB; fp4 tiles of
    // 64 tokens 3 (decoded weights need room), of 8 tokens 4 at two per SM.
    const std::map<std::string, std::pair<int, std::string>> pipeline = {
        {"moe_gemm_tma_bf16_bf16_identity_m64n128k64", {4, "2"}},
        {"moe_gemm_tma_bf16_bf16_swiglu_m64n128k64", {4, "2"}},
        {"moe_gemm_tma_mxfp4_bf16_swiglu_m64n128k256", {3, "1"}},
        {"moe_gemm_tma_fp8_fp8_relu2_m64n128k128", {8, "1"}},
        {"moe_gemm_tma_bf16_bf16_swiglu_m128n128k64", {6, "1"}},
        {"moe_gemm_tma_bf16_bf16_swiglu_m128n128k64_gather", {6, "1"}},
        {"moe_gemm_tma_nvfp4_nvfp4_swiglu_m8n128k256", {4, "2"}},
    };
    ASSERT_EQ(pipeline.count(k.name), 1u);
    EXPECT_EQ(k.stages, pipeline.at(k.name).first);
    EXPECT_EQ(k.extras.at("ctas_per_sm"), pipeline.at(k.name).second);
    EXPECT_THAT(k.extras.at("mma"), HasSubstr("wgmma"));
  }
  EXPECT_EQ(formats,
            (std::set<std::string>{"bf16xbf16", "mxfp4xbf16", "fp8xfp8", "nvfp4xnvfp4"}));
  EXPECT_EQ(layer.size(), std::size(kLayerKernels));
}

TEST_F(MoeArtifactsTest, ArtifactsMatchTheirHashesAndSizes) {
  const std::string path = *dir_ + "/manifest.json";
  auto m = ParseManifest(ReadFileOrDie(path), path);
  ASSERT_TRUE(m.ok()) << m.status();
  for (const Artifact& a : m->artifacts) {
    SCOPED_TRACE(a.path);
    struct stat st;
    ASSERT_EQ(::stat((*dir_ + "/" + a.path).c_str(), &st), 0);
    ASSERT_TRUE(a.size.has_value());
    EXPECT_EQ(*a.size, static_cast<uint64_t>(st.st_size));
    auto h = Sha256File(*dir_ + "/" + a.path);
    ASSERT_TRUE(h.ok()) << h.status();
    EXPECT_EQ(*h, a.sha256);
  }
}

TEST_F(MoeArtifactsTest, CubinsAreSm90aWithTheAbiParameterStruct) {
  const std::string path = *dir_ + "/manifest.json";
  auto m = ParseManifest(ReadFileOrDie(path), path);
  ASSERT_TRUE(m.ok()) << m.status();
  for (const KernelSpec& k : m->kernels) {
    SCOPED_TRACE(k.name);
    auto info = InspectCubinFile(*dir_ + "/" + k.artifact);
    ASSERT_TRUE(info.ok()) << info.status();
    ASSERT_EQ(info->container, CubinInfo::Container::kCubin);
    ASSERT_EQ(info->images.size(), 1u);
    const ImageInfo& img = info->images[0];
    EXPECT_EQ(img.sm.major, 9);
    EXPECT_EQ(img.sm.minor, 0);
    EXPECT_EQ(img.sm.variant, SmTarget::Variant::kArch);  // sm_90a: wgmma needs it
    if (const LayerKernel* l = FindLayerKernel(k.function)) {
      // The layer's cubin holds its fifteen kernels and nothing else.
      std::set<std::string> names;
      for (const KernelInfo& ki : img.kernels) names.insert(ki.name);
      EXPECT_EQ(names.size(), std::size(kLayerKernels));
      for (const LayerKernel& each : kLayerKernels) EXPECT_EQ(names.count(each.function), 1u);
      auto ki = std::find_if(img.kernels.begin(), img.kernels.end(),
                             [&](const KernelInfo& i) { return i.name == k.function; });
      ASSERT_NE(ki, img.kernels.end());
      ASSERT_TRUE(ki->param_bytes.has_value());
      EXPECT_EQ(*ki->param_bytes, l->param_bytes);
      ASSERT_TRUE(ki->max_threads.has_value());  // __launch_bounds__ of the header's count
      EXPECT_EQ(*ki->max_threads, k.threads);
      if (ki->frame_bytes) EXPECT_EQ(*ki->frame_bytes, 0) << "registers spilled to local memory";
      ASSERT_TRUE(ki->registers.has_value());
      EXPECT_EQ(std::to_string(*ki->registers), k.extras.at("registers"));
      continue;
    }
    ASSERT_EQ(img.kernels.size(), 1u);  // one kernel per cubin
    const KernelInfo& ki = img.kernels[0];
    EXPECT_EQ(ki.name, k.function);
    ASSERT_TRUE(ki.param_bytes.has_value());
    // The 64-byte aligned parameter (its tensor maps) starts at an aligned address of the
    // constant bank, so the bank's parameter size includes up to 63 bytes of padding
    // before it (496 with nvcc 13.0: 48 + 448).
    EXPECT_GE(*ki.param_bytes, static_cast<int>(sizeof(moe::MoeGemmParamsV2)));
    EXPECT_LT(*ki.param_bytes, static_cast<int>(sizeof(moe::MoeGemmParamsV2)) + 64);
    if (ki.max_threads) EXPECT_EQ(*ki.max_threads, k.threads);
    if (ki.frame_bytes) EXPECT_EQ(*ki.frame_bytes, 0) << "registers spilled to local memory";
  }
}

TEST_F(MoeArtifactsTest, SelectionFlagsAndBadUsage) {
  std::string out;
  ASSERT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list --formats mxfp4 "
                       "--activations swiglu,geglu --tiles 64x128 2>&1", &out), 0) << out;
  EXPECT_EQ(out,
            "moe_gemm_tma_mxfp4_bf16_swiglu_m64n128k256\n"
            "moe_gemm_tma_mxfp4_bf16_geglu_m64n128k256\n"
            "moe_gemm_tma_mxfp4_mxfp8_swiglu_m64n128k256\n"
            "moe_gemm_tma_mxfp4_mxfp8_geglu_m64n128k256\n" +
                std::string(kLayerList));
  ASSERT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list 2>&1", &out), 0);
  // The whole family: 170 TMA kernels writing bf16 (generation 2; generation 1's 95 are
  // retired; the FP4 pairs' 8x64 tiles and the nvfp4 x bf16 pair among them), the fp8
  // pair's 15 writing e4m3 (_ofp8) and the bf16 pair's 20 gathering A (_gather); then
  // the layer's 15, which the GEMM selection flags do not filter.
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 220);
  EXPECT_THAT(out, ::testing::Not(::testing::ContainsRegex("(^|\n)moe_gemm_[^t]")));
  EXPECT_TRUE(out.ends_with(kLayerList)) << out;
  ASSERT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list --no-layer 2>&1", &out),
            0);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 205);
  EXPECT_THAT(out, ::testing::Not(HasSubstr("cubist_moe_")));
  // mxfp4 x mxfp8: the bf16-MMA kernels up to 64 tokens (kernels/moe_gemm_fp4.cu; 8 tokens
  // also 64 weight rows wide), then the fp8-MMA one of 128 tokens, weights decoded by
  // converters (kernels/moe_gemm_fp4_fp8.cu, tile_k 128): one design per tile.
  ASSERT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list "
                       "--formats mxfp4xmxfp8 --activations swiglu 2>&1", &out), 0) << out;
  EXPECT_EQ(out,
            "moe_gemm_tma_mxfp4_mxfp8_swiglu_m8n64k256\n"
            "moe_gemm_tma_mxfp4_mxfp8_swiglu_m8n128k256\n"
            "moe_gemm_tma_mxfp4_mxfp8_swiglu_m16n128k256\n"
            "moe_gemm_tma_mxfp4_mxfp8_swiglu_m32n128k256\n"
            "moe_gemm_tma_mxfp4_mxfp8_swiglu_m64n128k256\n"
            "moe_gemm_tma_mxfp4_mxfp8_swiglu_m128n128k128\n" +
                std::string(kLayerList));
  ASSERT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list "
                       "--formats fp8 --activations relu2 --no-layer 2>&1", &out), 0) << out;
  EXPECT_EQ(out,
            "moe_gemm_tma_fp8_fp8_relu2_m64n128k128\n"
            "moe_gemm_tma_fp8_fp8_relu2_m64n128k128_ofp8\n"
            "moe_gemm_tma_fp8_fp8_relu2_m128n128k128\n"
            "moe_gemm_tma_fp8_fp8_relu2_m128n128k128_ofp8\n"
            "moe_gemm_tma_fp8_fp8_relu2_m128n192k128\n"
            "moe_gemm_tma_fp8_fp8_relu2_m128n192k128_ofp8\n");
  // --outputs: bf16 leaves the e4m3-output twins out, fp8 keeps only them (the fp8 pair's:
  // no other pair has them). The bf16 pair's gathering twins (_gather) write bf16.
  ASSERT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list --formats fp8,bf16 "
                       "--activations relu2 --tiles 64x128 --outputs bf16 --no-layer 2>&1",
                       &out), 0) << out;
  EXPECT_EQ(out,
            "moe_gemm_tma_bf16_bf16_relu2_m64n128k64\n"
            "moe_gemm_tma_bf16_bf16_relu2_m64n128k64_gather\n"
            "moe_gemm_tma_fp8_fp8_relu2_m64n128k128\n");
  ASSERT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list --formats bf16 "
                       "--activations relu2 --tiles 64x128 --no-gather --no-layer 2>&1",
                       &out), 0) << out;
  EXPECT_EQ(out, "moe_gemm_tma_bf16_bf16_relu2_m64n128k64\n");
  ASSERT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list --formats fp8,bf16 "
                       "--activations swiglu --outputs fp8 --no-layer 2>&1",
                       &out), 0) << out;
  EXPECT_EQ(out,
            "moe_gemm_tma_fp8_fp8_swiglu_m64n128k128_ofp8\n"
            "moe_gemm_tma_fp8_fp8_swiglu_m128n128k128_ofp8\n"
            "moe_gemm_tma_fp8_fp8_swiglu_m128n192k128_ofp8\n");
  EXPECT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list --outputs nvfp4 2>&1",
                       &out), 2);
  EXPECT_THAT(out, HasSubstr("--outputs: unknown 'nvfp4'; one of ['bf16', 'fp8']"));
  // fp8-block: the same tiles as fp8 per tensor, 128x192 with its scales in shared memory.
  ASSERT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list "
                       "--formats fp8-block --activations swiglu --no-layer 2>&1", &out), 0)
      << out;
  EXPECT_EQ(out,
            "moe_gemm_tma_fp8block_fp8block_swiglu_m64n128k128\n"
            "moe_gemm_tma_fp8block_fp8block_swiglu_m128n128k128\n"
            "moe_gemm_tma_fp8block_fp8block_swiglu_m128n192k128\n");
  EXPECT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list --formats fp16 2>&1",
                       &out), 2);
  EXPECT_THAT(out, HasSubstr("--formats: unknown 'fp16'"));
  // One generation is left: there is nothing to choose.
  EXPECT_EQ(RunCommand(SourceDir() + "/scripts/build-artifacts x --list --generation 1 2>&1",
                       &out), 2);
  EXPECT_THAT(out, HasSubstr("unrecognized arguments: --generation 1"));
}

// Builds the GEMM kernels `selection` names (no layer, the Python manifest writer) into
// dir/art; returns build-artifacts' exit status, its output in *out.
int BuildGemmKernels(const TempDir& dir, const std::string& selection, std::string* out) {
  return RunCommand(SourceDir() + "/scripts/build-artifacts '" + dir.Join("art") + "' " +
                        selection + " --writer python --no-layer 2>&1",
                    out);
}

// ptxas serializes every wgmma of a kernel (a wait after each) when one is left in flight
// across a loop's back edge or issued under a runtime condition (docs/kernels.md,
// "Serialized wgmma"). The 64-row fp8 per-tensor kernel, the fp4 kernels that decode
// weights into registers (here mxfp4 x mxfp8 with 64 tokens) and the converter-fed
// fp8-MMA mxfp4 x mxfp8 one must stay free of it; build-artifacts would name such a
// kernel. The 128-row fp8 kernel keeps its serialized loop because it
// measured faster: the check's positive case, counted in the summary, not named as a
// problem. The fp8 pair's e4m3-output twins (_ofp8) keep their bf16 twins' main loops:
// the 64-row one free of it, the 128-row one serialized by design; neither spills.
TEST(MoeKernelPtxasTest, SerializedWgmmaOnlyWhereMeasuredFaster) {
  if (!HaveNvcc()) GTEST_SKIP() << "nvcc not found (NVCC, PATH, /usr/local/cuda)";
  TempDir dir;
  std::string out;
  ASSERT_EQ(BuildGemmKernels(dir, "--formats fp8,mxfp4xmxfp8 --activations relu2 "
                                  "--tiles 64x128x128,128x128x128,64x128x256",
                             &out),
            0)
      << out;
  EXPECT_THAT(out, HasSubstr("build-artifacts: 6 kernels in"));
  EXPECT_THAT(out, HasSubstr("; 2 with the wgmma serialized by ptxas, as designed: "
                             "docs/kernels.md, \"Serialized wgmma\")\n"));
  EXPECT_THAT(out, HasSubstr("build-artifacts: [6/6] "));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("ptxas serialized the wgmma of")));
  for (const char* name :
       {"moe_gemm_tma_fp8_fp8_relu2_m64n128k128", "moe_gemm_tma_fp8_fp8_relu2_m64n128k128_ofp8",
        "moe_gemm_tma_mxfp4_mxfp8_relu2_m64n128k256",
        "moe_gemm_tma_mxfp4_mxfp8_relu2_m128n128k128"}) {
    EXPECT_THAT(out, ::testing::Not(HasSubstr(std::string("wgmma of ") + name + " ")));
    EXPECT_TRUE(FileExists(dir.Join(std::string("art/cubins/sm_90a/") + name + ".cubin")))
        << name;
  }
  EXPECT_FALSE(FileExists(dir.Join(std::string("art/") + kLayerCubin)));  // --no-layer
  // No kernel of the family rounds an operand on purpose: none says "exact": false
  // (KernelEntry::exact; the selection tests cover such kernels with synthetic entries).
  const std::string path = dir.Join("art/manifest.json");
  auto m = ParseManifest(ReadFileOrDie(path), path);
  ASSERT_TRUE(m.ok()) << m.status();
  // Without --version: the family's version, raised when its set of kernels changed.
  EXPECT_EQ(m->version, 9);
  ASSERT_EQ(m->kernels.size(), 6u);
  for (const KernelSpec& k : m->kernels) {
    EXPECT_EQ(k.extras.count("exact"), 0u) << k.name;
    // The e4m3-output twins: version 4, what they write, rows of whole 16-byte pieces
    // (relu2: N itself is the output width), no spill; the others version 3, bf16.
    const bool fp8_out = k.name.ends_with("_ofp8");
    EXPECT_EQ(k.abi, fp8_out ? moe::kMoeGemmAbiV4 : moe::kMoeGemmAbiV3) << k.name;
    if (fp8_out) {
      EXPECT_EQ(k.extras.at("output_format"), "\"fp8\"") << k.name;
      EXPECT_EQ(k.extras.at("n_multiple"), "16") << k.name;
      EXPECT_EQ(k.extras.at("spill_bytes"), "0") << k.name;
    } else {
      EXPECT_EQ(k.extras.count("output_format"), 0u) << k.name;
    }
  }
}

// Builds `selection` (scripts/build-artifacts arguments) into dir and checks that ptxas
// neither spilled nor serialized the wgmma of any of its `count` kernels; their specs.
std::vector<KernelSpec> BuildUnspilled(const TempDir& dir, const std::string& selection,
                                       size_t count) {
  std::string out;
  EXPECT_EQ(BuildGemmKernels(dir, selection, &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("build-artifacts: ", count, " kernels in")));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("serialized")));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("spilled")));
  const std::string path = dir.Join("art/manifest.json");
  auto m = ParseManifest(ReadFileOrDie(path), path);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return {};
  EXPECT_EQ(m->kernels.size(), count);
  return m->kernels;
}

// The FP4 8x64 tiles: one consumer warpgroup (256 threads), two CTAs per SM with their
// launch's registers (no setmaxnreg: nothing to move), no spill, and the calibration that
// lets them win only where 8x128 tiles leave SMs idle (0.7 of 8x128's rate per SM).
TEST(MoeKernelPtxasTest, Fp4NarrowTilesNeitherSpillNorSerialize) {
  if (!HaveNvcc()) GTEST_SKIP() << "nvcc not found (NVCC, PATH, /usr/local/cuda)";
  TempDir dir;
  for (const KernelSpec& k :
       BuildUnspilled(dir, "--formats mxfp4,nvfp4 --activations identity --tiles 8x64x256", 4)) {
    SCOPED_TRACE(k.name);
    EXPECT_EQ(k.tile_m, 8);
    EXPECT_EQ(k.tile_n, 64);
    EXPECT_EQ(k.threads, 256);
    EXPECT_EQ(k.extras.at("ctas_per_sm"), "2");
    EXPECT_EQ(k.extras.at("spill_bytes"), "0");
    EXPECT_EQ(k.extras.at("mma_efficiency"), "0.106");
  }
}

// The fp8-block 128x192 kernels hold an accumulator and a partial of 96 registers per
// consumer thread; their block scales go through shared memory (kernels/moe_gemm_tma.cu
// StagedScaleLoop) because per-thread scales spilled there. ptxas must report no spill
// and keep their wgmma asynchronous; their entries carry the scale slots' shared memory
// and the calibration fitted on routed prefill rows (0.78; the 128x128 tile's is 0.76).
TEST(MoeKernelPtxasTest, Fp8Block192NeitherSpillsNorSerializes) {
  if (!HaveNvcc()) GTEST_SKIP() << "nvcc not found (NVCC, PATH, /usr/local/cuda)";
  TempDir dir;
  for (const KernelSpec& k : BuildUnspilled(
           dir, "--formats fp8-block --activations identity,swiglu --tiles 128x192", 2)) {
    SCOPED_TRACE(k.name);
    EXPECT_EQ(k.tile_n, 192);
    EXPECT_EQ(k.shared_mem_bytes, 193152);
    EXPECT_EQ(k.extras.at("spill_bytes"), "0");
    EXPECT_EQ(k.extras.at("mma_efficiency"), "0.78");
  }
}

// The bf16 kernels that gather A (version 5): their producer warps issue 8 copies of 16
// bytes a stage each with their addresses, which spilled with the producer's 40 registers; the
// two-consumer tiles move 56 to it (consumers 224) and must spill nothing, in the widest
// tile and the gated epilogue. Their entries say a_gather and version 5; their twins
// (built alongside) stay version 3 without it.
TEST(MoeKernelPtxasTest, GatheringKernelsNeitherSpillNorSerialize) {
  if (!HaveNvcc()) GTEST_SKIP() << "nvcc not found (NVCC, PATH, /usr/local/cuda)";
  TempDir dir;
  int gathering = 0;
  for (const KernelSpec& k :
       BuildUnspilled(dir, "--formats bf16 --activations swiglu --tiles 128x256,64x128", 4)) {
    SCOPED_TRACE(k.name);
    EXPECT_EQ(k.extras.at("spill_bytes"), "0");
    const bool gathers = k.name.ends_with("_gather");
    gathering += gathers;
    EXPECT_EQ(k.abi, gathers ? moe::kMoeGemmAbiV5 : moe::kMoeGemmAbiV3);
    EXPECT_EQ(k.extras.count("a_gather"), gathers ? 1u : 0u);
    EXPECT_EQ(k.extras.count("output_format"), 0u) << "they write bf16";
  }
  EXPECT_EQ(gathering, 2);
}

}  // namespace
}  // namespace cubist::testing
