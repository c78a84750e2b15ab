// Tests of the MoE layer's CPU reference (dispatch/moe_layer_reference.h) on hand-computed
// cases: every routing method's choice and weights, ties and NaN logits, DeepSeek-V3's
// groups, the stable sort with expert parallelism and dropped ids, the finalize's slot
// order, and the whole layer on a tiny problem. Also the layer's option checks
// (MoeLayer::WorkspaceSize), which need no GPU.
#include "dispatch/moe_layer_reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "dispatch/moe_layer.h"
#include "dispatch/reference.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cubist::reference {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Routing RouteOne(moe::MoeRoutingMethod m, const std::vector<float>& x, int k,
                 std::vector<float> bias = {}, int n_group = 0, int topk_group = 0,
                 float scale = 1.0f) {
  RoutingConfig c;
  c.method = m;
  c.num_experts = static_cast<int>(x.size());
  c.top_k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.routed_scaling_factor = scale;
  return Route(c, x, bias, 1);
}

TEST(MoeRoutingReferenceTest, SelectsDescendingWithTiesToTheLowerIndex) {
  const Routing r = RouteOne(moe::kRouteTopK, {1, 3, 2, 3, 0}, 3);
  EXPECT_THAT(r.ids, ElementsAre(1, 3, 2));
  EXPECT_THAT(r.weights, ElementsAre(3, 3, 2));  // topk: the raw logits
}

TEST(MoeRoutingReferenceTest, NanRanksBelowEveryNumberAndWeighsZero) {
  Routing r = RouteOne(moe::kRouteTopK, {kNaN, -kInf, 1, kNaN}, 3);
  EXPECT_THAT(r.ids, ElementsAre(2, 1, 0));  // -inf above NaN; NaNs by index
  EXPECT_EQ(r.weights[0], 1.0f);
  EXPECT_EQ(r.weights[1], -kInf);
  EXPECT_EQ(r.weights[2], 0.0f);
  r = RouteOne(moe::kRouteDefault, {kNaN, 0, 0}, 2);
  EXPECT_THAT(r.ids, ElementsAre(1, 2));
  EXPECT_THAT(r.weights, ElementsAre(0.5f, 0.5f));  // the NaN's probability is 0
  r = RouteOne(moe::kRouteRenormalize, {kNaN, kNaN}, 1);  // nothing to normalize
  EXPECT_THAT(r.ids, ElementsAre(0));
  EXPECT_THAT(r.weights, ElementsAre(0.0f));
}

TEST(MoeRoutingReferenceTest, SoftmaxMethodsNormalizeOverTheirSets) {
  const std::vector<float> x = {0, std::log(3.0f), std::log(2.0f), std::log(4.0f)};
  // softmax over all: 1, 3, 2, 4 / 10.
  Routing r = RouteOne(moe::kRouteDefault, x, 2);
  EXPECT_THAT(r.ids, ElementsAre(3, 1));
  EXPECT_NEAR(r.weights[0], 0.4f, 1e-6);
  EXPECT_NEAR(r.weights[1], 0.3f, 1e-6);
  r = RouteOne(moe::kRouteRenormalize, x, 2);  // softmax over the chosen: 4/7, 3/7
  EXPECT_NEAR(r.weights[0], 4.0f / 7, 1e-6);
  EXPECT_NEAR(r.weights[1], 3.0f / 7, 1e-6);
  r = RouteOne(moe::kRouteRenormalizeNaive, x, 2);  // the same value, other rounding
  EXPECT_NEAR(r.weights[0], 4.0f / 7, 1e-6);
  EXPECT_NEAR(r.weights[0] + r.weights[1], 1.0f, 1e-6);
}

TEST(MoeRoutingReferenceTest, SigmoidMethods) {
  const std::vector<float> x = {0, 2, -1};
  const float s2 = 1 / (1 + std::exp(-2.0f)), s0 = 0.5f;
  Routing r = RouteOne(moe::kRouteSigmoid, x, 2);
  EXPECT_THAT(r.ids, ElementsAre(1, 0));
  EXPECT_FLOAT_EQ(r.weights[0], s2);
  EXPECT_FLOAT_EQ(r.weights[1], s0);
  r = RouteOne(moe::kRouteSigmoidRenorm, x, 2);
  EXPECT_FLOAT_EQ(r.weights[0], s2 / (s2 + s0));
  r = RouteOne(moe::kRouteLlama4, x, 1);
  EXPECT_THAT(r.ids, ElementsAre(1));
  EXPECT_FLOAT_EQ(r.weights[0], s2);
}

TEST(MoeRoutingReferenceTest, DeepSeekV3KeepsTheBestGroupsAndWeighsUnbiased) {
  // 8 experts in 4 groups of 2; logits 0 (sigmoid 0.5) everywhere, the bias decides:
  // group scores (sum of the two biased scores): g0 1.0+0.1, g1 1.0+0.5, g2 1.0+0.3,
  // g3 1.0+0.6 -> keep g3 and g1.
  const std::vector<float> x(8, 0.0f);
  const std::vector<float> bias = {0.1f, 0, 0.5f, 0, 0, 0.3f, 0.2f, 0.4f};
  const Routing r = RouteOne(moe::kRouteDeepSeekV3, x, 3, bias, 4, 2, 2.5f);
  // Within g1 (experts 2, 3) and g3 (6, 7): biased 1.0, 0.5, 0.7, 0.9 -> 2, 7, 6.
  EXPECT_THAT(r.ids, ElementsAre(2, 7, 6));
  // Unbiased sigmoids are all 0.5: each weight 0.5 / (1.5 + 1e-20) x 2.5.
  for (float w : r.weights) EXPECT_FLOAT_EQ(w, 0.5f / 1.5f * 2.5f);
}

TEST(MoeRoutingReferenceTest, DeepSeekV3GroupTiesGoToTheLowerGroup) {
  const std::vector<float> x(8, 0.0f);
  const Routing r = RouteOne(moe::kRouteDeepSeekV3, x, 2, {}, 4, 1);
  EXPECT_THAT(r.ids, ElementsAre(0, 1));
}

TEST(MoeSortReferenceTest, StableByLocalExpertWithDroppedAndRemoteIds) {
  // T = 3, k = 2; global E = 6, this rank holds experts 2..4.
  const std::vector<int32_t> ids = {3, 2, 5, 3, 2, 9};
  const SlotSort s = SortSlots(ids, 6, 2, 3);
  EXPECT_THAT(s.offsets, ElementsAre(0, 2, 4, 4));  // expert 2: slots 1, 4; 3: 0, 3
  EXPECT_THAT(s.permuted_to_expanded, ElementsAre(1, 4, 0, 3));
  EXPECT_THAT(s.expanded_to_permuted, ElementsAre(2, 0, -1, 3, 1, -1));
  EXPECT_EQ(s.dropped, 1);  // 9 is no expert; 5 is another rank's
}

TEST(MoeSortReferenceTest, NegativeAndHugeIdsAreDropped) {
  const SlotSort s = SortSlots({-1, 0, 2147483647, 0}, 4, 0, 4);
  EXPECT_EQ(s.dropped, 2);
  EXPECT_THAT(s.offsets, ElementsAre(0, 2, 2, 2, 2));
  EXPECT_THAT(s.expanded_to_permuted, ElementsAre(-1, 0, -1, 1));
}

TEST(MoeFinalizeReferenceTest, SlotOrderIsWeightDescendingThenLowerId) {
  Routing r;
  r.tokens = 1;
  r.top_k = 4;
  r.ids = {7, 2, 5, 1};
  r.weights = {0.25f, 0.25f, 0.5f, 0.0f};
  EXPECT_THAT(SlotOrder(r, 0), ElementsAre(2, 1, 0, 3));
}

TEST(MoeLayerReferenceTest, TinyLayerByHand) {
  // One token, H = 2, I = 1, two experts (identity activation): GEMM1 y = w1 . x,
  // GEMM2 z = w2 * y; out = sum of w x z.
  MoeLayerData d;
  d.tokens = 1;
  d.hidden = 2;
  d.intermediate = 1;
  d.num_experts = 2;
  d.num_local_experts = 2;
  d.activation = moe::kIdentity;
  d.x = {FloatToBf16(1.0f), FloatToBf16(2.0f)};
  d.w1 = {FloatToBf16(1.0f), FloatToBf16(1.0f),    // expert 0: 3
          FloatToBf16(0.5f), FloatToBf16(-1.0f)};  // expert 1: -1.5
  d.w2 = {FloatToBf16(2.0f), FloatToBf16(1.0f),    // expert 0: [6, 3]
          FloatToBf16(4.0f), FloatToBf16(-2.0f)};  // expert 1: [-6, 3]
  Routing r;
  r.tokens = 1;
  r.top_k = 2;
  r.ids = {1, 0};
  r.weights = {0.75f, 0.25f};
  std::vector<double> out = MoeLayerReference(d, r);
  EXPECT_THAT(out, ElementsAre(0.75 * -6 + 0.25 * 6, 0.75 * 3 + 0.25 * 3));
  // Accumulating into an existing output, and an expert on another rank adds nothing.
  d.num_local_experts = 1;
  d.local_expert_offset = 1;
  d.w1.resize(2);
  d.w1 = {FloatToBf16(0.5f), FloatToBf16(-1.0f)};
  d.w2 = {FloatToBf16(4.0f), FloatToBf16(-2.0f)};
  out = MoeLayerReference(d, r, {FloatToBf16(1.0f), FloatToBf16(-1.0f)});
  EXPECT_THAT(out, ElementsAre(1 + 0.75 * -6, -1 + 0.75 * 3));
}

TEST(MoeLayerReferenceTest, WeightOnInputRoundsTheRowToBf16) {
  MoeLayerData d;
  d.tokens = 1;
  d.hidden = 1;
  d.intermediate = 1;
  d.num_experts = 1;
  d.num_local_experts = 1;
  d.activation = moe::kIdentity;
  d.apply_weight_on_input = true;
  d.x = {FloatToBf16(1.0f + 1.0f / 128)};  // 1 + 2^-7: bf16 has 7 fraction bits
  d.w1 = {FloatToBf16(1.0f)};
  d.w2 = {FloatToBf16(1.0f)};
  Routing r;
  r.tokens = 1;
  r.top_k = 1;
  r.ids = {0};
  r.weights = {0.5f + 1.0f / 1024};
  // (1 + 2^-7)(0.5 + 2^-10) = 0.5 + 2^-8 + 2^-10 + 2^-17 -> bf16 0.5 + 2^-8 (+2^-10 is
  // below half of bf16's step 2^-8 at 0.5); the finalize then adds it with weight 1.
  EXPECT_THAT(MoeLayerReference(d, r), ElementsAre(0.5 + 1.0 / 256));
}

// The expert-major masked layer: each valid row through its expert, unweighted; counts
// clamped to 0..max_m; rows past a count NaN (the layer leaves them untouched).
TEST(MoeLayerReferenceTest, MaskedRowsGoThroughTheirExpertUnweighted) {
  MoeLayerData d;
  d.hidden = 2;
  d.intermediate = 1;
  d.num_experts = 3;
  d.num_local_experts = 3;
  d.activation = moe::kIdentity;
  const int max_m = 2;
  const float x[3][2][2] = {{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}, {{-1, 1}, {2, 2}}};
  for (const auto& e : x) {
    for (const auto& row : e) {
      for (float v : row) d.x.push_back(FloatToBf16(v));
    }
  }
  d.w1 = {FloatToBf16(1.0f), FloatToBf16(1.0f),    // expert 0: x0 + x1
          FloatToBf16(1.0f), FloatToBf16(-1.0f),   // expert 1: x0 - x1
          FloatToBf16(2.0f), FloatToBf16(0.0f)};   // expert 2: 2 x0
  d.w2 = {FloatToBf16(1.0f), FloatToBf16(2.0f),    // expert 0: [y, 2y]
          FloatToBf16(-1.0f), FloatToBf16(1.0f),   // expert 1: [-y, y]
          FloatToBf16(0.5f), FloatToBf16(0.25f)};  // expert 2: [y/2, y/4]
  // Expert 0: one row; expert 1: -3 clamps to none; expert 2: 9 clamps to max_m.
  const std::vector<double> out = MaskedMoeLayerReference(d, {1, -3, 9}, max_m);
  ASSERT_EQ(out.size(), 12u);
  EXPECT_EQ(out[0], 3.0);
  EXPECT_EQ(out[1], 6.0);
  for (int i : {2, 3, 4, 5, 6, 7}) EXPECT_TRUE(std::isnan(out[i])) << i;
  EXPECT_EQ(out[8], -1.0);  // 2 x -1 = -2, then [-1, -0.5]
  EXPECT_EQ(out[9], -0.5);
  EXPECT_EQ(out[10], 2.0);  // 2 x 2 = 4, then [2, 1]
  EXPECT_EQ(out[11], 1.0);
}

// ---- The layer's option checks (no GPU: WorkspaceSize validates the options). ----

MoeLayerOptions Qwen3() {
  MoeLayerOptions o;
  o.num_experts = 128;
  o.top_k = 8;
  o.hidden = 2048;
  o.intermediate = 768;
  return o;
}

absl::Status SizeStatus(const MoeLayerOptions& o) {
  return MoeLayer::WorkspaceSize(o, 16).status();
}

TEST(MoeLayerOptionsTest, RefusesBadOptionsNamingTheField) {
  MoeLayerOptions o = Qwen3();
  ASSERT_TRUE(SizeStatus(o).ok()) << SizeStatus(o);
  o.top_k = 129;
  EXPECT_THAT(SizeStatus(o).message(), HasSubstr("top_k: 129 is outside 1..num_experts (128)"));
  o = Qwen3();
  o.top_k = 33;
  EXPECT_THAT(SizeStatus(o).message(), HasSubstr("top_k: 33 exceeds the kernels' limit of 32"));
  o = Qwen3();
  o.routing_method = "deepseek_v3";
  o.n_group = 3;
  o.topk_group = 1;
  EXPECT_THAT(SizeStatus(o).message(), HasSubstr("n_group: 3 does not divide num_experts (128)"));
  o.n_group = 8;
  o.topk_group = 9;
  EXPECT_THAT(SizeStatus(o).message(), HasSubstr("topk_group: 9 is outside 1..n_group (8)"));
  o = Qwen3();
  o.routing_method = "softmax";
  EXPECT_EQ(SizeStatus(o).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(SizeStatus(o).message(),
              HasSubstr("unknown 'softmax'; expected one of default, renormalize, "
                        "renormalize_naive, deepseek_v3, llama4, topk, sigmoid, sigmoid_renorm"));
  o = Qwen3();
  o.routing_method = "llama4";
  EXPECT_THAT(SizeStatus(o).message(), HasSubstr("llama4 routing chooses one expert"));
  o = Qwen3();
  o.hidden = 2044;
  EXPECT_THAT(SizeStatus(o).message(), HasSubstr("hidden: 2044 is not a positive multiple of 8"));
  o = Qwen3();
  o.local_expert_offset = 96;
  o.num_local_experts = 64;
  EXPECT_THAT(SizeStatus(o).message(), HasSubstr("experts 96..159 are not within the 128"));
  o = Qwen3();
  o.weight_format = moe::kMxfp4;
  o.activation_format = moe::kFp8;
  EXPECT_EQ(SizeStatus(o).code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(SizeStatus(o).message(),
              HasSubstr("the mxfp4 x fp8 pair is not served by the layer (bf16 x bf16, fp8 x "
                        "fp8, fp8-block x fp8-block, mxfp4 x bf16, mxfp4 x mxfp8, nvfp4 x "
                        "bf16, nvfp4 x nvfp4 are)"));
  o = Qwen3();
  o.weight_format = moe::kMxfp4;
  o.activation_format = moe::kMxfp8;
  o.hidden = 2056;  // a multiple of 8, not of mxfp8's 32-element scale block
  EXPECT_EQ(SizeStatus(o).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(SizeStatus(o).message(),
              HasSubstr("hidden: 2056 is not a multiple of 32, which mxfp8 activations need"));
  o.hidden = 2048;
  EXPECT_TRUE(SizeStatus(o).ok()) << SizeStatus(o);
  o.weight_format = o.activation_format = moe::kFp8Block;
  o.hidden = 2880;  // fp8-block: a partial last 128-block is allowed
  EXPECT_TRUE(SizeStatus(o).ok()) << SizeStatus(o);
}

TEST(MoeLayerOptionsTest, QuantizedWorkspaceHoldsEachFormatsBytes) {
  // GEMM1's input in the activation format with its scales, GEMM1's bf16 output, GEMM2's
  // input again quantized: the layout places each where the quantize kernels write it.
  MoeLayerOptions o = Qwen3();
  o.weight_format = o.activation_format = moe::kNvfp4;
  const MoeLayerWorkspace w = *MoeLayer::WorkspaceLayout(o, 1);
  const size_t rows = 8;  // one token's bucket: T x k = 8 rows
  EXPECT_EQ(w.row_capacity, 8);
  EXPECT_GE(w.gathered_scale - w.gathered, rows * 2048 / 2);    // e2m1, two per byte
  EXPECT_GE(w.activated - w.gathered_scale, rows * 2048 / 16);  // e4m3 per 16
  EXPECT_GE(w.quantized - w.activated, rows * 768 * 2);         // bf16
  EXPECT_GE(w.quantized_scale - w.quantized, rows * 768 / 2);
  EXPECT_GE(w.global_scales - w.quantized_scale, rows * 768 / 16);
  EXPECT_GT(w.rows, w.global_scales);
  EXPECT_EQ(w.gathered % 256, 0u);
  EXPECT_EQ(w.quantized_scale % 256, 0u);
  o.weight_format = o.activation_format = moe::kBf16;
  const MoeLayerWorkspace b = *MoeLayer::WorkspaceLayout(o, 1);
  EXPECT_EQ(b.quantized, b.activated);  // GEMM2 reads GEMM1's bf16 output itself
}

TEST(MoeLayerOptionsTest, WorkspaceIsBoundedByTheChunk) {
  MoeLayerOptions o = Qwen3();
  const size_t whole = *MoeLayer::WorkspaceSize(o, 16384);
  o.max_chunk_tokens = 1024;
  const size_t chunked = *MoeLayer::WorkspaceSize(o, 16384);
  EXPECT_EQ(chunked, *MoeLayer::WorkspaceSize(o, 1024));
  EXPECT_LT(chunked * 15, whole);
  // 8192 rows of gathered input and output (H) and activations (I), in bf16, at least.
  EXPECT_GE(chunked, 8192u * (2048 + 2048 + 768) * 2);
  const MoeLayerWorkspace w = *MoeLayer::WorkspaceLayout(o, 16384);
  EXPECT_EQ(w.chunk_tokens, 1024);
  EXPECT_EQ(w.row_capacity, 8192);
  EXPECT_EQ(w.gathered % 256, 0u);
  EXPECT_EQ(w.rows % 256, 0u);
}

}  // namespace
}  // namespace cubist::reference
