// MoeLayer (dispatch/moe_layer.h) without a GPU: a real manifest and cubin (the stub
// kernels of tests/fixtures/dispatch/moe_stub.cu, by the layer's published names), the
// real store, module cache and GEMM selection, and the loader's fake driver extended to
// record every launch with its parameter struct. What the layer computes is checked on
// the H200 (tests/dispatch/moe_layer_gpu_test.cc); this checks how the steps are wired: which kernels run
// in which order, and that each reads what the previous one wrote.
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/sha256.h"
#include "base/strings.h"
#include "dispatch/moe_layer.h"
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

using ::cubist::testing::LaunchRecordingDriver;
using ::cubist::testing::KernelJson;
using ::cubist::testing::ReadFileOrDie;
using ::cubist::testing::StatusIs;
using ::cubist::testing::TempDir;
using ::cubist::testing::TestKernel;
using ::cubist::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The parameter struct of each kernel the layer launches, by its published name.
size_t LayerParamBytes(std::string_view name) {
  if (name == "cubist_moe_route") return sizeof(moe::MoeRouteParams);
  if (name == "cubist_moe_route_sort") return sizeof(moe::MoeRouteSortParams);
  if (name.ends_with("_masked")) return sizeof(moe::MoeMaskedParams);
  if (name.starts_with("cubist_moe_sort_")) return sizeof(moe::MoeSortParams);
  if (name == "cubist_moe_gather_bf16") return sizeof(moe::MoeGatherParams);
  if (name == "cubist_moe_finalize") return sizeof(moe::MoeFinalizeParams);
  if (name.starts_with("cubist_moe_quantize_")) return sizeof(moe::MoeQuantizeParams);
  return sizeof(moe::MoeGemmParamsV2);  // the GEMM stubs (version 3)
}

constexpr char kStubPath[] = "cubins/sm_90a/moe_stub.cubin";

struct Pair {
  const char* weights;
  const char* activations;
  DataFormat w, a;
  const char* stub;  // its GEMM stubs: layer_<stub>_<activation>
};
constexpr Pair kPairs[] = {
    {"bf16", "bf16", DataFormat::kBf16, DataFormat::kBf16, "bf16_bf16"},
    {"fp8", "fp8", DataFormat::kFp8, DataFormat::kFp8, "fp8_fp8"},
    {"fp8-block", "fp8-block", DataFormat::kFp8Block, DataFormat::kFp8Block,
     "fp8_block_fp8_block"},
    {"mxfp4", "bf16", DataFormat::kMxfp4, DataFormat::kBf16, "mxfp4_bf16"},
    {"mxfp4", "mxfp8", DataFormat::kMxfp4, DataFormat::kMxfp8, "mxfp4_mxfp8"},
    {"nvfp4", "bf16", DataFormat::kNvfp4, DataFormat::kBf16, "nvfp4_bf16"},
    {"nvfp4", "nvfp4", DataFormat::kNvfp4, DataFormat::kNvfp4, "nvfp4_nvfp4"},
};

// The glue kernels as scripts/build-artifacts publishes them, and one version-3 GEMM stub
// per pair and activation (GEMM1 SwiGLU, GEMM2 identity). The GEMM stubs say "pdl" (they
// wait for the previous grid), except bf16's identity one, like a kernel built before.
std::vector<TestKernel> LayerKernels() {
  std::vector<TestKernel> v;
  const std::pair<const char*, const char*> glue[] = {
      {"cubist_moe_route", "moe_route"},
      {"cubist_moe_route_sort", "moe_route"},
      {"cubist_moe_sort_fused", "moe_sort"},
      {"cubist_moe_sort_count", "moe_sort"},
      {"cubist_moe_sort_scan", "moe_sort"},
      {"cubist_moe_sort_scatter", "moe_sort"},
      {"cubist_moe_gather_bf16", "moe_gather"},
      {"cubist_moe_finalize", "moe_finalize"},
      {"cubist_moe_quantize_fp8", "moe_quantize"},
      {"cubist_moe_quantize_fp8_block", "moe_quantize"},
      {"cubist_moe_quantize_mxfp8", "moe_quantize"},
      {"cubist_moe_quantize_nvfp4", "moe_quantize"},
      {"cubist_moe_quantize_nvfp4_decoded", "moe_quantize"},
      {"cubist_moe_sort_masked", "moe_sort"},
      {"cubist_moe_finalize_masked", "moe_finalize"},
  };
  for (const auto& [function, op] : glue) {
    TestKernel k;
    k.name = function;
    k.artifact = kStubPath;
    k.op = op;
    k.abi = moe::kMoeLayerAbi;
    k.activation = "identity";
    k.tile_m = k.tile_n = k.tile_k = 1;
    k.threads = 128;
    k.shared_mem_bytes = 0;
    v.push_back(k);
  }
  for (const Pair& p : kPairs) {
    for (const char* act : {"identity", "swiglu"}) {
      TestKernel k;
      k.name = absl::StrCat("layer_", p.stub, "_", act);
      k.artifact = kStubPath;
      k.weight_format = p.weights;
      k.activation_format = p.activations;
      k.activation = act;
      k.tile_k = p.w == DataFormat::kBf16 ? 64 : 128;
      k.threads = 128;
      k.shared_mem_bytes = 100000;
      if (k.name != "layer_bf16_bf16_identity") k.extras = "\"pdl\": true";
      v.push_back(k);
    }
  }
  return v;
}

// Made-up device addresses, far apart and 256-byte aligned.
constexpr CUdeviceptr kHidden = 0x1000000, kLogits = 0x2000000, kW1 = 0x3000000,
                      kW2 = 0x4000000, kW1Scale = 0x5000000, kW2Scale = 0x5800000,
                      kW1Global = 0x6000000, kW2Global = 0x6100000, kInputScale = 0x6200000,
                      kIntermediateScale = 0x6300000, kOut = 0x7000000,
                      kWorkspace = 0x10000000, kIds = 0x8000000, kWeights = 0x9000000,
                      kCounts = 0xA000000;

template <typename T>
CUdeviceptr Addr(T* p) {
  return reinterpret_cast<CUdeviceptr>(p);
}

class MoeLayerFakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef CUBIST_DISPATCH_STUB_CUBIN
    GTEST_SKIP() << "no nvcc at build time: the stub cubin was not built";
#else
    auto rt = OpenRuntime("repo", LayerKernels());
    ASSERT_TRUE(rt.ok()) << rt.status();
    runtime_ = std::move(*rt);
#endif
  }

#ifdef CUBIST_DISPATCH_STUB_CUBIN
  // A runtime on a manifest of `kernels` in the stub cubin, under dir_/<repo>.
  absl::StatusOr<std::unique_ptr<Runtime>> OpenRuntime(const std::string& repo,
                                                       const std::vector<TestKernel>& kernels) {
    const std::string cubin = ReadFileOrDie(CUBIST_DISPATCH_STUB_CUBIN);
    WriteFileOrDie(dir_.Join(repo + "/" + kStubPath), cubin);
    std::vector<std::string> ks;
    for (const TestKernel& k : kernels) ks.push_back(KernelJson(k));
    const std::string manifest = dir_.Join(repo + "/manifest.json");
    WriteFileOrDie(manifest,
                   absl::StrCat(R"({"schema": "cubist.manifest/1", "name": "stub", "version": 1,
  "artifacts": [{"path": ")",
                                kStubPath, R"(", "sha256": ")", Sha256Hex(cubin),
                                R"(", "size": )", cubin.size(), R"(}],
  "kernels": [)",
                                absl::StrJoin(ks, ",\n"), "]}\n"));
    RuntimeOptions options;
    options.manifest = manifest;
    options.cache_dir = dir_.Join("cache");
    options.tuning_file = dir_.Join(repo + "-tuning.json");
    options.driver = &driver_;
    return Runtime::Open(options);
  }
#endif

  // Qwen3-30B-A3B's shape, scaled down.
  static MoeLayerOptions Options(const Pair& p) {
    MoeLayerOptions o;
    o.weight_format = p.w;
    o.activation_format = p.a;
    o.num_experts = 16;
    o.top_k = 4;
    o.hidden = 256;
    o.intermediate = 128;
    return o;
  }

  static MoeLayerArgs Args(const MoeLayerOptions& o, int64_t tokens, size_t workspace_bytes) {
    MoeLayerArgs a;
    a.tokens = tokens;
    a.hidden_states = kHidden;
    a.router_logits = kLogits;
    a.w1 = kW1;
    a.w2 = kW2;
    if (moe::FormatScaleBlock(o.weight_format) != 0) {
      a.w1_scale = kW1Scale;
      a.w2_scale = kW2Scale;
    }
    if (moe::FormatHasGlobalScale(o.weight_format)) {
      a.w1_global_scale = kW1Global;
      a.w2_global_scale = kW2Global;
    }
    if (moe::FormatHasGlobalScale(o.activation_format)) {
      a.input_scale = kInputScale;
      a.intermediate_scale = kIntermediateScale;
    }
    a.out = kOut;
    a.workspace = kWorkspace;
    a.workspace_bytes = workspace_bytes;
    return a;
  }

  // The route's and the sort's parameters of a pass of `tokens` tokens (Options: E = 16,
  // k = 4) whose workspace starts at ws, laid out as w.
  static void ExpectRouteWiring(const moe::MoeRouteParams& route, int tokens, CUdeviceptr ws,
                                const MoeLayerWorkspace& w) {
    EXPECT_EQ(route.num_tokens, tokens);
    EXPECT_EQ(route.num_experts, 16);
    EXPECT_EQ(route.top_k, 4);
    EXPECT_EQ(Addr(route.logits), kLogits);
    EXPECT_EQ(Addr(route.topk_ids), ws + w.topk_ids);
    EXPECT_EQ(Addr(route.topk_weights), ws + w.topk_weights);
  }
  static void ExpectSortWiring(const moe::MoeSortParams& sort, int slots, CUdeviceptr ws,
                               const MoeLayerWorkspace& w) {
    EXPECT_EQ(sort.num_slots, slots);
    EXPECT_EQ(sort.num_local_experts, 16);
    EXPECT_EQ(Addr(sort.topk_ids), ws + w.topk_ids);
    EXPECT_EQ(Addr(sort.offsets), ws + w.offsets);
    EXPECT_EQ(Addr(sort.permuted_to_expanded), ws + w.permuted_to_expanded);
    EXPECT_EQ(Addr(sort.expanded_to_permuted), ws + w.expanded_to_permuted);
    EXPECT_EQ(Addr(sort.dropped), ws + w.dropped);
  }

  // The expert-major masked layout: L = 16 experts of max_m = 8 rows each, no routing.
  static MoeLayerOptions MaskedOptions(const Pair& p) {
    MoeLayerOptions o = Options(p);
    o.top_k = 0;
    o.input_layout = "expert_major_masked";
    o.max_m = 8;
    return o;
  }

  static MoeLayerArgs MaskedArgs(const MoeLayerOptions& o, size_t workspace_bytes) {
    MoeLayerArgs a = Args(o, 16 * 8, workspace_bytes);
    a.router_logits = 0;
    a.masked_counts = kCounts;
    return a;
  }

  // The pair's quantize kernel and its GEMM1 and GEMM2 stubs, by name.
  static std::tuple<std::string, std::string, std::string> StepNames(const Pair& pair) {
    return {absl::StrCat("cubist_moe_quantize_", pair.a == DataFormat::kFp8Block
                                                     ? "fp8_block"
                                                     : Sv(DataFormatName(pair.a))),
            absl::StrCat("layer_", pair.stub, "_swiglu"),
            absl::StrCat("layer_", pair.stub, "_identity")};
  }

  // Creates the layer of `o` on runtime_ and runs one batch of `tokens` tokens, its
  // workspace sized for that batch: `w` gets the layout, launches() what it launched,
  // and `kept` (when given) the layer.
  void RunBatch(const MoeLayerOptions& o, int64_t tokens, MoeLayerWorkspace* w,
                std::unique_ptr<MoeLayer>* kept = nullptr) {
    auto layer = MoeLayer::Create(*runtime_, o);
    ASSERT_TRUE(layer.ok()) << layer.status();
    auto layout = MoeLayer::WorkspaceLayout(o, tokens);
    ASSERT_TRUE(layout.ok()) << layout.status();
    *w = *layout;
    const MoeLayerArgs a = Args(o, tokens, w->bytes);
    CUBIST_ASSERT_OK((*layer)->CanImplement(a, tokens));
    CUBIST_ASSERT_OK((*layer)->Run(a, nullptr));
    if (kept != nullptr) *kept = std::move(*layer);
  }

  // Replaces runtime_ with one on LayerKernels() and `extra`, under dir_/<repo>.
  void UseKernelsAnd(const std::string& repo, const TestKernel& extra) {
#ifdef CUBIST_DISPATCH_STUB_CUBIN
    std::vector<TestKernel> kernels = LayerKernels();
    kernels.push_back(extra);
    auto rt = OpenRuntime(repo, kernels);
    ASSERT_TRUE(rt.ok()) << rt.status();
    runtime_ = std::move(*rt);
#endif
  }

  static std::vector<std::string> Names(const std::vector<LaunchRecordingDriver::Launch>& v) {
    std::vector<std::string> out;
    for (const auto& l : v) out.push_back(l.name);
    return out;
  }

  TempDir dir_;
  LaunchRecordingDriver driver_{LayerParamBytes};
  std::unique_ptr<Runtime> runtime_;
};

TEST_F(MoeLayerFakeDriverTest, EveryPairWiresEachStepToTheNext) {
  for (const Pair& pair : kPairs) {
    SCOPED_TRACE(absl::StrCat(pair.weights, " x ", pair.activations));
    driver_.Clear();
    const MoeLayerOptions o = Options(pair);
    auto layer = MoeLayer::Create(*runtime_, o);
    ASSERT_TRUE(layer.ok()) << layer.status();
    const int64_t tokens = 5, max_tokens = 64;
    auto w = MoeLayer::WorkspaceLayout(o, max_tokens);
    ASSERT_TRUE(w.ok()) << w.status();
    const MoeLayerArgs a = Args(o, tokens, w->bytes);
    CUBIST_ASSERT_OK((*layer)->CanImplement(a, max_tokens));
    EXPECT_TRUE(driver_.launches().empty()) << "CanImplement launches nothing";
    CUBIST_ASSERT_OK((*layer)->Run(a, nullptr));

    // Run sizes its workspace for this batch: rows = 32 (the smallest bucket >= 5 x 4).
    auto pass = MoeLayer::WorkspaceLayout(o, tokens);
    ASSERT_TRUE(pass.ok());
    const CUdeviceptr ws = kWorkspace;
    const bool quantized = pair.a != DataFormat::kBf16;
    const auto [quantize, gemm1, gemm2] = StepNames(pair);
    const auto launches = driver_.launches();
    // Five tokens: decode's route and sort in one launch.
    if (quantized) {
      ASSERT_THAT(Names(launches), ElementsAre("cubist_moe_route_sort", quantize, gemm1,
                                               quantize, gemm2, "cubist_moe_finalize"));
    } else {
      ASSERT_THAT(Names(launches),
                  ElementsAre("cubist_moe_route_sort", "cubist_moe_gather_bf16", gemm1, gemm2,
                              "cubist_moe_finalize"));
    }
    const auto both = launches[0].As<moe::MoeRouteSortParams>();
    ExpectRouteWiring(both.route, 5, ws, *pass);
    ExpectSortWiring(both.sort, 20, ws, *pass);
    EXPECT_EQ(launches[0].config.gridDimX, 1u);
    EXPECT_EQ(launches[0].config.blockDimX, static_cast<unsigned>(moe::kMoeSortThreads));
    EXPECT_EQ(launches[0].config.sharedMemBytes, 5u * 16 * 4) << "a token's scores per warp";

    // GEMM1's input: gathered (and quantized on the way) from hidden_states.
    CUdeviceptr gathered_out = 0, gathered_scale = 0;
    if (quantized) {
      const auto q = launches[1].As<moe::MoeQuantizeParams>();
      EXPECT_EQ(q.cols, 256);
      EXPECT_EQ(q.top_k, 4);
      EXPECT_EQ(q.col_parts, 1) << "one pass a row: nothing to split";
      EXPECT_EQ(launches[1].config.gridDimX, 20u) << "a CTA per slot";
      EXPECT_EQ(Addr(q.input), kHidden);
      EXPECT_EQ(Addr(q.offsets), ws + pass->offsets);
      EXPECT_EQ(Addr(q.permuted_to_expanded), ws + pass->permuted_to_expanded);
      EXPECT_EQ(q.weights, nullptr);
      EXPECT_EQ(Addr(q.scale), moe::FormatHasGlobalScale(pair.a) ? kInputScale : 0);
      EXPECT_EQ(Addr(q.global_out),
                pair.a == DataFormat::kNvfp4 ? ws + pass->global_scales : 0);
      gathered_out = Addr(q.out);
      gathered_scale = Addr(q.out_scale);
    } else {
      const auto g = launches[1].As<moe::MoeGatherParams>();
      EXPECT_EQ(g.hidden, 256);
      EXPECT_EQ(Addr(g.input), kHidden);
      EXPECT_EQ(Addr(g.offsets), ws + pass->offsets);
      gathered_out = Addr(g.out);
    }
    EXPECT_EQ(gathered_out, ws + pass->gathered);

    const auto g1 = launches[2].gemm();
    EXPECT_EQ(g1.num_experts, 16);
    // The row bucket (32) picks the kernel; the launch bounds rows by the T x k slots.
    EXPECT_EQ(pass->row_capacity, 32);
    EXPECT_EQ(g1.num_tokens, 20) << "T x k, not the row bucket";
    EXPECT_EQ(launches[launches.size() - 2].gemm().num_tokens, 20) << "GEMM2 too";
    EXPECT_EQ(g1.n, 256) << "2I rows: gated";
    EXPECT_EQ(g1.k, 256);
    EXPECT_EQ(Addr(g1.a), gathered_out);
    EXPECT_EQ(Addr(g1.b), kW1);
    EXPECT_EQ(Addr(g1.offsets), ws + pass->offsets);
    EXPECT_EQ(Addr(g1.out), ws + pass->activated);
    if (moe::FormatScaleBlock(pair.a) != 0) {
      EXPECT_EQ(Addr(g1.a_scale), gathered_scale);
      EXPECT_EQ(gathered_scale, ws + pass->gathered_scale);
    } else {
      EXPECT_EQ(g1.a_scale, nullptr);
    }
    EXPECT_EQ(Addr(g1.b_scale), moe::FormatScaleBlock(pair.w) != 0 ? kW1Scale : 0);
    EXPECT_EQ(Addr(g1.b_global_scale), moe::FormatHasGlobalScale(pair.w) ? kW1Global : 0);
    const CUdeviceptr a1_global = pair.a == DataFormat::kFp8     ? kInputScale
                                  : pair.a == DataFormat::kNvfp4 ? ws + pass->global_scales
                                                                 : 0;
    EXPECT_EQ(Addr(g1.a_global_scale), a1_global);
    // A gather or quantize kernel sits between the sort and GEMM1: its offsets and
    // weights may be read before its grid-dependency wait.
    EXPECT_EQ(g1.flags, moe::kMoeGemmFlagSettledInputs);

    // GEMM2's input: GEMM1's output, quantized into its own array first.
    const size_t gemm2_at = quantized ? 4 : 3;
    CUdeviceptr gemm2_input = ws + pass->activated;
    if (quantized) {
      const auto q = launches[3].As<moe::MoeQuantizeParams>();
      EXPECT_EQ(q.cols, 128);
      EXPECT_EQ(q.top_k, 0);
      EXPECT_EQ(Addr(q.input), ws + pass->activated);
      EXPECT_EQ(q.permuted_to_expanded, nullptr);
      EXPECT_EQ(Addr(q.scale), moe::FormatHasGlobalScale(pair.a) ? kIntermediateScale : 0);
      EXPECT_EQ(Addr(q.out), ws + pass->quantized);
      EXPECT_EQ(Addr(q.out_scale), ws + pass->quantized_scale);
      EXPECT_EQ(Addr(q.global_out),
                pair.a == DataFormat::kNvfp4 ? ws + pass->global_scales + 4 : 0);
      gemm2_input = ws + pass->quantized;
    }
    const auto g2 = launches[gemm2_at].gemm();
    EXPECT_EQ(g2.n, 256);
    EXPECT_EQ(g2.k, 128);
    EXPECT_EQ(Addr(g2.a), gemm2_input);
    EXPECT_EQ(Addr(g2.b), kW2);
    EXPECT_EQ(Addr(g2.out), ws + pass->rows);
    EXPECT_EQ(Addr(g2.a_scale),
              moe::FormatScaleBlock(pair.a) != 0 ? ws + pass->quantized_scale : 0);
    EXPECT_EQ(Addr(g2.b_scale), moe::FormatScaleBlock(pair.w) != 0 ? kW2Scale : 0);
    const CUdeviceptr a2_global = pair.a == DataFormat::kFp8 ? kIntermediateScale
                                  : pair.a == DataFormat::kNvfp4
                                      ? ws + pass->global_scales + 4
                                      : 0;
    EXPECT_EQ(Addr(g2.a_global_scale), a2_global);
    EXPECT_EQ(g2.alpha, nullptr) << "GEMM2 is identity";
    EXPECT_EQ(g2.flags, moe::kMoeGemmFlagSettledInputs);

    const auto f = launches.back().As<moe::MoeFinalizeParams>();
    EXPECT_EQ(f.num_tokens, 5);
    EXPECT_EQ(f.hidden, 256);
    EXPECT_EQ(Addr(f.rows), ws + pass->rows);
    EXPECT_EQ(Addr(f.topk_ids), ws + pass->topk_ids);
    EXPECT_EQ(Addr(f.topk_weights), ws + pass->topk_weights);
    EXPECT_EQ(Addr(f.expanded_to_permuted), ws + pass->expanded_to_permuted);
    EXPECT_EQ(Addr(f.out), kOut);
    EXPECT_EQ(launches.back().config.gridDimX, 5u) << "a CTA per token";
  }
}

TEST_F(MoeLayerFakeDriverTest, ChunkedPreRoutedPassesStepThroughTheBatch) {
  MoeLayerOptions o = Options(kPairs[0]);
  o.max_chunk_tokens = 4;
  o.finalize = "sum";
  auto layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto w = MoeLayer::WorkspaceLayout(o, 10);
  ASSERT_TRUE(w.ok());
  MoeLayerArgs a = Args(o, 10, w->bytes);
  a.router_logits = 0;
  a.topk_ids = kIds;
  a.topk_weights = kWeights;
  a.accumulate = true;
  CUBIST_ASSERT_OK((*layer)->CanImplement(a, 10));
  CUBIST_ASSERT_OK((*layer)->Run(a, nullptr));
  const auto launches = driver_.launches();
  // Three passes (4 + 4 + 2 tokens), no routing: sort, gather, GEMM, GEMM, finalize each.
  ASSERT_EQ(launches.size(), 15u);
  for (int pass = 0; pass < 3; ++pass) {
    SCOPED_TRACE(pass);
    const int64_t first = 4 * pass, tokens = pass < 2 ? 4 : 2;
    const auto& l = launches;
    EXPECT_EQ(l[5 * pass].name, "cubist_moe_sort_fused");
    const auto s = l[5 * pass].As<moe::MoeSortParams>();
    EXPECT_EQ(s.num_slots, tokens * 4);
    EXPECT_EQ(Addr(s.topk_ids), kIds + 4 * first * 4);
    EXPECT_EQ(Addr(s.offsets), kWorkspace + w->offsets) << "every pass shares one layout";
    const auto g = l[5 * pass + 1].As<moe::MoeGatherParams>();
    EXPECT_EQ(Addr(g.input), kHidden + 2 * first * 256);
    const auto g1 = l[5 * pass + 2].gemm();
    EXPECT_EQ(g1.num_tokens, tokens * 4) << "this pass's slots";
    const auto f = l[5 * pass + 4].As<moe::MoeFinalizeParams>();
    EXPECT_EQ(f.num_tokens, tokens);
    EXPECT_EQ(f.accumulate, 1);
    EXPECT_EQ(Addr(f.topk_ids), kIds + 4 * first * 4);
    EXPECT_EQ(Addr(f.topk_weights), kWeights + 4 * first * 4);
    EXPECT_EQ(Addr(f.out), kOut + 2 * first * 256);
  }
}

// The finalize's grid: S CTAs per token while the columns give each of their threads a
// vector and S x T fits twice the SMs, else one per token.
TEST(MoeFinalizeCtasTest, SplitsWideRowsAtSmallBatches) {
  EXPECT_EQ(moe::MoeFinalizeCtas(1, 7168, 132), 7) << "896 vectors: 7 CTAs of 128 threads";
  EXPECT_EQ(moe::MoeFinalizeCtas(37, 7168, 132), 7 * 37);
  EXPECT_EQ(moe::MoeFinalizeCtas(38, 7168, 132), 6 * 38) << "264 / 38 = 6 parts fit";
  EXPECT_EQ(moe::MoeFinalizeCtas(132, 7168, 132), 2 * 132);
  EXPECT_EQ(moe::MoeFinalizeCtas(133, 7168, 132), 133) << "one part: a CTA per token";
  EXPECT_EQ(moe::MoeFinalizeCtas(1, 1032, 132), 2) << "129 vectors";
  EXPECT_EQ(moe::MoeFinalizeCtas(5, 256, 132), 5) << "32 vectors: one CTA's threads";
  EXPECT_EQ(moe::MoeFinalizeCtas(0, 7168, 132), 0);
}

// The quantize kernels' grid: a row's passes (1,024 columns each) over S CTAs while S x
// rows fits twice the SMs, else whole rows.
TEST(MoeQuantizePartsTest, SplitsLongRowsAtSmallBatches) {
  EXPECT_EQ(moe::MoeQuantizeParts(2, 14336, 132), 14) << "Mixtral's intermediate, one token";
  EXPECT_EQ(moe::MoeQuantizeParts(4, 2880, 132), 3) << "gpt-oss, one token: 3 passes";
  EXPECT_EQ(moe::MoeQuantizeParts(8, 7168, 132), 7) << "DeepSeek-V3's hidden, one token";
  EXPECT_EQ(moe::MoeQuantizeParts(64, 7168, 132), 4) << "264 / 64 = 4 parts fit";
  EXPECT_EQ(moe::MoeQuantizeParts(132, 7168, 132), 2);
  EXPECT_EQ(moe::MoeQuantizeParts(133, 7168, 132), 1) << "a CTA per row";
  EXPECT_EQ(moe::MoeQuantizeParts(1, 1024, 132), 1) << "one pass";
  EXPECT_EQ(moe::MoeQuantizeParts(1, 1040, 132), 2) << "a second, partial pass";
  EXPECT_EQ(moe::MoeQuantizeParts(0, 7168, 132), 1);
}

// Past decode's limits (here more than 32 tokens) routing and the sort are two launches
// wired as the fused one is.
TEST_F(MoeLayerFakeDriverTest, LargerBatchesRouteAndSortInTwoLaunches) {
  MoeLayerWorkspace w;
  ASSERT_NO_FATAL_FAILURE(RunBatch(Options(kPairs[0]), 40, &w));
  const auto launches = driver_.launches();
  ASSERT_THAT(Names(launches),
              ElementsAre("cubist_moe_route", "cubist_moe_sort_fused", "cubist_moe_gather_bf16",
                          "layer_bf16_bf16_swiglu", "layer_bf16_bf16_identity",
                          "cubist_moe_finalize"));
  ExpectRouteWiring(launches[0].As<moe::MoeRouteParams>(), 40, kWorkspace, w);
  EXPECT_EQ(launches[0].config.gridDimX, 10u) << "a warp per token, 4 per CTA";
  EXPECT_EQ(launches[0].config.sharedMemBytes, static_cast<unsigned>(moe::MoeRouteSharedBytes(16)));
  ExpectSortWiring(launches[1].As<moe::MoeSortParams>(), 160, kWorkspace, w);
}

// A manifest published before the fused kernel: decode takes the two launches, and
// nothing else changes.
TEST_F(MoeLayerFakeDriverTest, WithoutTheFusedKernelDecodeRoutesAndSortsInTwoLaunches) {
  std::vector<TestKernel> kernels = LayerKernels();
  std::erase_if(kernels, [](const TestKernel& k) { return k.name == "cubist_moe_route_sort"; });
  auto rt = OpenRuntime("repo-without-route-sort", kernels);
  ASSERT_TRUE(rt.ok()) << rt.status();
  runtime_ = std::move(*rt);
  MoeLayerWorkspace w;
  ASSERT_NO_FATAL_FAILURE(RunBatch(Options(kPairs[0]), 5, &w));
  const auto launches = driver_.launches();
  ASSERT_THAT(Names(launches),
              ElementsAre("cubist_moe_route", "cubist_moe_sort_fused", "cubist_moe_gather_bf16",
                          "layer_bf16_bf16_swiglu", "layer_bf16_bf16_identity",
                          "cubist_moe_finalize"));
  ExpectRouteWiring(launches[0].As<moe::MoeRouteParams>(), 5, kWorkspace, w);
  ExpectSortWiring(launches[1].As<moe::MoeSortParams>(), 20, kWorkspace, w);
}

// A SwiGLU GEMM1 stub of `format` x `format` beside the pair's own, as
// scripts/build-artifacts describes such a kernel: parameter struct `abi`, `extras`.
TestKernel Gemm1Stub(const char* name, const char* format, int tile_k, int abi,
                     const char* extras) {
  TestKernel k;
  k.name = name;
  k.artifact = kStubPath;
  k.weight_format = k.activation_format = format;
  k.activation = "swiglu";
  k.tile_k = tile_k;
  k.threads = 128;
  k.shared_mem_bytes = 100000;
  k.abi = abi;
  k.extras = extras;
  return k;
}

// The fp8 pair's GEMM1 writing e4m3 itself (version 4; build-artifacts' _ofp8 kernels).
TestKernel FusedGemm1Stub() {
  return Gemm1Stub("layer_fp8_fp8_swiglu_ofp8", "fp8", 128, moe::kMoeGemmAbiV4,
                   "\"pdl\": true, \"output_format\": \"fp8\", \"n_multiple\": 32");
}

// With an fp8-output GEMM1 in the manifest, "auto" and "on" fuse the intermediate's
// quantization into GEMM1: it writes GEMM2's input (the `quantized` array) with the
// caller's intermediate_scale as out_scale, and no quantize kernel runs between the GEMMs;
// "off" keeps the bf16 GEMM1 (never the fp8-output one) and the quantize kernel.
TEST_F(MoeLayerFakeDriverTest, FusedQuantizationWritesGemm2sInputFromGemm1) {
  ASSERT_NO_FATAL_FAILURE(UseKernelsAnd("repo-fused", FusedGemm1Stub()));
  const Pair& fp8 = kPairs[1];
  const auto [quantize, gemm1, gemm2] = StepNames(fp8);
  for (const char* mode : {"auto", "on", "off"}) {
    SCOPED_TRACE(mode);
    driver_.Clear();
    MoeLayerOptions o = Options(fp8);
    o.fuse_intermediate_quantization = mode;
    MoeLayerWorkspace layout;
    std::unique_ptr<MoeLayer> layer;
    ASSERT_NO_FATAL_FAILURE(RunBatch(o, 5, &layout, &layer));
    const MoeLayerWorkspace* w = &layout;
    const bool fused = std::string_view(mode) != "off";
    EXPECT_EQ(layer->fuses_intermediate_quantization(), fused);
    const auto launches = driver_.launches();
    const CUdeviceptr ws = kWorkspace;
    if (!fused) {
      ASSERT_THAT(Names(launches), ElementsAre("cubist_moe_route_sort", quantize, gemm1,
                                               quantize, gemm2, "cubist_moe_finalize"));
      const auto g1 = launches[2].gemm();
      EXPECT_EQ(Addr(g1.out), ws + w->activated);
      EXPECT_EQ(g1.out_scale, nullptr);
      EXPECT_EQ(g1.abi, moe::kMoeGemmAbi) << "the stub's version";
      EXPECT_EQ(Addr(launches[3].As<moe::MoeQuantizeParams>().input), ws + w->activated);
      continue;
    }
    ASSERT_THAT(Names(launches),
                ElementsAre("cubist_moe_route_sort", quantize, "layer_fp8_fp8_swiglu_ofp8",
                            gemm2, "cubist_moe_finalize"));
    const auto g1 = launches[2].gemm();
    const auto g2 = launches[3].gemm();
    EXPECT_EQ(g1.abi, moe::kMoeGemmAbiV4);
    EXPECT_EQ(g1.n, 256);
    EXPECT_EQ(Addr(g1.a), ws + w->gathered);
    EXPECT_EQ(Addr(g1.a_global_scale), kInputScale);
    EXPECT_EQ(Addr(g1.out), ws + w->quantized) << "GEMM1 writes GEMM2's input";
    EXPECT_EQ(Addr(g1.out_scale), kIntermediateScale);
    EXPECT_EQ(Addr(g2.a), Addr(g1.out));
    EXPECT_EQ(Addr(g2.a_global_scale), kIntermediateScale) << "GEMM2 dequantizes with it";
    EXPECT_EQ(g2.out_scale, nullptr) << "GEMM2 writes bf16";
    EXPECT_EQ(Addr(g2.out), ws + w->rows);
  }
}

// The bf16 pair's GEMM1 gathering A itself (version 5; build-artifacts' _gather kernels).
TestKernel GatherGemm1Stub() {
  return Gemm1Stub("layer_bf16_bf16_swiglu_gather", "bf16", 64, moe::kMoeGemmAbiV5,
                   "\"pdl\": true, \"a_gather\": true");
}

// With a gathering GEMM1 in the manifest, "auto" and "on" leave the gather kernel out:
// GEMM1 reads hidden_states (the pass's rows) through the sort's row map, token = entry /
// top_k; "off" (and a layer that applies the routing weight on input, whose rows the
// gather kernel scales) keeps the gather kernel and the GEMM1 reading rows in order. The
// masked layout's row map is the row itself: divisor 1, L x max_m rows.
TEST_F(MoeLayerFakeDriverTest, FusedGatherFeedsGemm1TheHiddenStatesThroughTheRowMap) {
  ASSERT_NO_FATAL_FAILURE(UseKernelsAnd("repo-gather", GatherGemm1Stub()));
  const Pair& bf16 = kPairs[0];
  const auto [quantize, gemm1, gemm2] = StepNames(bf16);
  for (const char* mode : {"auto", "on", "off"}) {
    SCOPED_TRACE(mode);
    driver_.Clear();
    MoeLayerOptions o = Options(bf16);
    o.fuse_gather = mode;
    MoeLayerWorkspace layout;
    std::unique_ptr<MoeLayer> layer;
    ASSERT_NO_FATAL_FAILURE(RunBatch(o, 5, &layout, &layer));
    const MoeLayerWorkspace* w = &layout;
    const bool fused = std::string_view(mode) != "off";
    EXPECT_EQ(layer->fuses_gather(), fused);
    const auto launches = driver_.launches();
    const CUdeviceptr ws = kWorkspace;
    if (!fused) {
      ASSERT_THAT(Names(launches), ElementsAre("cubist_moe_route_sort", "cubist_moe_gather_bf16",
                                               gemm1, gemm2, "cubist_moe_finalize"));
      const auto g1 = launches[2].gemm();
      EXPECT_EQ(Addr(g1.a), ws + w->gathered);
      EXPECT_EQ(g1.a_row_map, nullptr);
      EXPECT_EQ(g1.a_row_divisor, 0) << "a version-3 kernel's padding stays zero";
      EXPECT_EQ(g1.flags, moe::kMoeGemmFlagSettledInputs);
      continue;
    }
    ASSERT_THAT(Names(launches), ElementsAre("cubist_moe_route_sort",
                                             "layer_bf16_bf16_swiglu_gather", gemm2,
                                             "cubist_moe_finalize"));
    const auto g1 = launches[1].gemm();
    const auto g2 = launches[2].gemm();
    EXPECT_EQ(g1.abi, moe::kMoeGemmAbiV5);
    EXPECT_EQ(Addr(g1.a), kHidden) << "the token rows where they are";
    EXPECT_EQ(Addr(g1.a_row_map), ws + w->permuted_to_expanded);
    EXPECT_EQ(g1.a_row_divisor, 4) << "top_k: expanded index = token x k + slot";
    EXPECT_EQ(g1.a_rows, 5);
    EXPECT_EQ(g1.num_tokens, 20) << "the routed rows";
    EXPECT_EQ(Addr(g1.out), ws + w->activated);
    EXPECT_EQ(Addr(g2.a), ws + w->activated);
    EXPECT_EQ(g2.a_row_map, nullptr) << "GEMM2 reads GEMM1's rows in order";
    // GEMM1 follows the sort directly: its offsets are not settled before its wait.
    EXPECT_EQ(g1.flags, 0);
    EXPECT_EQ(g2.flags, moe::kMoeGemmFlagSettledInputs);
  }

  // Weights applied on input scale the rows in the gather kernel: "auto" keeps it.
  driver_.Clear();
  MoeLayerOptions o = Options(bf16);
  o.num_experts = 16;
  o.top_k = 1;
  o.routing_method = "llama4";
  o.apply_weight_on_input = true;
  auto layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_FALSE((*layer)->fuses_gather());

  // The masked layout: GEMM1 reads hidden_states' row map[r] itself (divisor 1).
  driver_.Clear();
  o = MaskedOptions(bf16);
  layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  ASSERT_TRUE((*layer)->fuses_gather());
  auto w = MoeLayer::WorkspaceLayout(o, 0);
  ASSERT_TRUE(w.ok()) << w.status();
  const MoeLayerArgs a = MaskedArgs(o, w->bytes);
  CUBIST_ASSERT_OK((*layer)->CanImplement(a, 0));
  CUBIST_ASSERT_OK((*layer)->Run(a, nullptr));
  const auto launches = driver_.launches();
  ASSERT_THAT(Names(launches), ElementsAre("cubist_moe_sort_masked",
                                           "layer_bf16_bf16_swiglu_gather", gemm2,
                                           "cubist_moe_finalize_masked"));
  const auto g1 = launches[1].gemm();
  EXPECT_EQ(Addr(g1.a), kHidden);
  EXPECT_EQ(Addr(g1.a_row_map), kWorkspace + w->permuted_to_expanded);
  EXPECT_EQ(g1.a_row_divisor, 1);
  EXPECT_EQ(g1.a_rows, 128) << "L x max_m";
}

// Without a gathering GEMM1, "auto" keeps the gather kernel and "on" fails CanImplement
// naming the gather; "on" is refused up front where GEMM1 cannot read the rows as they
// are (a quantized pair, weights on input), and an unknown mode names the three.
// The layer's GEMMs are posed as routed problems (top_k of num_experts), so the cost
// model prices each expert's binomial rows: with bf16 GEMM2 stubs of the family's 64x256
// and 128x256 tiles, Qwen3-30B-A3B at 4,096 tokens (256 rows per expert on average)
// takes the 64-row tile, where the same rows spread evenly - MoeGemm's own assumption -
// take the 128-row one. Under expert parallelism the router's experts are the model's.
TEST_F(MoeLayerFakeDriverTest, GemmsArePricedForTheRoutersSpreadOfRows) {
  std::vector<TestKernel> kernels = LayerKernels();
  for (TestKernel& k : kernels) {
    if (k.name != "layer_bf16_bf16_identity") continue;
    k.tile_n = 256;
    k.threads = 256;
    k.shared_mem_bytes = 223488;
    k.extras = "\"pdl\": true, \"mma_efficiency\": 0.95, \"memory_efficiency\": 0.85";
    TestKernel tall = k;
    tall.name = "layer_bf16_bf16_identity_m128";
    tall.artifact = kStubPath;
    tall.tile_m = 128;
    tall.threads = 384;
    tall.shared_mem_bytes = 224512;
    tall.extras = "\"pdl\": true, \"mma_efficiency\": 0.91, \"memory_efficiency\": 0.85";
    kernels.push_back(tall);
    break;
  }
  auto rt = OpenRuntime("repo-routed", kernels);
  ASSERT_TRUE(rt.ok()) << rt.status();
  runtime_ = std::move(*rt);
  MoeLayerOptions o = Options(kPairs[0]);
  o.num_experts = 128;
  o.top_k = 8;
  o.hidden = 2048;
  o.intermediate = 768;
  MoeLayerWorkspace w;
  ASSERT_NO_FATAL_FAILURE(RunBatch(o, 4096, &w));
  EXPECT_THAT(Names(driver_.launches()),
              AllOf(Contains("layer_bf16_bf16_identity"),
                    Not(Contains("layer_bf16_bf16_identity_m128"))));

  auto gemm = MoeGemm::Create(*runtime_, {});
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  MoeProblem p;
  p.activation = Activation::kIdentity;
  p.experts = 128;
  p.tokens = 4096 * 8;
  p.n = 2048;
  p.k = 768;
  MoeGemmArgs g = MoeGemmArgsFor(p);
  g.b = g.offsets = g.a = g.out = kWorkspace;
  auto balanced = (*gemm)->KernelFor(g);
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  EXPECT_EQ((*balanced)->kernel->name(), "layer_bf16_bf16_identity_m128");
  g.routed_top_k = 8;
  g.routed_experts = 128;
  auto routed = (*gemm)->KernelFor(g);
  ASSERT_TRUE(routed.ok()) << routed.status();
  EXPECT_EQ((*routed)->kernel->name(), "layer_bf16_bf16_identity");
  g.routed_top_k = 200;
  EXPECT_THAT((*gemm)->KernelFor(g).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("routed_top_k=200 must be 0 (balanced rows) or 1..128")));
  // An op told once that its callers' offsets come from the router (an engine running
  // the layer's GEMMs itself) prices every call so, unless a call says otherwise.
  MoeGemmOptions routed_op;
  routed_op.routed_top_k = 8;
  routed_op.routed_experts = 128;
  auto engine_gemm = MoeGemm::Create(*runtime_, routed_op);
  ASSERT_TRUE(engine_gemm.ok()) << engine_gemm.status();
  g.routed_top_k = 0;
  g.routed_experts = 0;
  auto from_options = (*engine_gemm)->KernelFor(g);
  ASSERT_TRUE(from_options.ok()) << from_options.status();
  EXPECT_EQ((*from_options)->kernel->name(), "layer_bf16_bf16_identity");
  routed_op.routed_top_k = 0;
  EXPECT_THAT(MoeGemm::Create(*runtime_, routed_op).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("routed_top_k=0 routed_experts=128: give the router's top-k")));

  // A rank of 32 of the 128 experts: its GEMMs are priced on the router's 128.
  driver_.Clear();
  o.num_local_experts = 32;
  ASSERT_NO_FATAL_FAILURE(RunBatch(o, 4096, &w));
  EXPECT_THAT(Names(driver_.launches()),
              AllOf(Contains("layer_bf16_bf16_identity"),
                    Not(Contains("layer_bf16_bf16_identity_m128"))));
}

// "auto" keeps the gather kernel once GEMM1 is 8,192 columns wide (gated: 2I), where it
// measured faster than the gathering GEMM1 (Mixtral-8x7B's 28,672); "on" still fuses.
TEST_F(MoeLayerFakeDriverTest, AutoKeepsTheGatherKernelForAWideGemm1) {
  ASSERT_NO_FATAL_FAILURE(UseKernelsAnd("repo-gather-wide", GatherGemm1Stub()));
  MoeLayerOptions o = Options(kPairs[0]);
  ASSERT_TRUE(IsGated(o.activation));
  struct Case {
    int64_t intermediate;
    const char* mode;
    bool fused;
  };
  for (const Case& c : {Case{4064, "auto", true}, Case{4096, "auto", false},
                        Case{14336, "auto", false}, Case{14336, "on", true},
                        Case{128, "auto", true}}) {
    SCOPED_TRACE(absl::StrCat(c.intermediate, " ", c.mode));
    o.intermediate = c.intermediate;
    o.fuse_gather = c.mode;
    auto layer = MoeLayer::Create(*runtime_, o);
    ASSERT_TRUE(layer.ok()) << layer.status();
    EXPECT_EQ((*layer)->fuses_gather(), c.fused);
  }
}

TEST_F(MoeLayerFakeDriverTest, FuseGatherIsValidatedAndOnNeedsTheKernel) {
  const Pair& bf16 = kPairs[0];
  MoeLayerOptions o = Options(bf16);
  auto layer = MoeLayer::Create(*runtime_, o);  // LayerKernels(): no gathering GEMM1
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_FALSE((*layer)->fuses_gather());
  o.fuse_gather = "on";
  layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto ws = MoeLayer::WorkspaceSize(o, 5);
  ASSERT_TRUE(ws.ok());
  EXPECT_THAT((*layer)->CanImplement(Args(o, 5, *ws), 5),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("gather of A")));

  o.fuse_gather = "sometimes";
  EXPECT_THAT(MoeLayer::Create(*runtime_, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("fuse_gather: 'sometimes' is not auto, on or off")));
  o = Options(kPairs[1]);  // fp8
  o.fuse_gather = "on";
  EXPECT_THAT(MoeLayer::Create(*runtime_, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("'on' needs the bf16 x bf16 pair")));
  o.fuse_gather = "auto";
  layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_FALSE((*layer)->fuses_gather());
  o = Options(bf16);
  o.top_k = 1;
  o.routing_method = "llama4";
  o.apply_weight_on_input = true;
  o.fuse_gather = "on";
  EXPECT_THAT(MoeLayer::Create(*runtime_, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("apply_weight_on_input scales them before GEMM1")));
}

// Without an fp8-output GEMM1 that serves the layer, "auto" keeps the quantize kernel:
// a manifest without one, or with one for another activation only (here swiglu, the
// layer's GEMM1 identity); "on" then fails CanImplement naming the output format.
TEST_F(MoeLayerFakeDriverTest, AutoFusesOnlyWhereAFusedKernelServesTheLayer) {
  const Pair& fp8 = kPairs[1];
  const auto [quantize, gemm1, gemm2] = StepNames(fp8);
  MoeLayerOptions o = Options(fp8);
  auto layer = MoeLayer::Create(*runtime_, o);  // LayerKernels(): no fp8-output kernel
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_FALSE((*layer)->fuses_intermediate_quantization());
  MoeLayerWorkspace w;
  ASSERT_NO_FATAL_FAILURE(RunBatch(o, 5, &w));
  EXPECT_THAT(Names(driver_.launches()),
              ElementsAre("cubist_moe_route_sort", quantize, gemm1, quantize, gemm2,
                          "cubist_moe_finalize"));

  o.fuse_intermediate_quantization = "on";
  layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_TRUE((*layer)->fuses_intermediate_quantization());
  auto ws = MoeLayer::WorkspaceSize(o, 5);
  ASSERT_TRUE(ws.ok());
  EXPECT_THAT((*layer)->CanImplement(Args(o, 5, *ws), 5),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("output format: kernel writes bf16, problem wants fp8")));

  ASSERT_NO_FATAL_FAILURE(UseKernelsAnd("repo-fused-narrow", FusedGemm1Stub()));
  o.fuse_intermediate_quantization = "auto";
  o.activation = Activation::kIdentity;
  layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_FALSE((*layer)->fuses_intermediate_quantization());
  driver_.Clear();
  ASSERT_NO_FATAL_FAILURE(RunBatch(o, 5, &w));
  EXPECT_THAT(Names(driver_.launches()),
              ElementsAre("cubist_moe_route_sort", quantize, gemm2, quantize, gemm2,
                          "cubist_moe_finalize"));
}

TEST_F(MoeLayerFakeDriverTest, FuseIntermediateQuantizationIsValidated) {
  MoeLayerOptions o = Options(kPairs[1]);
  o.fuse_intermediate_quantization = "yes";
  EXPECT_THAT(MoeLayer::Create(*runtime_, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("moe layer: fuse_intermediate_quantization: 'yes' is not "
                                 "auto, on or off")));
  for (const Pair& pair : kPairs) {
    if (pair.a == DataFormat::kFp8) continue;
    SCOPED_TRACE(pair.stub);
    o = Options(pair);
    o.fuse_intermediate_quantization = "on";
    EXPECT_THAT(MoeLayer::Create(*runtime_, o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("'on' needs the fp8 x fp8 (per-tensor) pair")));
    o.fuse_intermediate_quantization = "off";
    auto layer = MoeLayer::Create(*runtime_, o);
    ASSERT_TRUE(layer.ok()) << layer.status();
    EXPECT_FALSE((*layer)->fuses_intermediate_quantization());
  }
}

// nvfp4_gemm_inputs "decoded": both quantize launches are the decoding kernel, writing
// GEMM1's bf16 input into `rows` and GEMM2's into `quantized` (no block scales), and both
// GEMMs are nvfp4 x bf16 with the quantize kernels' rcp(g) as a_global_scale.
TEST_F(MoeLayerFakeDriverTest, DecodedNvfp4InputsFeedNvfp4xBf16Gemms) {
  const Pair& nvfp4 = kPairs[std::size(kPairs) - 1];
  ASSERT_EQ(std::string(nvfp4.stub), "nvfp4_nvfp4");
  MoeLayerOptions o = Options(nvfp4);
  o.nvfp4_gemm_inputs = "decoded";
  auto layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  MoeLayerWorkspace w;
  ASSERT_NO_FATAL_FAILURE(RunBatch(o, 5, &w));
  EXPECT_TRUE((*layer)->DecodesNvfp4Inputs(5));
  const auto launches = driver_.launches();
  ASSERT_THAT(Names(launches),
              ElementsAre("cubist_moe_route_sort", "cubist_moe_quantize_nvfp4_decoded",
                          "layer_nvfp4_bf16_swiglu", "cubist_moe_quantize_nvfp4_decoded",
                          "layer_nvfp4_bf16_identity", "cubist_moe_finalize"));
  const CUdeviceptr ws = kWorkspace;
  const auto q1 = launches[1].As<moe::MoeQuantizeParams>();
  EXPECT_EQ(Addr(q1.input), kHidden);
  EXPECT_EQ(Addr(q1.scale), kInputScale);
  EXPECT_EQ(Addr(q1.out), ws + w.rows) << "bf16 [rows, H]: free until GEMM2 writes it";
  EXPECT_EQ(q1.out_scale, nullptr);
  EXPECT_EQ(Addr(q1.global_out), ws + w.global_scales);
  const auto g1 = launches[2].gemm();
  EXPECT_EQ(Addr(g1.a), ws + w.rows);
  EXPECT_EQ(g1.a_scale, nullptr);
  EXPECT_EQ(Addr(g1.a_global_scale), ws + w.global_scales);
  EXPECT_EQ(Addr(g1.b_scale), kW1Scale);
  EXPECT_EQ(Addr(g1.b_global_scale), kW1Global);
  EXPECT_EQ(Addr(g1.out), ws + w.activated);
  const auto q2 = launches[3].As<moe::MoeQuantizeParams>();
  EXPECT_EQ(Addr(q2.input), ws + w.activated);
  EXPECT_EQ(Addr(q2.scale), kIntermediateScale);
  EXPECT_EQ(Addr(q2.out), ws + w.quantized);
  EXPECT_EQ(q2.out_scale, nullptr);
  EXPECT_EQ(Addr(q2.global_out), ws + w.global_scales + 4);
  const auto g2 = launches[4].gemm();
  EXPECT_EQ(Addr(g2.a), ws + w.quantized);
  EXPECT_EQ(g2.a_scale, nullptr);
  EXPECT_EQ(Addr(g2.a_global_scale), ws + w.global_scales + 4);
  EXPECT_EQ(Addr(g2.out), ws + w.rows);
  // GEMM2's bf16 input fits `quantized`: 2 x rows x I bytes before the next region.
  EXPECT_GE(w.quantized_scale - w.quantized, 2u * 32 * 128);

  // "packed" runs the nvfp4 x nvfp4 GEMMs on the quantize kernel's bytes, in a smaller
  // workspace; the stubs' equal calibrations leave "auto" there too (the decoded inputs
  // cost more bytes for the same estimated rate).
  for (const char* mode : {"packed", "auto"}) {
    SCOPED_TRACE(mode);
    o.nvfp4_gemm_inputs = mode;
    layer = MoeLayer::Create(*runtime_, o);
    ASSERT_TRUE(layer.ok()) << layer.status();
    driver_.Clear();
    MoeLayerWorkspace packed;
    ASSERT_NO_FATAL_FAILURE(RunBatch(o, 5, &packed));
    EXPECT_FALSE((*layer)->DecodesNvfp4Inputs(5));
    EXPECT_THAT(Names(driver_.launches()),
                ElementsAre("cubist_moe_route_sort", "cubist_moe_quantize_nvfp4",
                            "layer_nvfp4_nvfp4_swiglu", "cubist_moe_quantize_nvfp4",
                            "layer_nvfp4_nvfp4_identity", "cubist_moe_finalize"));
    if (std::string(mode) == "packed") EXPECT_LT(packed.bytes, w.bytes);
    else EXPECT_EQ(packed.bytes, w.bytes);
  }
}

// "auto" decodes where the cost model prices the nvfp4 x bf16 GEMMs 5% below the nvfp4
// x nvfp4 ones (here: stubs whose nvfp4 x nvfp4 entries say a quarter of the rate), and
// goes without the decoding kernel when the manifest predates it.
TEST_F(MoeLayerFakeDriverTest, AutoDecodesNvfp4InputsWhereTheModelPricesItFaster) {
  const Pair& nvfp4 = kPairs[std::size(kPairs) - 1];
  std::vector<TestKernel> kernels = LayerKernels();
  for (TestKernel& k : kernels) {
    if (k.name.starts_with("layer_nvfp4_nvfp4_")) {
      k.extras = "\"pdl\": true, \"mma_efficiency\": 0.25, \"memory_efficiency\": 0.25";
    }
  }
  auto rt = OpenRuntime("repo-nvfp4-slow", kernels);
  ASSERT_TRUE(rt.ok()) << rt.status();
  runtime_ = std::move(*rt);
  MoeLayerOptions o = Options(nvfp4);
  auto layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_TRUE((*layer)->DecodesNvfp4Inputs(5));
  MoeLayerWorkspace w;
  ASSERT_NO_FATAL_FAILURE(RunBatch(o, 5, &w));
  EXPECT_THAT(Names(driver_.launches()),
              ElementsAre("cubist_moe_route_sort", "cubist_moe_quantize_nvfp4_decoded",
                          "layer_nvfp4_bf16_swiglu", "cubist_moe_quantize_nvfp4_decoded",
                          "layer_nvfp4_bf16_identity", "cubist_moe_finalize"));

  std::erase_if(kernels, [](const TestKernel& k) {
    return k.name == "cubist_moe_quantize_nvfp4_decoded";
  });
  rt = OpenRuntime("repo-nvfp4-no-decoder", kernels);
  ASSERT_TRUE(rt.ok()) << rt.status();
  runtime_ = std::move(*rt);
  layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  EXPECT_FALSE((*layer)->DecodesNvfp4Inputs(5));
  o.nvfp4_gemm_inputs = "decoded";
  layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto ws = MoeLayer::WorkspaceSize(o, 5);
  ASSERT_TRUE(ws.ok());
  EXPECT_THAT((*layer)->CanImplement(Args(o, 5, *ws), 5),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no moe_quantize kernel cubist_moe_quantize_nvfp4_decoded")));
}

TEST_F(MoeLayerFakeDriverTest, Nvfp4GemmInputsIsValidated) {
  MoeLayerOptions o = Options(kPairs[std::size(kPairs) - 1]);
  o.nvfp4_gemm_inputs = "bf16";
  EXPECT_THAT(MoeLayer::Create(*runtime_, o).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("moe layer: nvfp4_gemm_inputs: 'bf16' is not auto, packed or "
                                 "decoded")));
  for (const Pair& pair : kPairs) {
    if (pair.w == DataFormat::kNvfp4 && pair.a == DataFormat::kNvfp4) continue;
    SCOPED_TRACE(pair.stub);
    o = Options(pair);
    o.nvfp4_gemm_inputs = "decoded";
    EXPECT_THAT(MoeLayer::Create(*runtime_, o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("'decoded' needs the nvfp4 x nvfp4 pair")));
    o.nvfp4_gemm_inputs = "packed";
    auto packed = MoeLayer::WorkspaceSize(o, 64);
    o.nvfp4_gemm_inputs = "auto";
    auto automatic = MoeLayer::WorkspaceSize(o, 64);
    ASSERT_TRUE(packed.ok() && automatic.ok());
    EXPECT_EQ(*packed, *automatic) << "only the nvfp4 pair sizes for decoded inputs";
  }
}

TEST_F(MoeLayerFakeDriverTest, NoFinalizeStopsAfterGemm2AndWeightOnInputReachesTheGather) {
  MoeLayerOptions o = Options(kPairs[1]);  // fp8: the gather quantizes
  o.top_k = 1;
  o.routing_method = "llama4";
  o.apply_weight_on_input = true;
  o.finalize = "none";
  auto layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto w = MoeLayer::WorkspaceLayout(o, 3);
  ASSERT_TRUE(w.ok());
  MoeLayerArgs a = Args(o, 3, w->bytes);
  a.out = 0;  // nothing is written there without a finalize
  CUBIST_ASSERT_OK((*layer)->CanImplement(a, 3));
  CUBIST_ASSERT_OK((*layer)->Run(a, nullptr));
  const auto launches = driver_.launches();
  ASSERT_THAT(Names(launches),
              ElementsAre("cubist_moe_route_sort", "cubist_moe_quantize_fp8",
                          "layer_fp8_fp8_swiglu", "cubist_moe_quantize_fp8",
                          "layer_fp8_fp8_identity"));
  const auto q = launches[1].As<moe::MoeQuantizeParams>();
  EXPECT_EQ(Addr(q.weights), kWorkspace + w->topk_weights);
  EXPECT_EQ(launches[3].As<moe::MoeQuantizeParams>().weights, nullptr);
}

// Programmatic dependent launch: every kernel of the layer overlaps the previous one's
// tail, except a GEMM whose entry does not say it waits; the option off, none does.
TEST_F(MoeLayerFakeDriverTest, EveryKernelThatWaitsIsLaunchedProgrammatically) {
  for (const bool pdl : {true, false}) {
    SCOPED_TRACE(pdl);
    driver_.Clear();
    MoeLayerOptions o = Options(kPairs[0]);  // bf16: GEMM2's stub does not wait
    o.programmatic_dependent_launch = pdl;
    MoeLayerWorkspace w;
    ASSERT_NO_FATAL_FAILURE(RunBatch(o, 5, &w));
    const auto launches = driver_.launches();
    ASSERT_THAT(Names(launches),
                ElementsAre("cubist_moe_route_sort", "cubist_moe_gather_bf16",
                            "layer_bf16_bf16_swiglu", "layer_bf16_bf16_identity",
                            "cubist_moe_finalize"));
    for (const auto& l : launches) {
      const bool expected = pdl && l.name != "layer_bf16_bf16_identity";
      ASSERT_EQ(l.attrs.size(), expected ? 1u : 0u) << l.name;
      if (expected) {
        EXPECT_EQ(l.attrs[0].id, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
        EXPECT_EQ(l.attrs[0].value.programmaticStreamSerializationAllowed, 1);
      }
    }
  }
}

// GEMM2 waits for GEMM1 in stream order where, launched early, its CTAs would crowd onto
// the SMs GEMM1 frees first: GEMM1 has more tiles than CTAs (they end at different times)
// and GEMM2 leaves SMs idle. Mixtral's shape, 8 experts of top 2, on the fake's 132 SMs.
TEST_F(MoeLayerFakeDriverTest, Gemm2FollowsARaggedGemm1InStreamOrderWhenItLeavesSmsIdle) {
  MoeLayerOptions o = Options(kPairs[3]);  // mxfp4 x bf16: no quantize kernel between
  o.num_experts = 8;
  o.top_k = 2;
  o.hidden = 4096;
  o.intermediate = 14336;
  o.programmatic_dependent_launch = true;
  auto gemm2_attrs = [&](int64_t tokens) -> size_t {
    driver_.Clear();
    MoeLayerWorkspace w;
    RunBatch(o, tokens, &w);
    const auto launches = driver_.launches();
    EXPECT_THAT(Names(launches),
                ElementsAre("cubist_moe_route_sort", "cubist_moe_gather_bf16",
                            "layer_mxfp4_bf16_swiglu", "layer_mxfp4_bf16_identity",
                            "cubist_moe_finalize"));
    if (launches.size() != 5u) return 99;
    EXPECT_EQ(launches[2].attrs.size(), 1u) << "GEMM1 stays programmatic";
    EXPECT_EQ(launches[4].attrs.size(), 1u) << "the finalize stays programmatic";
    return launches[3].attrs.size();
  };
  // One token, 2 rows: GEMM1 2 x 224 = 448 tiles on 132 CTAs; GEMM2 2 x 32 = 64 tiles.
  EXPECT_EQ(gemm2_attrs(1), 0u);
  // 32 tokens, 64 rows: GEMM2 up to 8 x 32 tiles, a CTA on every SM: programmatic.
  EXPECT_EQ(gemm2_attrs(32), 1u);
}

TEST_F(MoeLayerFakeDriverTest, AScaleForAPairThatTakesNoneIsRefusedBeforeAnyLaunch) {
  const MoeLayerOptions o = Options(kPairs[0]);  // bf16 x bf16
  auto layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto w = MoeLayer::WorkspaceLayout(o, 8);
  ASSERT_TRUE(w.ok());
  MoeLayerArgs a = Args(o, 8, w->bytes);
  a.input_scale = kInputScale;
  EXPECT_THAT((*layer)->Run(a, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("moe layer: input_scale: is given, but bf16 x bf16 takes no "
                                 "such scale")));
  a.input_scale = 0;
  a.w1_bias = kW1 + 2;  // a bias is not a scale: only its alignment is checked
  EXPECT_THAT((*layer)->Run(a, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("w1_bias: address 0x3000002 is not 4-byte aligned")));
  EXPECT_TRUE(driver_.launches().empty());
}

TEST_F(MoeLayerFakeDriverTest, MaskedWorkspaceHoldsEveryRowOfTheSlots) {
  const MoeLayerOptions o = MaskedOptions(kPairs[1]);  // fp8
  auto w = MoeLayer::WorkspaceLayout(o, 3);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->row_capacity, 128) << "L x max_m, whatever max_tokens is";
  EXPECT_EQ(w->chunk_tokens, 128);
  EXPECT_GE(w->expanded_to_permuted - w->permuted_to_expanded, 4u * 128) << "the row map";
  EXPECT_GE(w->gathered_scale - w->gathered, 128u * 256) << "fp8 rows of GEMM1's input";
  EXPECT_GE(w->bytes - w->rows, 2u * 128 * 256) << "bf16 rows of GEMM2's output";
  auto other = MoeLayer::WorkspaceLayout(o, 100000);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->bytes, w->bytes);
  auto size = MoeLayer::WorkspaceSize(o, 0);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, w->bytes);
}

TEST_F(MoeLayerFakeDriverTest, MaskedEveryPairCompactsRunsBothGemmsAndScattersBack) {
  for (const Pair& pair : kPairs) {
    SCOPED_TRACE(absl::StrCat(pair.weights, " x ", pair.activations));
    driver_.Clear();
    const MoeLayerOptions o = MaskedOptions(pair);
    auto layer = MoeLayer::Create(*runtime_, o);
    ASSERT_TRUE(layer.ok()) << layer.status();
    auto w = MoeLayer::WorkspaceLayout(o, 0);
    ASSERT_TRUE(w.ok()) << w.status();
    const MoeLayerArgs a = MaskedArgs(o, w->bytes);
    CUBIST_ASSERT_OK((*layer)->CanImplement(a, 0));
    EXPECT_TRUE(driver_.launches().empty()) << "CanImplement launches nothing";
    CUBIST_ASSERT_OK((*layer)->Run(a, nullptr));

    const CUdeviceptr ws = kWorkspace;
    const bool quantized = pair.a != DataFormat::kBf16;
    const auto [quantize, gemm1, gemm2] = StepNames(pair);
    const auto launches = driver_.launches();
    if (quantized) {
      ASSERT_THAT(Names(launches), ElementsAre("cubist_moe_sort_masked", quantize, gemm1,
                                               quantize, gemm2, "cubist_moe_finalize_masked"));
    } else {
      ASSERT_THAT(Names(launches),
                  ElementsAre("cubist_moe_sort_masked", "cubist_moe_gather_bf16", gemm1, gemm2,
                              "cubist_moe_finalize_masked"));
    }
    const auto sort = launches[0].As<moe::MoeMaskedParams>();
    EXPECT_EQ(sort.abi, moe::kMoeLayerAbi);
    EXPECT_EQ(sort.num_local_experts, 16);
    EXPECT_EQ(sort.max_m, 8);
    EXPECT_EQ(Addr(sort.counts), kCounts);
    EXPECT_EQ(Addr(sort.offsets), ws + w->offsets);
    EXPECT_EQ(Addr(sort.row_map), ws + w->permuted_to_expanded);
    EXPECT_EQ(launches[0].config.gridDimX, 16u) << "a CTA per expert";

    // The compaction: the gather reads hidden_states' row row_map[r] (top_k 1).
    CUdeviceptr gathered_out = 0;
    if (quantized) {
      const auto q = launches[1].As<moe::MoeQuantizeParams>();
      EXPECT_EQ(q.cols, 256);
      EXPECT_EQ(q.top_k, 1);
      EXPECT_EQ(Addr(q.input), kHidden);
      EXPECT_EQ(Addr(q.offsets), ws + w->offsets);
      EXPECT_EQ(Addr(q.permuted_to_expanded), ws + w->permuted_to_expanded);
      EXPECT_EQ(q.weights, nullptr);
      EXPECT_EQ(Addr(q.scale), moe::FormatHasGlobalScale(pair.a) ? kInputScale : 0);
      EXPECT_EQ(Addr(q.out_scale), ws + w->gathered_scale);
      gathered_out = Addr(q.out);
    } else {
      const auto g = launches[1].As<moe::MoeGatherParams>();
      EXPECT_EQ(g.top_k, 1);
      EXPECT_EQ(Addr(g.input), kHidden);
      EXPECT_EQ(Addr(g.offsets), ws + w->offsets);
      EXPECT_EQ(Addr(g.permuted_to_expanded), ws + w->permuted_to_expanded);
      EXPECT_EQ(g.weights, nullptr);
      gathered_out = Addr(g.out);
    }
    EXPECT_EQ(gathered_out, ws + w->gathered);

    const auto g1 = launches[2].gemm();
    EXPECT_EQ(g1.num_experts, 16);
    EXPECT_EQ(g1.num_tokens, 128) << "L x max_m rows";
    EXPECT_EQ(g1.n, 256);
    EXPECT_EQ(g1.k, 256);
    EXPECT_EQ(Addr(g1.a), gathered_out);
    EXPECT_EQ(Addr(g1.b), kW1);
    EXPECT_EQ(Addr(g1.offsets), ws + w->offsets);
    EXPECT_EQ(Addr(g1.out), ws + w->activated);
    const auto g2 = launches[quantized ? 4 : 3].gemm();
    EXPECT_EQ(g2.num_tokens, 128);
    EXPECT_EQ(Addr(g2.a), quantized ? ws + w->quantized : ws + w->activated);
    EXPECT_EQ(Addr(g2.b), kW2);
    EXPECT_EQ(Addr(g2.out), ws + w->rows);
    EXPECT_EQ(Addr(g2.offsets), ws + w->offsets);

    const auto f = launches.back().As<moe::MoeMaskedParams>();
    EXPECT_EQ(f.num_local_experts, 16);
    EXPECT_EQ(f.max_m, 8);
    EXPECT_EQ(f.hidden, 256);
    EXPECT_EQ(Addr(f.offsets), ws + w->offsets);
    EXPECT_EQ(Addr(f.row_map), ws + w->permuted_to_expanded);
    EXPECT_EQ(Addr(f.rows), ws + w->rows);
    EXPECT_EQ(Addr(f.out), kOut);
  }
}

TEST_F(MoeLayerFakeDriverTest, MaskedNoRowsIsANoOpThatLaunchesNothing) {
  const MoeLayerOptions o = MaskedOptions(kPairs[5]);  // nvfp4
  auto layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  MoeLayerArgs a = MaskedArgs(o, 0);
  a.tokens = 0;
  CUBIST_ASSERT_OK((*layer)->Run(a, nullptr));
  EXPECT_TRUE(driver_.launches().empty());
}

TEST_F(MoeLayerFakeDriverTest, MaskedOptionsRefuseRoutingAndChunking) {
  struct Bad {
    const char* fragment;
    void (*set)(MoeLayerOptions&);
  };
  const Bad bad[] = {
      {"moe layer: top_k: is a routing option", [](MoeLayerOptions& o) { o.top_k = 4; }},
      {"routing_method: is a routing option",
       [](MoeLayerOptions& o) { o.routing_method = "deepseek_v3"; }},
      {"n_group: is a routing option", [](MoeLayerOptions& o) { o.n_group = 4; }},
      {"apply_weight_on_input: is a routing option",
       [](MoeLayerOptions& o) { o.apply_weight_on_input = true; }},
      {"logits_format: is a routing option", [](MoeLayerOptions& o) { o.logits_format = "bf16"; }},
      {"finalize: expert_major_masked input has no finalize",
       [](MoeLayerOptions& o) { o.finalize = "none"; }},
      {"max_chunk_tokens: expert_major_masked input runs in one pass",
       [](MoeLayerOptions& o) { o.max_chunk_tokens = 4; }},
      {"max_m: 0 is outside 1..", [](MoeLayerOptions& o) { o.max_m = 0; }},
      {"max_m: 134217728 is outside 1..134217727",
       [](MoeLayerOptions& o) { o.max_m = int64_t{1} << 27; }},
      {"input_layout: 'expert_major' is not token_major or expert_major_masked",
       [](MoeLayerOptions& o) { o.input_layout = "expert_major"; }},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.fragment);
    MoeLayerOptions o = MaskedOptions(kPairs[0]);
    b.set(o);
    EXPECT_THAT(MoeLayer::Create(*runtime_, o).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.fragment)));
    EXPECT_THAT(MoeLayer::WorkspaceSize(o, 8).status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.fragment)));
  }
  MoeLayerOptions token = Options(kPairs[0]);
  token.max_m = 8;
  EXPECT_THAT(MoeLayer::Create(*runtime_, token).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_m: is for expert_major_masked input only")));
}

TEST_F(MoeLayerFakeDriverTest, MaskedArgsRefuseRoutingBeforeAnyLaunch) {
  const MoeLayerOptions o = MaskedOptions(kPairs[0]);
  auto layer = MoeLayer::Create(*runtime_, o);
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto w = MoeLayer::WorkspaceLayout(o, 0);
  ASSERT_TRUE(w.ok());
  struct Bad {
    const char* fragment;
    void (*set)(MoeLayerArgs&);
  };
  const Bad bad[] = {
      {"moe layer: router_logits: is given, but expert_major_masked input is routed already",
       [](MoeLayerArgs& a) { a.router_logits = kLogits; }},
      {"routing_bias: is given", [](MoeLayerArgs& a) { a.routing_bias = kLogits; }},
      {"topk_ids: is given", [](MoeLayerArgs& a) { a.topk_ids = kIds; }},
      {"topk_weights: is given", [](MoeLayerArgs& a) { a.topk_weights = kWeights; }},
      {"accumulate: is given", [](MoeLayerArgs& a) { a.accumulate = true; }},
      {"masked_counts: is null", [](MoeLayerArgs& a) { a.masked_counts = 0; }},
      {"masked_counts: address 0xa000002 is not 4-byte aligned",
       [](MoeLayerArgs& a) { a.masked_counts = kCounts + 2; }},
      {"tokens: 100: expert_major_masked input holds L x max_m = 128 rows; set tokens to 128",
       [](MoeLayerArgs& a) { a.tokens = 100; }},
      {"out: is null", [](MoeLayerArgs& a) { a.out = 0; }},
      {"workspace: 1024 bytes", [](MoeLayerArgs& a) { a.workspace_bytes = 1024; }},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.fragment);
    MoeLayerArgs a = MaskedArgs(o, w->bytes);
    b.set(a);
    EXPECT_THAT((*layer)->Run(a, nullptr),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.fragment)));
    EXPECT_THAT((*layer)->CanImplement(a, 0),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(b.fragment)));
  }
  // Token-major layers take no counts.
  auto token = MoeLayer::Create(*runtime_, Options(kPairs[0]));
  ASSERT_TRUE(token.ok());
  MoeLayerArgs a = Args(Options(kPairs[0]), 4, w->bytes);
  a.masked_counts = kCounts;
  EXPECT_THAT((*token)->Run(a, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("masked_counts: is for expert_major_masked input only")));
  EXPECT_TRUE(driver_.launches().empty());
}

// A manifest published before the masked kernels still serves the token-major layer;
// the masked one says which function is missing.
TEST_F(MoeLayerFakeDriverTest, AManifestWithoutTheMaskedKernelsServesOnlyTokenMajor) {
#ifdef CUBIST_DISPATCH_STUB_CUBIN
  std::vector<TestKernel> older;
  for (const TestKernel& k : LayerKernels()) {
    if (!k.name.ends_with("_masked")) older.push_back(k);
  }
  auto rt = OpenRuntime("older", older);
  ASSERT_TRUE(rt.ok()) << rt.status();
  const MoeLayerOptions token = Options(kPairs[0]);
  auto layer = MoeLayer::Create(**rt, token);
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto w = MoeLayer::WorkspaceLayout(token, 4);
  ASSERT_TRUE(w.ok());
  CUBIST_EXPECT_OK((*layer)->CanImplement(Args(token, 4, w->bytes), 4));
  const MoeLayerOptions masked = MaskedOptions(kPairs[0]);
  auto masked_layer = MoeLayer::Create(**rt, masked);
  ASSERT_TRUE(masked_layer.ok()) << masked_layer.status();
  auto mw = MoeLayer::WorkspaceLayout(masked, 0);
  ASSERT_TRUE(mw.ok());
  EXPECT_THAT((*masked_layer)->CanImplement(MaskedArgs(masked, mw->bytes), 0),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("has no moe_sort kernel cubist_moe_sort_masked for this GPU")));
  EXPECT_TRUE(driver_.launches().empty());
#endif
}

}  // namespace
}  // namespace cubist
