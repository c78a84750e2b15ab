// Registry: a manifest's kernels validated and indexed (dispatch/registry.h).
#include "dispatch/registry.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/dispatch_manifests.h"
#include "tests/testlib/status_matchers.h"

namespace cubist {
namespace {

using ::cubist::testing::ParseTestManifest;
using ::cubist::testing::SelectionKernels;
using ::cubist::testing::StatusIs;
using ::cubist::testing::TestKernel;
using ::testing::HasSubstr;

absl::StatusOr<Registry> RegistryOf(const std::vector<TestKernel>& kernels) {
  auto m = ParseTestManifest(kernels);
  if (!m.ok()) return m.status();
  return Registry::Create(*m);
}

TEST(RegistryTest, IndexesEveryKernelWithParsedMetadata) {
  auto r = RegistryOf(SelectionKernels());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 7u);
  EXPECT_EQ(r->manifest_name(), "dispatch-test");
  EXPECT_EQ(r->manifest_source(), "test-manifest.json");
  EXPECT_EQ(r->manifest_digest().size(), 64u);

  const KernelEntry* k = r->Find("mxfp4_bf16_swiglu_m64n128k128");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->index, 4u);
  ASSERT_TRUE(k->op.has_value());
  EXPECT_EQ(*k->op, Op::kMoeGemm);
  EXPECT_EQ(k->weight_format, DataFormat::kMxfp4);
  EXPECT_EQ(k->activation_format, DataFormat::kBf16);
  EXPECT_EQ(k->activation, Activation::kSwiglu);
  EXPECT_EQ(k->arch.major, 9);
  EXPECT_EQ(k->arch.minor, 0);
  EXPECT_EQ(k->arch.variant, SmTarget::Variant::kArch);
  EXPECT_EQ(k->constraints.k_multiple, 128);
  EXPECT_EQ(k->constraints.n_multiple, 1);
  EXPECT_EQ(k->constraints.out_n_multiple, 8);
  EXPECT_EQ(k->spec.tile_k, 128);

  EXPECT_EQ(r->Find("no_such_kernel"), nullptr);
  EXPECT_EQ(&r->kernels()[6], r->Find("bf16_swiglu_sm100a_m128n256k64"));
}

TEST(RegistryTest, DuplicateNameIsRejectedNamingBothIndices) {
  auto m = ParseTestManifest(SelectionKernels());
  ASSERT_TRUE(m.ok()) << m.status();
  // The parser refuses duplicates too; the registry must not rely on it (manifests
  // built in memory never pass through the parser).
  KernelSpec dup = m->kernels[1];
  dup.tile_n = 256;
  m->kernels.push_back(dup);
  EXPECT_THAT(Registry::Create(*m),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("test-manifest.json: kernels[7].name: duplicate kernel "
                                 "name 'bf16_swiglu_m64n128k64' (first at kernels[1]); "
                                 "kernel names must be unique")));
}

TEST(RegistryTest, UnknownFormatIsRejected) {
  auto kernels = SelectionKernels();
  kernels[2].weight_format = "fp6";
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[2].weight_format: unknown format 'fp6'; expected "
                                 "one of bf16, fp8, fp8-block, mxfp4, mxfp8, nvfp4, fp16, "
                                 "mxint4")));
  kernels = SelectionKernels();
  kernels[3].activation_format = "int8";
  EXPECT_THAT(RegistryOf(kernels), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("kernels[3].activation_format: "
                                                      "unknown format 'int8'")));
}

TEST(RegistryTest, UnknownActivationIsRejected) {
  auto kernels = SelectionKernels();
  kernels[0].activation = "tanh";
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[0].activation: unknown activation 'tanh'; "
                                 "expected one of identity, relu2, swiglu, geglu, situ, "
                                 "gelu, silu")));
  // gelu is known (trtllm-gen kernels use it) but not a moe_gemm epilogue.
  kernels[0].activation = "gelu";
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[0].activation: op moe_gemm has no gelu epilogue")));
}

TEST(RegistryTest, ImpossibleLaunchShapesAreRejected) {
  auto kernels = SelectionKernels();
  kernels[1].threads = 100;
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[1].threads: must be a multiple of 32 in "
                                 "32..1024, got 100")));
  kernels = SelectionKernels();
  kernels[1].shared_mem_bytes = 300000;
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[1].shared_mem_bytes: 300000 is outside "
                                 "0..232448")));
  kernels = SelectionKernels();
  kernels[1].cluster = {4, 4, 2};
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[1].cluster: 32 CTAs per cluster; at most 16")));
}

TEST(RegistryTest, GatedKernelWithOddTileNIsInconsistent) {
  auto kernels = SelectionKernels();
  kernels[0].tile_n = 63;
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[0].tile_n: a gated activation (swiglu) needs an "
                                 "even tile_n, got 63")));
}

TEST(RegistryTest, GatedFlagContradictingActivationIsInconsistent) {
  auto kernels = SelectionKernels();
  kernels[3].extras = "\"gated\": true";  // relu2 is element-wise
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[3].gated: says true but activation 'relu2' is "
                                 "element-wise; the entry is inconsistent")));
  kernels[3].extras = "\"gated\": false";
  EXPECT_TRUE(RegistryOf(kernels).ok());
}

// The registry refuses kernels[i] with these extras, saying `message`.
void ExpectExtrasRefused(std::vector<TestKernel> kernels, int i, const std::string& extras,
                         const std::string& message) {
  kernels[i].extras = extras;
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(message)));
}

// "exact" (KernelEntry::exact) is a JSON boolean, true when absent.
TEST(RegistryTest, ExactFlagIsABoolean) {
  auto kernels = SelectionKernels();
  ExpectExtrasRefused(kernels, 3, "\"exact\": \"no\"",
                      "kernels[3].exact: expected true or false, got \"no\"");
  kernels[3].extras = "\"exact\": false";
  auto r = RegistryOf(kernels);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->kernels()[3].exact);
  EXPECT_TRUE(r->kernels()[2].exact);
  kernels[3].extras = "\"exact\": true";
  r = RegistryOf(kernels);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->kernels()[3].exact);
}

// "row_step" (KernelEntry::row_step) divides tile_m; tile_m when absent.
TEST(RegistryTest, RowStepDividesTheTilesRows) {
  auto kernels = SelectionKernels();
  // kernels[2]: bf16_swiglu_m128n128k64
  ExpectExtrasRefused(kernels, 2, "\"row_step\": 48",
                      "kernels[2].row_step: 48 does not divide tile_m 128; a tile computes "
                      "its rows in whole steps");
  ExpectExtrasRefused(kernels, 2, "\"row_step\": 256",
                      "kernels[2].row_step: 256 does not divide tile_m 128");
  ExpectExtrasRefused(kernels, 2, "\"row_step\": 0",
                      "kernels[2].row_step: expected a positive integer, got 0");
  kernels[2].extras = "\"row_step\": 64";
  auto r = RegistryOf(kernels);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kernels()[2].row_step, 64);
  EXPECT_EQ(r->kernels()[3].row_step, 128);  // absent: the whole tile
  EXPECT_EQ(r->kernels()[1].row_step, 64);
}

TEST(RegistryTest, OneFunctionDescribedTwiceDifferentlyIsInconsistent) {
  auto kernels = SelectionKernels();
  TestKernel alias = kernels[1];
  alias.name = "alias_of_m64n128";
  alias.function = kernels[1].name;
  alias.artifact = "cubins/sm_90a/bf16_swiglu_m64n128k64.cubin";
  kernels.push_back(alias);
  // Two names for the same function with the same metadata are fine.
  EXPECT_TRUE(RegistryOf(kernels).ok());
  kernels.back().tile_m = 128;
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[7].function: 'bf16_swiglu_m64n128k64' in "
                                 "'cubins/sm_90a/bf16_swiglu_m64n128k64.cubin' is also "
                                 "kernels[1] ('bf16_swiglu_m64n128k64') with different "
                                 "metadata (tile_m 64 vs 128)")));
}

TEST(RegistryTest, MalformedShapeConstraintIsRejected) {
  auto kernels = SelectionKernels();
  kernels[4].extras = "\"k_align\": \"128\"";
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[4].k_align: expected a positive integer, got "
                                 "\"128\"")));
  kernels[4].extras = "\"n_multiple\": 0";
  EXPECT_THAT(RegistryOf(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("kernels[4].n_multiple: expected a positive integer, "
                                 "got 0")));
  kernels[4].extras = "\"max_tokens\": 4096, \"n_multiple\": 64, \"max_k\": 8192";
  auto r = RegistryOf(kernels);
  ASSERT_TRUE(r.ok()) << r.status();
  const ShapeConstraints& c = r->kernels()[4].constraints;
  EXPECT_EQ(c.max_tokens, 4096);
  EXPECT_EQ(c.n_multiple, 64);
  EXPECT_EQ(c.max_k, 8192);
  EXPECT_EQ(c.k_multiple, 1);
  // k_multiple is an alias of k_align; the stricter of the two applies.
  kernels[4].extras = "\"k_multiple\": 64, \"k_align\": 128";
  r = RegistryOf(kernels);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kernels()[4].constraints.k_multiple, 128);
}

TEST(RegistryTest, KernelOfAnotherOpIsKeptButUnparsed) {
  auto kernels = SelectionKernels();
  kernels[5].op = "attention";
  kernels[5].weight_format = "whatever";  // not our vocabulary: not checked
  auto r = RegistryOf(kernels);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->kernels()[5].op.has_value());
  EXPECT_EQ(r->kernels()[5].spec.op, "attention");
}

TEST(RegistryTest, InMemoryManifestArtifactMustExist) {
  auto m = ParseTestManifest(SelectionKernels());
  ASSERT_TRUE(m.ok()) << m.status();
  m->source.clear();
  m->kernels[2].artifact = "cubins/missing.cubin";
  EXPECT_THAT(Registry::Create(*m),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("<memory>: kernels[2].artifact: 'cubins/missing.cubin' is "
                                 "not one of the manifest's artifacts")));
}

TEST(RegistryTest, EmptyManifestGivesEmptyRegistry) {
  auto r = RegistryOf({});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), 0u);
}

}  // namespace
}  // namespace cubist
