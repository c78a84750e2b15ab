// `cubist select` end to end: flags, output, exit codes (cli/select.cc).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/dispatch_manifests.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::CliPath;
using ::cubist::testing::ManifestJson;
using ::cubist::testing::RunCommand;
using ::cubist::testing::SelectionKernels;
using ::cubist::testing::TempDir;
using ::cubist::testing::WriteFileOrDie;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::StartsWith;

class SelectCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manifest_ = dir_.Join("manifest.json");
    WriteFileOrDie(manifest_, ManifestJson(SelectionKernels()));
  }
  // Runs `cubist select --manifest <m> <args>` with an empty cache dir.
  int Select(const std::string& args, std::string* out) {
    return RunCommand("CUBIST_CACHE_DIR=" + dir_.Join("cache") + " " + CliPath() +
                          " select --manifest " + manifest_ + " " + args + " 2>&1",
                      out);
  }
  TempDir dir_;
  std::string manifest_;
};

constexpr char kPrefill[] =
    "--weights bf16 --activations bf16 --activation swiglu --experts 8 "
    "--tokens-per-expert 2048 --n 28672 --k 4096 --sm 90a";

TEST_F(SelectCliTest, PrintsTheWinnerFirst) {
  std::string out;
  ASSERT_EQ(Select(kPrefill, &out), 0) << out;
  EXPECT_THAT(out, StartsWith("bf16_swiglu_m128n128k64\n  rank 1 of 3 candidates on SM "
                              "90 with 132 SMs; estimated "));
  EXPECT_THAT(out, HasSubstr("28672 CTAs, 218 waves of 1/SM"));
  EXPECT_THAT(out, HasSubstr("  bf16_swiglu_m128n128k64 in "
                             "cubins/sm_90a/bf16_swiglu_m128n128k64.cubin, sm_90a, tile "
                             "128x128x64, cluster 1x1x1, 384 threads, 163840 bytes of "
                             "shared memory\n"));
}

// A kernel whose manifest entry says "exact": false is listed as rejected (inexact) and
// chosen only with --allow-inexact (or --kernel NAME), even where the model rates it first.
TEST_F(SelectCliTest, InexactKernelNeedsAllowInexact) {
  auto kernels = SelectionKernels();
  auto inexact =
      testing::InexactCopy(kernels, "bf16_swiglu_m128n128k64", "a_inexact_swiglu_m128n128k64");
  ASSERT_TRUE(inexact.has_value());
  kernels.push_back(*inexact);
  WriteFileOrDie(manifest_, ManifestJson(kernels));
  std::string out;
  ASSERT_EQ(Select(std::string(kPrefill) + " --explain", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("\nrejected a_inexact_swiglu_m128n128k64: inexact: the kernel "
                             "rounds an operand on purpose (manifest \"exact\": false); "
                             "allow inexact kernels or pin it by name to use it\n"));
  EXPECT_THAT(out, HasSubstr("\nselected: bf16_swiglu_m128n128k64\n"));
  ASSERT_EQ(Select(std::string(kPrefill) + " --allow-inexact", &out), 0) << out;
  EXPECT_THAT(out, StartsWith("a_inexact_swiglu_m128n128k64\n  rank 1 of 4 candidates"));
}

TEST_F(SelectCliTest, JsonOutput) {
  std::string out;
  ASSERT_EQ(Select(std::string(kPrefill) + " --json", &out), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["kernel"], "bf16_swiglu_m128n128k64");
  EXPECT_EQ(j["problem"]["tokens"], 16384);
  EXPECT_EQ(j["problem"]["sm"], 90);
  EXPECT_EQ(j["problem"]["sm_count"], 132);
  EXPECT_EQ(j["estimate"]["ctas"], 28672);
  ASSERT_EQ(j["candidates"].size(), 3u);
  EXPECT_EQ(j["candidates"][2]["kernel"], "bf16_swiglu_m64n64k64");
  EXPECT_EQ(j["tile"], nlohmann::json({128, 128, 64}));
  EXPECT_FALSE(j.contains("verdicts"));
}

TEST_F(SelectCliTest, ExplainListsEveryKernel) {
  std::string out;
  ASSERT_EQ(Select(std::string(kPrefill) + " --explain", &out), 0) << out;
  EXPECT_THAT(out, StartsWith("problem: moe_gemm{weights=bf16 activations=bf16 "
                              "activation=swiglu experts=8 tokens=16384 (2048/expert) "
                              "n=28672 k=4096 sm=90}\n#1 bf16_swiglu_m128n128k64: "));
  EXPECT_THAT(out, HasSubstr("\nrejected bf16_relu2_m128n128k64: activation: kernel "
                             "applies relu2, problem wants swiglu\n"));
  EXPECT_THAT(out, HasSubstr("\nrejected bf16_swiglu_sm100a_m128n256k64: arch: sm_100a "
                             "kernel does not run on SM 90"));
  EXPECT_THAT(out, HasSubstr("\nselected: bf16_swiglu_m128n128k64\n"));

  ASSERT_EQ(Select(std::string(kPrefill) + " --explain --json", &out), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["verdicts"].size(), 7u);
  EXPECT_EQ(j["verdicts"][3]["kernel"], "bf16_relu2_m128n128k64");
  EXPECT_EQ(j["verdicts"][3]["rank"], 0);
  EXPECT_EQ(j["verdicts"][3]["rejections"][0]["reason"], "activation");
  EXPECT_EQ(j["verdicts"][2]["rank"], 1);
}

TEST_F(SelectCliTest, OtherGpuPicksItsKernel) {
  std::string out;
  ASSERT_EQ(Select("--weights bf16 --activations bf16 --activation swiglu --experts 8 "
                   "--tokens 4096 --n 4096 --k 4096 --sm 100",
                   &out),
            0)
      << out;
  EXPECT_THAT(out, StartsWith("bf16_swiglu_sm100a_m128n256k64\n"));
  EXPECT_THAT(out, HasSubstr("rank 1 of 1 candidate on SM 100 with 148 SMs; "));
}

TEST_F(SelectCliTest, MissIsExitFiveWithTheNearestKernels) {
  std::string out;
  EXPECT_EQ(Select("--weights nvfp4 --activations nvfp4 --activation swiglu --experts 8 "
                   "--tokens-per-expert 64 --n 1024 --k 512 --sm 90a",
                   &out),
            5)
      << out;
  EXPECT_THAT(out, StartsWith("cubist: error: no kernel for moe_gemm{weights=nvfp4 "
                              "activations=nvfp4 activation=swiglu experts=8 tokens=512 "
                              "(64/expert) n=1024 k=512 sm=90} in "));
  EXPECT_THAT(out, HasSubstr("(7 kernels): nearest: "));
  EXPECT_EQ(Select("--weights nvfp4 --activations nvfp4 --activation swiglu --experts 8 "
                   "--tokens-per-expert 64 --n 1024 --k 512 --sm 90a --json",
                   &out),
            5);
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_TRUE(j["kernel"].is_null());
  EXPECT_THAT(j["error"].get<std::string>(), HasSubstr("nearest: "));
}

TEST_F(SelectCliTest, BadFlagValuesAreUsageErrors) {
  std::string out;
  EXPECT_EQ(Select("--weights fp6 --activations bf16 --experts 8 --tokens-per-expert 4 "
                   "--n 64 --k 64 --sm 90",
                   &out),
            2);
  EXPECT_THAT(out, HasSubstr("cubist: error: --weights: unknown format 'fp6'; expected "
                             "one of bf16, fp8, fp8-block, mxfp4, mxfp8, nvfp4"));
  EXPECT_EQ(Select("--weights bf16 --activations bf16 --activation tanh --experts 8 "
                   "--tokens-per-expert 4 --n 64 --k 64 --sm 90",
                   &out),
            2);
  EXPECT_THAT(out, HasSubstr("--activation: unknown activation 'tanh'"));
  EXPECT_EQ(Select("--op gemv --weights bf16 --activations bf16 --experts 8 "
                   "--tokens-per-expert 4 --n 64 --k 64 --sm 90",
                   &out),
            2);
  EXPECT_THAT(out, HasSubstr("--op: unknown op 'gemv'; expected moe_gemm, trtllm_bmm, moe_route"));
  EXPECT_EQ(Select("--weights bf16 --activations bf16 --experts 8 --tokens-per-expert 4 "
                   "--n 64 --k 64 --sm hopper",
                   &out),
            2);
  EXPECT_THAT(out, HasSubstr("--sm: device SM 'hopper': expected a compute capability"));
  EXPECT_EQ(Select("--weights bf16 --activations bf16 --experts 8 --n 64 --k 64 --sm 90",
                   &out),
            2);
  EXPECT_THAT(out, HasSubstr("give exactly one of --tokens-per-expert T and --tokens"));
  EXPECT_EQ(Select("--weights bf16 --activations bf16 --experts 8 --tokens 4", &out), 2);
  EXPECT_THAT(out, HasSubstr("--n is required"));
}

// --routed-top-k prices the rows as a top-k router spreads them (MoeProblem::
// routed_top_k): Mixtral-8x7B's 16,384 rows routed top-2 leave about half the experts
// a 17th, nearly empty 128-row tile, 28,672 CTAs spread evenly.
TEST_F(SelectCliTest, RoutedRowsArePricedForTheRoutersSpread) {
  std::string out;
  ASSERT_EQ(Select(std::string(kPrefill) + " --routed-top-k 2", &out), 0) << out;
  EXPECT_THAT(out, StartsWith("bf16_swiglu_m128n128k64\n"));
  EXPECT_THAT(out, Not(HasSubstr("28672 CTAs")));
  ASSERT_EQ(Select(std::string(kPrefill) + " --routed-top-k 2 --json", &out), 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["problem"]["routed_top_k"], 2);
  EXPECT_EQ(j["problem"]["routed_experts"], 8);
  // 8,192 tokens to 2 of 8 experts: 2,048 rows each on average, 39 of spread; 16 or 17
  // tiles of 128 rows, 16.5 on average, x 224 tiles of 128 columns x 8 experts.
  const int ctas = j["estimate"]["ctas"];
  EXPECT_GT(ctas, 8 * 224 * 16.4);
  EXPECT_LT(ctas, 8 * 224 * 16.6);
  ASSERT_EQ(Select(std::string(kPrefill) + " --json", &out), 0) << out;
  EXPECT_FALSE(nlohmann::json::parse(out)["problem"].contains("routed_top_k"));

  EXPECT_EQ(Select(std::string(kPrefill) + " --routed-top-k 9", &out), 2);
  EXPECT_THAT(out, HasSubstr("--routed-top-k 9: give 0 (rows spread evenly) or the router's "
                             "top-k, 1..8"));
  EXPECT_EQ(Select(std::string(kPrefill) + " --routed-top-k 2 --routed-experts 4", &out), 2);
  EXPECT_THAT(out, HasSubstr("--routed-experts 4: give the model's experts, at least "
                             "--experts 8"));
  EXPECT_EQ(Select(std::string(kPrefill) + " --routed-experts 16", &out), 2);
  EXPECT_THAT(out, HasSubstr("--routed-experts needs --routed-top-k"));
  // A rank of 8 of 32 experts: a quarter of the rows it would get from 8.
  ASSERT_EQ(Select(std::string(kPrefill) + " --routed-top-k 2 --routed-experts 32 --json", &out),
            0)
      << out;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["problem"]["routed_experts"], 32);
  EXPECT_LT(j["estimate"]["ctas"], 8 * 224 * 4.6);
}

TEST_F(SelectCliTest, PinnedKernel) {
  std::string out;
  ASSERT_EQ(Select(std::string(kPrefill) + " --kernel bf16_swiglu_m64n64k64", &out), 0)
      << out;
  EXPECT_THAT(out, StartsWith("bf16_swiglu_m64n64k64\n  rank 1 of 1 candidate on SM 90 "));
  EXPECT_EQ(Select(std::string(kPrefill) + " --kernel bf16_relu2_m128n128k64", &out), 6);
  EXPECT_THAT(out, HasSubstr("pinned kernel 'bf16_relu2_m128n128k64' cannot solve"));
}

TEST_F(SelectCliTest, BadManifestIsExitEight) {
  WriteFileOrDie(manifest_, "{\"schema\": \"cubist.manifest/1\"");
  std::string out;
  EXPECT_EQ(Select(kPrefill, &out), 8) << out;
  EXPECT_THAT(out, StartsWith("cubist: error: "));
}

// scripts/select-grid: one `cubist select` per cell of a grid, one line each in a fixed
// order (pair, activation, E, tokens per expert, N x K), then a summary. On the prebuilt
// sample set (four kernels): chosen past 1,024 experts (launches over expert groups), the
// shape reason where the pair's kernel cannot take K, and no kernel where the set has
// none of the pair and activation.
TEST(SelectGridTest, PrintsTheChoiceOrTheReasonPerCell) {
  std::string out;
  ASSERT_EQ(RunCommand(::cubist::testing::SourceDir() + "/scripts/select-grid --cubist " +
                           CliPath() + " --manifest " + ::cubist::testing::SourceDir() +
                           "/examples/prebuilt/manifest.json --pairs bf16xbf16,fp8xfp8 "
                           "--acts swiglu,relu2 --experts 8,2048 --tokens 8 --shapes "
                           "5760x2880,1024x1000 --jobs 2 2>&1",
                       &out),
            0)
      << out;
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 16u + 3u) << out;  // 2 x 2 x 2 x 1 x 2 cells, summary, 2 kernels
  const std::string bf16 = "moe_gemm_tma_bf16_bf16_swiglu_m64n128k64 [0-9]+\\.[0-9]us";
  EXPECT_THAT(lines[0], MatchesRegex("bf16xbf16 swiglu E=8 tpe=8 N=5760 K=2880: " + bf16));
  EXPECT_THAT(lines[1], MatchesRegex("bf16xbf16 swiglu E=8 tpe=8 N=1024 K=1000: " + bf16));
  EXPECT_THAT(lines[2], MatchesRegex("bf16xbf16 swiglu E=2048 tpe=8 N=5760 K=2880: " + bf16));
  EXPECT_EQ(lines[4], "bf16xbf16 relu2 E=8 tpe=8 N=5760 K=2880: no kernel: none of this pair "
                      "and activation");
  EXPECT_EQ(lines[8], "fp8xfp8 swiglu E=8 tpe=8 N=5760 K=2880: no kernel: none of this pair "
                      "and activation");
  EXPECT_THAT(lines[12], MatchesRegex("fp8xfp8 relu2 E=8 tpe=8 N=5760 K=2880: "
                                      "moe_gemm_tma_fp8_fp8_relu2_m64n128k128 .*"));
  EXPECT_EQ(lines[13], "fp8xfp8 relu2 E=8 tpe=8 N=1024 K=1000: no kernel: shape: K=1000 is "
                       "not a multiple of 16 (the kernel's k_align)");
  EXPECT_EQ(lines[16], "# 16 cells: 6 chosen, 10 refused, 0 errors; 2 kernels chosen");
  EXPECT_EQ(lines[17], "#       4 moe_gemm_tma_bf16_bf16_swiglu_m64n128k64");
  EXPECT_EQ(lines[18], "#       2 moe_gemm_tma_fp8_fp8_relu2_m64n128k128");
}

}  // namespace
}  // namespace cubist
