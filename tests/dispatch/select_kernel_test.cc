// Selection: filters, ranking, misses and pinning (dispatch/selector.h).
#include "dispatch/selector.h"

#include <array>
#include <cmath>
#include <string>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/dispatch_manifests.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::ParseTestManifest;
using ::cubist::testing::SelectionKernels;
using ::cubist::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

MoeProblem Problem(DataFormat w, DataFormat a, Activation act, int64_t experts,
                   int64_t tokens_per_expert, int64_t n, int64_t k, DeviceSm sm = {9, 0}) {
  MoeProblem p;
  p.weight_format = w;
  p.activation_format = a;
  p.activation = act;
  p.experts = experts;
  p.tokens = experts * tokens_per_expert;
  p.n = n;
  p.k = k;
  p.sm = sm;
  return p;
}

MoeProblem Bf16Swiglu(int64_t e, int64_t tpe, int64_t n, int64_t k, DeviceSm sm = {9, 0}) {
  return Problem(DataFormat::kBf16, DataFormat::kBf16, Activation::kSwiglu, e, tpe, n, k, sm);
}

// A registry of `kernels` (a test manifest).
absl::StatusOr<Registry> RegistryOf(const std::vector<testing::TestKernel>& kernels) {
  auto m = ParseTestManifest(kernels);
  if (!m.ok()) return m.status();
  return Registry::Create(*m);
}

// The cost estimate of the named candidate of `r` for `p`.
CostEstimate CostOfIn(const Registry& r, std::string_view name, const MoeProblem& p) {
  auto ranked = RankCandidates(r, p);
  EXPECT_TRUE(ranked.ok()) << ranked.status();
  if (ranked.ok()) {
    for (const Candidate& c : *ranked) {
      if (c.kernel->name() == name) return c.cost;
    }
  }
  ADD_FAILURE() << "no candidate " << name;
  return CostEstimate{};
}

class SelectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = ParseTestManifest(SelectionKernels());
    ASSERT_TRUE(m.ok()) << m.status();
    auto r = Registry::Create(*m);
    ASSERT_TRUE(r.ok()) << r.status();
    registry_.emplace(std::move(*r));
  }

  std::vector<std::string> RankedNames(const MoeProblem& p, const SelectOptions& o = {}) {
    auto ranked = RankCandidates(*registry_, p, o);
    EXPECT_TRUE(ranked.ok()) << ranked.status();
    std::vector<std::string> names;
    if (ranked.ok()) {
      for (const Candidate& c : *ranked) names.push_back(c.kernel->name());
    }
    return names;
  }

  CostEstimate CostOf(std::string_view name, const MoeProblem& p) {
    return CostOfIn(*registry_, name, p);
  }

  std::optional<Registry> registry_;
};

TEST_F(SelectTest, PrefillPicksTheLargestTile) {
  // Mixtral-8x7B FC1: 2048 tokens per expert. Every tile divides evenly; the 128x128
  // tile reuses operands best and needs the fewest waves' worth of work.
  EXPECT_THAT(RankedNames(Bf16Swiglu(8, 2048, 28672, 4096)),
              ElementsAre("bf16_swiglu_m128n128k64", "bf16_swiglu_m64n128k64",
                          "bf16_swiglu_m64n64k64"));
  auto best = SelectKernel(*registry_, Bf16Swiglu(8, 2048, 28672, 4096));
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "bf16_swiglu_m128n128k64");
  EXPECT_EQ(best->rank, 1);
  EXPECT_EQ(best->cost.ctas, 8 * 16 * 224);
  EXPECT_EQ(best->cost.waves, 218);  // ceil(28672 / 132)
  EXPECT_DOUBLE_EQ(best->cost.efficiency_m, 1.0);
}

TEST_F(SelectTest, DecodePicksTheDecodeTile) {
  // gpt-oss-120b decode: 8 tokens per expert. Memory-bound for every tile; a 128-row
  // tile wastes 15/16 of its math, the 64x64 tile needs twice the CTAs of 64x128.
  EXPECT_THAT(RankedNames(Bf16Swiglu(128, 8, 5760, 2880)),
              ElementsAre("bf16_swiglu_m64n128k64", "bf16_swiglu_m64n64k64",
                          "bf16_swiglu_m128n128k64"));
  auto best = SelectKernel(*registry_, Bf16Swiglu(128, 8, 5760, 2880));
  ASSERT_TRUE(best.ok());
  EXPECT_DOUBLE_EQ(best->cost.efficiency_m, 8.0 / 64);
  EXPECT_GE(best->cost.memory_us, best->cost.compute_us);
}

// A decode step with fewer rows than experts touches at most one expert per row: one
// token of Mixtral-8x7B is 2 rows over 8 experts, so the grid is 2 experts' tiles.
TEST_F(SelectTest, FewerRowsThanExpertsCountOnlyTheTouchedExperts) {
  MoeProblem p = Bf16Swiglu(8, 1, 28672, 4096);
  p.tokens = 2;
  const CostEstimate two = CostOf("bf16_swiglu_m64n128k64", p);
  EXPECT_EQ(two.ctas, 2 * 224) << "2 experts x 224 tiles of 128 columns, not 8";
  EXPECT_DOUBLE_EQ(two.efficiency_m, 1.0 / 64);
  p.tokens = 8;  // as many rows as experts: every expert's tiles
  EXPECT_EQ(CostOf("bf16_swiglu_m64n128k64", p).ctas, 8 * 224);
}

// A grid of at most one wave costs by its busiest SM: 64 or 128 CTAs on 132 SMs are one
// CTA per SM, the same time; 192 are two on some SMs. (Counting a whole wave for each
// made a tile that halves a small grid's CTAs look no faster.)
TEST_F(SelectTest, APartialWaveCostsItsBusiestSm) {
  MoeProblem p = Bf16Swiglu(8, 1, 4096, 14336);  // 32 tiles of 128 columns per expert
  p.tokens = 2;
  const CostEstimate one = CostOf("bf16_swiglu_m64n128k64", p);
  p.tokens = 4;
  const CostEstimate two = CostOf("bf16_swiglu_m64n128k64", p);
  p.tokens = 6;
  const CostEstimate three = CostOf("bf16_swiglu_m64n128k64", p);
  EXPECT_EQ(one.ctas, 64);
  EXPECT_EQ(three.ctas, 192);
  EXPECT_DOUBLE_EQ(one.compute_us, two.compute_us);
  EXPECT_DOUBLE_EQ(three.compute_us, 2 * one.compute_us);
}

TEST_F(SelectTest, SmCountChangesWaves) {
  MoeProblem p = Bf16Swiglu(8, 2048, 28672, 4096);
  p.sm_count = 114;  // an H100 PCIe
  auto best = SelectKernel(*registry_, p);
  ASSERT_TRUE(best.ok());
  EXPECT_EQ(best->cost.waves, 252);  // ceil(28672 / 114)
}

TEST_F(SelectTest, FormatsMustMatchExactly) {
  EXPECT_THAT(RankedNames(Problem(DataFormat::kMxfp4, DataFormat::kBf16, Activation::kSwiglu,
                                  128, 64, 1536, 2048)),
              ElementsAre("mxfp4_bf16_swiglu_m64n128k128"));
  EXPECT_THAT(RankedNames(Problem(DataFormat::kFp8, DataFormat::kFp8, Activation::kSwiglu,
                                  128, 64, 1536, 2048)),
              ElementsAre("fp8_fp8_swiglu_m128n128k128"));
  EXPECT_THAT(RankedNames(Problem(DataFormat::kBf16, DataFormat::kBf16, Activation::kRelu2,
                                  128, 64, 1536, 2048)),
              ElementsAre("bf16_relu2_m128n128k64"));
}

TEST_F(SelectTest, ArchitectureDecidesForAnotherGpu) {
  // On a B200 (SM 100) only the sm_100a kernel runs; on the H200 it never does.
  EXPECT_THAT(RankedNames(Bf16Swiglu(8, 256, 4096, 4096, {10, 0})),
              ElementsAre("bf16_swiglu_sm100a_m128n256k64"));
  for (const std::string& name : RankedNames(Bf16Swiglu(8, 256, 4096, 4096))) {
    EXPECT_NE(name, "bf16_swiglu_sm100a_m128n256k64");
  }
}

TEST_F(SelectTest, ShapeConstraintRejectsWithReason) {
  MoeProblem p =
      Problem(DataFormat::kMxfp4, DataFormat::kBf16, Activation::kSwiglu, 128, 128, 5760, 2880);
  // 2880 = 22.5 x 128: the kernel's k_align fails, the mxfp4 block (32) does not.
  EXPECT_THAT(SelectKernel(*registry_, p),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("mxfp4_bf16_swiglu_m64n128k128 (shape: K=2880 is not a "
                                 "multiple of 128 (the kernel's k_align))")));
  p.k = 2900;
  EXPECT_THAT(
      SelectKernel(*registry_, p),
      StatusIs(absl::StatusCode::kNotFound,
               HasSubstr("mxfp4_bf16_swiglu_m64n128k128 (shape: K=2900 is not a multiple of "
                         "32 (the mxfp4 scale block); shape: K=2900 is not a multiple of "
                         "128 (the kernel's k_align))")));
}

TEST(SelectFp8BlockTest, APartialLastScaleBlockIsServed) {
  // fp8-block scales cover ceil(K/128) blocks (kernels/moe_gemm_abi.h), so gpt-oss-120b's
  // K = 2880 (22.5 blocks) runs on a kernel whose k_align (16) it meets; K = 2872 does not.
  std::vector<testing::TestKernel> kernels(1);
  testing::TestKernel& k = kernels[0];
  k.name = "fp8block_fp8block_swiglu_m128n128k128";
  k.weight_format = k.activation_format = "fp8-block";
  k.tile_m = 128;
  k.tile_k = 128;
  k.threads = 384;
  k.extras = "\"k_align\": 16, \"n_align\": 16, \"gated\": true";
  auto r = RegistryOf(kernels);
  ASSERT_TRUE(r.ok()) << r.status();
  MoeProblem p = Problem(DataFormat::kFp8Block, DataFormat::kFp8Block, Activation::kSwiglu, 128,
                         128, 5760, 2880);
  auto best = SelectKernel(*r, p);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "fp8block_fp8block_swiglu_m128n128k128");
  p.k = 2872;
  EXPECT_THAT(SelectKernel(*r, p),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("(shape: K=2872 is not a multiple of 16 (the kernel's k_align))")));
}

TEST_F(SelectTest, OutputWidthAlignmentAppliesToTheGatedHalf) {
  MoeProblem p =
      Problem(DataFormat::kMxfp4, DataFormat::kBf16, Activation::kSwiglu, 8, 64, 1008, 2048);
  EXPECT_THAT(RankedNames(p), ElementsAre("mxfp4_bf16_swiglu_m64n128k128"));  // 504 = 63 x 8
  p.n = 1000;
  EXPECT_THAT(SelectKernel(*registry_, p),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("mxfp4_bf16_swiglu_m64n128k128 (shape: output width 500 "
                                 "(N/2) is not a multiple of 8 (the kernel's n_align))")));
}

TEST_F(SelectTest, MissNamesTheProblemAndTheNearestKernels) {
  // No mxfp4 identity kernel. Nearest: the mxfp4 swiglu kernel (activation only), then
  // bf16 kernels (weight format and activation), ties by name; fp8 and sm_100a ones are
  // further off and not shown.
  MoeProblem p =
      Problem(DataFormat::kMxfp4, DataFormat::kBf16, Activation::kIdentity, 8, 64, 1024, 512);
  EXPECT_THAT(
      SelectKernel(*registry_, p),
      StatusIs(
          absl::StatusCode::kNotFound,
          "no kernel for moe_gemm{weights=mxfp4 activations=bf16 activation=identity "
          "experts=8 tokens=512 (64/expert) n=1024 k=512 sm=90} in test-manifest.json "
          "(7 kernels): nearest: mxfp4_bf16_swiglu_m64n128k128 (activation: kernel "
          "applies swiglu, problem wants identity), bf16_relu2_m128n128k64 (weight "
          "format: kernel takes bf16, problem has mxfp4; activation: kernel applies "
          "relu2, problem wants identity), bf16_swiglu_m128n128k64 (weight format: "
          "kernel takes bf16, problem has mxfp4; activation: kernel applies swiglu, "
          "problem wants identity); use a manifest with a kernel for this problem, or "
          "see --explain for every kernel's verdict"));
}

TEST_F(SelectTest, EmptyRegistryMissSaysSo) {
  Manifest empty;
  empty.source = "empty.json";
  auto r = Registry::Create(empty);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(SelectKernel(*r, Bf16Swiglu(8, 64, 1024, 512)),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("in empty.json (0 kernels): the manifest lists no kernels")));
}

TEST_F(SelectTest, PinnedKernelOverridesRanking) {
  SelectOptions o;
  o.pinned = "bf16_swiglu_m64n64k64";
  EXPECT_THAT(RankedNames(Bf16Swiglu(8, 2048, 28672, 4096), o),
              ElementsAre("bf16_swiglu_m64n64k64"));

  o.pinned = "nope";
  EXPECT_THAT(SelectKernel(*registry_, Bf16Swiglu(8, 2048, 28672, 4096), o),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("pinned kernel 'nope' is not in test-manifest.json")));
  o.pinned = "bf16_relu2_m128n128k64";
  EXPECT_THAT(SelectKernel(*registry_, Bf16Swiglu(8, 2048, 28672, 4096), o),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("pinned kernel 'bf16_relu2_m128n128k64' cannot solve "
                                 "moe_gemm{weights=bf16 activations=bf16 activation=swiglu "
                                 "experts=8 tokens=16384 (2048/expert) n=28672 k=4096 "
                                 "sm=90}: activation: kernel applies relu2, problem wants "
                                 "swiglu; unpin it")));
}

// A kernel that rounds an operand on purpose ("exact": false) is left out unless the caller
// allows inexact kernels or pins it by name, however well the cost model rates it: here a
// copy of the best tile whose name sorts first, so it would win the tie.
TEST_F(SelectTest, InexactKernelOnlyWhenAllowedOrPinned) {
  auto kernels = SelectionKernels();
  auto inexact =
      testing::InexactCopy(kernels, "bf16_swiglu_m128n128k64", "a_inexact_swiglu_m128n128k64");
  ASSERT_TRUE(inexact.has_value());
  kernels.push_back(*inexact);
  auto reg = RegistryOf(kernels);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const MoeProblem p = Bf16Swiglu(8, 2048, 28672, 4096);

  auto best = SelectKernel(*reg, p);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "bf16_swiglu_m128n128k64");
  std::vector<Verdict> verdicts = Explain(*reg, p);
  ASSERT_EQ(verdicts.back().kernel->name(), "a_inexact_swiglu_m128n128k64");
  ASSERT_EQ(verdicts.back().rejections.size(), 1u);
  EXPECT_EQ(verdicts.back().rejections[0].reason, RejectReason::kInexact);
  EXPECT_EQ(RejectReasonName(RejectReason::kInexact), "inexact");
  EXPECT_THAT(verdicts.back().rejections[0].detail,
              HasSubstr("rounds an operand on purpose (manifest \"exact\": false); allow "
                        "inexact kernels or pin it by name"));

  SelectOptions o;
  o.allow_inexact = true;
  best = SelectKernel(*reg, p, o);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "a_inexact_swiglu_m128n128k64");

  SelectOptions pin;
  pin.pinned = "a_inexact_swiglu_m128n128k64";
  best = SelectKernel(*reg, p, pin);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "a_inexact_swiglu_m128n128k64");
}

// A build fills moe_gemm versions kMoeGemmAbiOldest (2) to its own: older kernels of that
// range stay selectable, newer ones are refused by name.
TEST_F(SelectTest, AbiOutsideTheBuildRejects) {
  SelectOptions o;
  o.abi = moe::kMoeGemmAbi;
  EXPECT_TRUE(SelectKernel(*registry_, Bf16Swiglu(8, 64, 1024, 512), o).ok());
  o.abi = 2;
  EXPECT_THAT(SelectKernel(*registry_, Bf16Swiglu(8, 64, 1024, 512), o),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("abi: kernel takes parameter struct version 5, this build "
                                 "fills versions 2 to 2")));
  testing::TestKernel k;
  k.name = "abi2_m64n128k64";
  k.abi = 2;
  auto reg = RegistryOf({k});
  ASSERT_TRUE(reg.ok()) << reg.status();
  auto best = SelectKernel(*reg, Bf16Swiglu(8, 64, 1024, 512), o);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "abi2_m64n128k64");
}

// moe_gemm kernels writing fp8 (version 4, "output_format": "fp8") serve only problems
// that ask for fp8 output; a problem without an output format wants bf16, as every caller
// of a bf16 GEMM reads it, so the fp8 twin is never selected for it, even alone.
TEST_F(SelectTest, Fp8OutputKernelsServeOnlyProblemsThatAskForThem) {
  testing::TestKernel plain;
  plain.name = "fp8_swiglu_m64n128k128";
  plain.weight_format = plain.activation_format = "fp8";
  plain.tile_k = 128;
  plain.abi = moe::kMoeGemmAbiV3;
  testing::TestKernel fused = plain;
  fused.name = "fp8_swiglu_m64n128k128_ofp8";
  fused.abi = moe::kMoeGemmAbiV4;
  fused.extras = "\"output_format\": \"fp8\"";
  MoeProblem p = Problem(DataFormat::kFp8, DataFormat::kFp8, Activation::kSwiglu, 8, 64, 1024,
                         512);
  SelectOptions o;
  o.abi = moe::kMoeGemmAbi;
  auto reg = RegistryOf({fused, plain});
  ASSERT_TRUE(reg.ok()) << reg.status();
  auto best = SelectKernel(*reg, p, o);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "fp8_swiglu_m64n128k128");
  p.output_format = DataFormat::kFp8;
  best = SelectKernel(*reg, p, o);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "fp8_swiglu_m64n128k128_ofp8");

  reg = RegistryOf({fused});
  ASSERT_TRUE(reg.ok()) << reg.status();
  p.output_format.reset();
  EXPECT_THAT(SelectKernel(*reg, p, o),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("output format: kernel writes fp8, problem wants bf16")));
}

// moe_gemm kernels that gather A (version 5, "a_gather": true) serve only problems whose
// rows come through a row map, and such a problem only them: a kernel reading A in order
// would compute on the wrong rows, and a gathering kernel has no map to read otherwise.
TEST_F(SelectTest, GatheringKernelsServeOnlyProblemsThatGather) {
  testing::TestKernel plain;
  plain.name = "bf16_swiglu_m128n128k64";
  plain.tile_m = 128;
  plain.abi = moe::kMoeGemmAbiV3;
  testing::TestKernel gather = plain;
  gather.name = "bf16_swiglu_m128n128k64_gather";
  gather.abi = moe::kMoeGemmAbiV5;
  gather.extras = "\"a_gather\": true";
  MoeProblem p = Bf16Swiglu(8, 2048, 1024, 512);
  SelectOptions o;
  o.abi = moe::kMoeGemmAbi;
  auto reg = RegistryOf({gather, plain});
  ASSERT_TRUE(reg.ok()) << reg.status();
  auto best = SelectKernel(*reg, p, o);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "bf16_swiglu_m128n128k64");
  p.gather_a = true;
  best = SelectKernel(*reg, p, o);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->name(), "bf16_swiglu_m128n128k64_gather");
  EXPECT_THAT(ToString(p), HasSubstr(" gather_a"));
  // A build that fills versions up to 4 knows no row map: it refuses the kernel.
  o.abi = moe::kMoeGemmAbiV4;
  EXPECT_THAT(SelectKernel(*reg, p, o),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("gather of A: kernel reads A's rows in order, problem "
                                 "gathers them through a_row_map")));
  o.abi = moe::kMoeGemmAbi;

  reg = RegistryOf({gather});
  ASSERT_TRUE(reg.ok()) << reg.status();
  p.gather_a = false;
  EXPECT_THAT(SelectKernel(*reg, p, o),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("gather of A: kernel gathers A's rows through a_row_map, "
                                 "problem has them in order")));
}

// Generation 1's parameter struct (version 1) is retired: a manifest that still lists such
// kernels loads, its other kernels serve, and each version-1 kernel is rejected with the
// fix, whatever version the caller fills (0: selection without launching) and when pinned.
TEST_F(SelectTest, RetiredVersionOneKernelsAreRejectedWithTheFix) {
  testing::TestKernel old;
  old.name = "gen1_m128n128k64";  // the better tile for prefill, were it launchable
  old.abi = 1;
  old.tile_m = 128;
  testing::TestKernel current;
  current.name = "gen2_m64n128k64";
  auto reg = RegistryOf({old, current});
  ASSERT_TRUE(reg.ok()) << reg.status();
  const MoeProblem prefill = Bf16Swiglu(8, 2048, 28672, 4096);
  for (int abi : {0, moe::kMoeGemmAbi}) {
    SCOPED_TRACE(abi);
    SelectOptions o;
    o.abi = abi;
    auto best = SelectKernel(*reg, prefill, o);
    ASSERT_TRUE(best.ok()) << best.status();
    EXPECT_EQ(best->kernel->name(), "gen2_m64n128k64");
    const std::vector<Verdict> verdicts = Explain(*reg, prefill, o);
    ASSERT_EQ(verdicts[0].rejections.size(), 1u);
    EXPECT_EQ(verdicts[0].rejections[0].reason, RejectReason::kAbi);
    EXPECT_THAT(verdicts[0].rejections[0].detail,
                HasSubstr("parameter struct version 1 (generation 1) is retired and no "
                          "longer launched; rebuild the family with scripts/build-artifacts"));
    o.pinned = "gen1_m128n128k64";
    EXPECT_THAT(SelectKernel(*reg, prefill, o),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("version 1 (generation 1) is retired")));
  }
}

TEST_F(SelectTest, InvalidProblemIsInvalidArgument) {
  EXPECT_THAT(SelectKernel(*registry_, Bf16Swiglu(0, 64, 1024, 512)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("experts must be at least 1")));
  EXPECT_THAT(SelectKernel(*registry_, Bf16Swiglu(8, 64, 1023, 512)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a gated activation (swiglu) needs an even n")));
}

TEST_F(SelectTest, NoTokensStillSelects) {
  // An empty batch is legal (every expert owns no rows): any candidate will do and the
  // launch does nothing, so selection must not fail.
  auto best = SelectKernel(*registry_, Bf16Swiglu(8, 0, 1024, 512));
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->cost.ctas, 0);
}

// A tile of the family, identity epilogue, as scripts/build-artifacts publishes it
// (threads, shared memory, calibration).
testing::TestKernel FamilyTile(const std::string& format, int tile_m, int tile_n, int tile_k,
                               int threads, int shared_mem_bytes, double mma_efficiency) {
  testing::TestKernel k;
  k.name = absl::StrFormat("%s_identity_m%dn%dk%d", format, tile_m, tile_n, tile_k);
  k.weight_format = k.activation_format = format;
  k.activation = "identity";
  k.tile_m = tile_m;
  k.tile_n = tile_n;
  k.tile_k = tile_k;
  k.threads = threads;
  k.shared_mem_bytes = shared_mem_bytes;
  k.extras = absl::StrFormat("\"mma_efficiency\": %g, \"memory_efficiency\": 0.85",
                             mma_efficiency);
  return k;
}

// The family's bf16 64x256 and 128x256 tiles, both computing whole tiles, with the
// calibration fitted on Mixtral-8x7B's FC1 alone (64x256 at 0.95; the family now says
// 0.82): the tall tile wins evenly spread rows by a few percent, the margin the routed
// tests below turn over.
std::vector<testing::TestKernel> Bf16WideTilesFittedOnMixtral() {
  return {FamilyTile("bf16", 64, 256, 64, 256, 223488, 0.95),
          FamilyTile("bf16", 128, 256, 64, 384, 224512, 0.91)};
}

// Qwen3-30B-A3B's GEMM2 at 4,096 tokens (32,768 rows, 256 per expert): spread evenly, two
// 128-row tiles fill each expert and the tall tile's reuse wins; routed by top-8, about
// half the experts get more than 256 rows and run a third, nearly empty tall tile
// (2.5 per expert against 2), where the 64-row tile runs a fifth of four (4.5 against 4):
// the short tile wins.
TEST(SelectRoutedTest, RoutedRowsPriceThePartlyEmptyLastTile) {
  auto r = RegistryOf(Bf16WideTilesFittedOnMixtral());
  ASSERT_TRUE(r.ok()) << r.status();
  MoeProblem p = Problem(DataFormat::kBf16, DataFormat::kBf16, Activation::kIdentity, 128, 256,
                         2048, 768);
  auto balanced = SelectKernel(*r, p);
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  EXPECT_EQ(balanced->kernel->name(), "bf16_identity_m128n256k64");
  EXPECT_EQ(balanced->cost.ctas, 128 * 2 * 8);

  p.routed_top_k = 8;
  auto routed = SelectKernel(*r, p);
  ASSERT_TRUE(routed.ok()) << routed.status();
  EXPECT_EQ(routed->kernel->name(), "bf16_identity_m64n256k64");
  const RoutedLoad load = p.routed_load();
  EXPECT_EQ(load.tokens, 4096);
  const double tiles = 128 * load.ExpectedTilesPerExpert(64);
  EXPECT_GT(tiles, 128 * 4.45);
  EXPECT_LT(tiles, 128 * 4.55);
  EXPECT_EQ(routed->cost.ctas, static_cast<int64_t>(std::ceil(tiles * 8)));
  EXPECT_NEAR(routed->cost.efficiency_m, 256.0 / (tiles / 128 * 64), 1e-12);
  // Expert parallelism: a rank with 32 of the 128 experts gets the same 256 rows per
  // expert on average - a quarter of its row bucket - not the bucket spread over its 32
  // experts (1,024 each, as the balanced model reads it).
  p.experts = 32;
  p.routed_experts = 128;
  auto rank = SelectKernel(*r, p);
  ASSERT_TRUE(rank.ok()) << rank.status();
  EXPECT_EQ(rank->kernel->name(), "bf16_identity_m64n256k64");
  EXPECT_EQ(rank->cost.ctas, static_cast<int64_t>(std::ceil(32 * tiles / 128 * 8)));
  p.routed_top_k = 0;
  p.routed_experts = 0;
  EXPECT_EQ(CostOfIn(*r, "bf16_identity_m64n256k64", p).ctas, 32 * 16 * 8);
}

// A 128-row tile computing in 64-row steps (two consumer warpgroups, one of which issues
// no wgmma when it owns no row of the tile) says "row_step": 64. The same routed problem:
// an expert's nearly empty third tile costs the tall tile one step, not a whole tile, so
// it computes the rows the 64-row tile does, with its better reuse - and wins again. Its
// grid is still whole tiles.
TEST(SelectRoutedTest, ATileComputingInStepsPricesOnlyItsStepsWithRows) {
  std::vector<testing::TestKernel> kernels = Bf16WideTilesFittedOnMixtral();
  kernels[1].extras += ", \"row_step\": 64";
  auto r = RegistryOf(kernels);
  ASSERT_TRUE(r.ok()) << r.status();
  auto whole = RegistryOf(Bf16WideTilesFittedOnMixtral());
  ASSERT_TRUE(whole.ok()) << whole.status();

  MoeProblem p = Problem(DataFormat::kBf16, DataFormat::kBf16, Activation::kIdentity, 128, 256,
                         2048, 768);
  // Spread evenly, 256 rows fill whole tiles: the steps change nothing.
  const CostEstimate even = CostOfIn(*r, "bf16_identity_m128n256k64", p);
  const CostEstimate even_whole = CostOfIn(*whole, "bf16_identity_m128n256k64", p);
  EXPECT_EQ(even.ctas, even_whole.ctas);
  EXPECT_DOUBLE_EQ(even.compute_us, even_whole.compute_us);
  EXPECT_DOUBLE_EQ(even.efficiency_m, 1.0);

  p.routed_top_k = 8;
  auto routed = SelectKernel(*r, p);
  ASSERT_TRUE(routed.ok()) << routed.status();
  EXPECT_EQ(routed->kernel->name(), "bf16_identity_m128n256k64");
  const RoutedLoad load = p.routed_load();
  const double tiles = load.ExpectedTilesPerExpert(128), steps = load.ExpectedTilesPerExpert(64);
  EXPECT_EQ(routed->cost.ctas, static_cast<int64_t>(std::ceil(128 * tiles * 8)));
  EXPECT_NEAR(routed->cost.efficiency_m, 256.0 / (steps * 64), 1e-12);
  const CostEstimate routed_whole = CostOfIn(*whole, "bf16_identity_m128n256k64", p);
  EXPECT_EQ(routed_whole.ctas, routed->cost.ctas);
  EXPECT_NEAR(routed->cost.compute_us, routed_whole.compute_us * (steps / 2) / tiles,
              1e-9 * routed_whole.compute_us);
  // The 64-row tile: one consumer, its steps are its tiles; its price is unchanged.
  EXPECT_DOUBLE_EQ(CostOfIn(*r, "bf16_identity_m64n256k64", p).time_us,
                   CostOfIn(*whole, "bf16_identity_m64n256k64", p).time_us);
}

// The family's fp8 128-row tiles.
std::vector<testing::TestKernel> FamilyFp8TallTiles() {
  return {FamilyTile("fp8", 128, 128, 128, 384, 224512, 0.82),
          FamilyTile("fp8", 128, 192, 128, 384, 191744, 0.84)};
}

// Every problem selects `name` from the registry.
void ExpectEachTakes(const Registry& registry, const std::vector<MoeProblem>& problems,
                     const std::string& name) {
  for (const MoeProblem& p : problems) {
    SCOPED_TRACE(ToString(p));
    auto best = SelectKernel(registry, p);
    ASSERT_TRUE(best.ok()) << best.status();
    EXPECT_EQ(best->kernel->name(), name);
  }
}

// An identity GEMM of `format` x `format` (E experts, tpe rows each on average, N x K)
// whose rows a top-k router spread.
MoeProblem RoutedProblem(DataFormat format, int64_t e, int64_t tpe, int64_t n, int64_t k,
                         int top_k) {
  MoeProblem p = Problem(format, format, Activation::kIdentity, e, tpe, n, k);
  p.routed_top_k = top_k;
  return p;
}

// Qwen3-30B-A3B's GEMM2 at 4,096 tokens routed top-8 (32,768 rows) and Mixtral-8x7B's at
// 4,096 tokens routed top-2 (8,192 rows): the 128x192 tile ran them in 1/1.16 and 1/1.20
// of the 128x128 tile's time. With the 128x128 tile's calibration the model priced the
// 128x128 tile at most 2.5% cheaper there (on Qwen3's GEMM1 the two tied exactly: 29 waves
// of 128 columns against 20 of 192) and took it; the 128x192 tile's own calibration
// picks it.
TEST(SelectRoutedTest, Fp8WideTileWinsTheRoutedPrefillGemms) {
  auto r = RegistryOf(FamilyFp8TallTiles());
  ASSERT_TRUE(r.ok()) << r.status();
  const MoeProblem qwen3 = RoutedProblem(DataFormat::kFp8, 128, 256, 2048, 768, 8);
  const MoeProblem mixtral = RoutedProblem(DataFormat::kFp8, 8, 1024, 4096, 14336, 2);
  ExpectEachTakes(*r, {qwen3, mixtral}, "fp8_identity_m128n192k128");
  std::vector<testing::TestKernel> equal = FamilyFp8TallTiles();
  equal[1].extras = equal[0].extras;
  auto tied = RegistryOf(equal);
  ASSERT_TRUE(tied.ok()) << tied.status();
  ExpectEachTakes(*tied, {qwen3, mixtral}, "fp8_identity_m128n128k128");
}

// fp8 1x128 blocks, the same tie: routed, the model took the 128x128 tile on Qwen3-30B-A3B's
// GEMM1 and GEMM2 at 4,096 tokens (32,768 rows) and on Mixtral-8x7B's GEMM2 at 4,096 tokens
// (8,192 rows), where the 128x192 tile ran 1.11x, 1.11x and 1.09x faster (H100,
// bench/routed_tiles.py); at Mixtral's 512 rows the 128x128 tile stays (1.20x faster).
// The family calibrates 128x192 at 0.78 (was the 128x128 tile's 0.76).
TEST(SelectRoutedTest, Fp8BlockWideTileWinsTheRoutedPrefillGemms) {
  auto tiles = [](double wide) {
    return std::vector<testing::TestKernel>{
        FamilyTile("fp8-block", 128, 128, 128, 384, 224512, 0.76),
        FamilyTile("fp8-block", 128, 192, 128, 384, 193152, wide)};
  };
  auto r = RegistryOf(tiles(0.78));
  ASSERT_TRUE(r.ok()) << r.status();
  auto routed = [](int64_t e, int64_t tpe, int64_t n, int64_t k, int top_k) {
    return RoutedProblem(DataFormat::kFp8Block, e, tpe, n, k, top_k);
  };
  const std::vector<MoeProblem> wide = {routed(128, 256, 1536, 2048, 8),
                                        routed(128, 256, 2048, 768, 8),
                                        routed(8, 1024, 4096, 14336, 2)};
  ExpectEachTakes(*r, wide, "fp8-block_identity_m128n192k128");
  ExpectEachTakes(*r, {routed(8, 64, 4096, 14336, 2)}, "fp8-block_identity_m128n128k128");
  auto tied = RegistryOf(tiles(0.76));
  ASSERT_TRUE(tied.ok()) << tied.status();
  ExpectEachTakes(*tied, wide, "fp8-block_identity_m128n128k128");
}

// The family's bf16 calibration: on the layer's routed prefill GEMMs the 64x256 tile
// measured slower than the 128x256 one (H100, 32,768 rows routed top-8: Qwen3-30B-A3B's
// GEMM1 528.5 against 432.1 us, GEMM2 261.6 against 239.7; DeepSeek-V3's layer at 4,096
// tokens 15.4 ms on 64x256 tiles, 12.2 on 128-row ones), so the 128x256 tile serves them.
TEST(SelectRoutedTest, Bf16TallTileWinsTheRoutedPrefillGemms) {
  auto r = RegistryOf({FamilyTile("bf16", 64, 256, 64, 256, 223488, 0.82),
                       FamilyTile("bf16", 128, 256, 64, 384, 224512, 0.91)});
  ASSERT_TRUE(r.ok()) << r.status();
  // (experts, rows per expert, N, K): Qwen3's GEMM1 and GEMM2, DeepSeek-V3's GEMM1 and
  // GEMM2, each at 4,096 tokens routed top-8.
  std::vector<MoeProblem> problems;
  for (const auto& [e, tpe, n, k] : std::vector<std::array<int64_t, 4>>{
           {128, 256, 1536, 2048}, {128, 256, 2048, 768}, {256, 128, 4096, 7168},
           {256, 128, 7168, 2048}}) {
    problems.push_back(RoutedProblem(DataFormat::kBf16, e, tpe, n, k, 8));
  }
  ExpectEachTakes(*r, problems, "bf16_identity_m128n256k64");
}

// One token routed to 8 of 128 experts touches 8 experts with one row each, as the
// balanced model's fewer-rows-than-experts rule already says: the same grid either way.
TEST(SelectRoutedTest, ADecodeStepPricesAsItDidSpreadEvenly) {
  auto r = RegistryOf(Bf16WideTilesFittedOnMixtral());
  ASSERT_TRUE(r.ok()) << r.status();
  MoeProblem p = Problem(DataFormat::kBf16, DataFormat::kBf16, Activation::kIdentity, 128, 1,
                         2048, 768);
  p.tokens = 8;
  auto balanced = SelectKernel(*r, p);
  ASSERT_TRUE(balanced.ok()) << balanced.status();
  p.routed_top_k = 8;
  auto routed = SelectKernel(*r, p);
  ASSERT_TRUE(routed.ok()) << routed.status();
  EXPECT_EQ(routed->kernel->name(), balanced->kernel->name());
  EXPECT_EQ(routed->cost.ctas, balanced->cost.ctas);
  EXPECT_EQ(routed->cost.ctas, 8 * 8);
  EXPECT_NEAR(routed->cost.time_us, balanced->cost.time_us, 1e-9 * balanced->cost.time_us);
  EXPECT_NEAR(routed->cost.efficiency_m, balanced->cost.efficiency_m, 1e-12);
  EXPECT_DOUBLE_EQ(balanced->cost.efficiency_m, 1.0 / 64);
}

TEST(SelectRoutedTest, ARoutingTheExpertsCannotTakeIsInvalid) {
  MoeProblem p = Bf16Swiglu(8, 64, 1024, 512);
  p.routed_top_k = 9;
  EXPECT_THAT(ValidateProblem(p),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("routed_top_k=9 must be 0 (balanced rows) or 1..8")));
  p.routed_top_k = 2;
  p.routed_experts = 4;
  EXPECT_THAT(ValidateProblem(p), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("routed_experts=4 must be 0 (the problem's "
                                                     "experts) or at least experts=8")));
  p.routed_top_k = 0;
  p.routed_experts = 16;
  EXPECT_THAT(ValidateProblem(p), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("routed_experts=16 without routed_top_k")));
  p.routed_top_k = 2;
  CUBIST_EXPECT_OK(ValidateProblem(p));
  EXPECT_THAT(ToString(p), HasSubstr(" routed=top2of16}"));
}

TEST(ParseDeviceSmTest, AcceptsTheUsualSpellings) {
  for (const char* s : {"90", "90a", "sm_90", "sm_90a", "9.0"}) {
    auto sm = ParseDeviceSm(s);
    ASSERT_TRUE(sm.ok()) << s << ": " << sm.status();
    EXPECT_EQ(sm->major, 9) << s;
    EXPECT_EQ(sm->minor, 0) << s;
  }
  auto sm = ParseDeviceSm("100f");
  ASSERT_TRUE(sm.ok());
  EXPECT_EQ(sm->number(), 100);
  sm = ParseDeviceSm("120");
  ASSERT_TRUE(sm.ok());
  EXPECT_EQ(sm->major, 12);
  for (const char* s : {"", "9", "hopper", "sm_", "90b", "1000", "9.10"}) {
    EXPECT_THAT(ParseDeviceSm(s), StatusIs(absl::StatusCode::kInvalidArgument,
                                           HasSubstr("expected a compute capability")))
        << s;
  }
}

TEST(MoeTypesTest, NamesRoundTrip) {
  for (const char* f : {"bf16", "fp8", "fp8-block", "mxfp4", "mxfp8", "nvfp4"}) {
    auto parsed = ParseDataFormat(f);
    ASSERT_TRUE(parsed.ok()) << f;
    EXPECT_EQ(DataFormatName(*parsed), f);
  }
  for (const char* a : {"identity", "relu2", "swiglu", "geglu", "situ"}) {
    auto parsed = ParseActivation(a);
    ASSERT_TRUE(parsed.ok()) << a;
    EXPECT_EQ(ActivationName(*parsed), a);
  }
  EXPECT_TRUE(IsGated(Activation::kSitu));
  EXPECT_FALSE(IsGated(Activation::kRelu2));
  EXPECT_EQ(moe::FormatScaleBlock(DataFormat::kNvfp4), 16);
  EXPECT_EQ(moe::FormatScaleBlock(DataFormat::kFp8Block), 128);
  EXPECT_DOUBLE_EQ(BitsPerElement(DataFormat::kMxfp4), 4.25);
}

}  // namespace
}  // namespace cubist
