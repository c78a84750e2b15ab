// `cubist run` flag checks that need no GPU (cli/run.cc, cli/run_moe_layer.cc): a bad
// layer option or op is a usage error (exit 2) naming the flag or option, found before
// any runtime is opened, so the manifest need not even exist.
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testlib/build_paths.h"
#include "tests/testlib/child_process.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::CliPath;
using ::cubist::testing::RunCommand;
using ::cubist::testing::TempDir;
using ::testing::HasSubstr;

class RunCliTest : public ::testing::Test {
 protected:
  int Run(const std::string& args, std::string* out) {
    return RunCommand("CUBIST_CACHE_DIR=" + dir_.Join("cache") + " " + CliPath() +
                          " run --manifest " + dir_.Join("absent/manifest.json") + " " + args +
                          " 2>&1",
                      out);
  }
  TempDir dir_;
};

constexpr char kLayer[] =
    "--op moe --weights bf16 --activations bf16 --activation swiglu --experts 8 "
    "--hidden 64 --intermediate 64 ";

TEST_F(RunCliTest, LayerOptionsAreCheckedBeforeTheRuntimeOpens) {
  std::string out;
  EXPECT_EQ(Run(std::string(kLayer) + "--top-k 9 --tokens 4", &out), 2);
  EXPECT_THAT(out, HasSubstr("cubist: error: moe layer: top_k: 9 is outside 1..num_experts (8)"));
  EXPECT_EQ(Run(std::string(kLayer) + "--top-k 2 --tokens 4 --routing softmax", &out), 2);
  EXPECT_THAT(out, HasSubstr("routing_method: unknown 'softmax'; expected one of default, "
                             "renormalize, renormalize_naive, deepseek_v3"));
  EXPECT_EQ(Run(std::string(kLayer) +
                    "--top-k 2 --tokens 4 --routing deepseek_v3 --n-group 3 --topk-group 1",
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("n_group: 3 does not divide num_experts (8)"));
  EXPECT_EQ(Run(std::string(kLayer) + "--top-k 2", &out), 2);
  EXPECT_THAT(out, HasSubstr("--tokens: give the batch's token count (T)"));
  EXPECT_EQ(Run("--op moe --weights bf16 --activations bf16 --activation tanh --experts 8 "
                "--hidden 64 --intermediate 64 --top-k 2 --tokens 4",
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("--activation: unknown activation 'tanh'"));
}

TEST_F(RunCliTest, MaskedLayoutFlagsAreCheckedBeforeTheRuntimeOpens) {
  std::string out;
  const std::string masked = std::string(kLayer) + "--input-layout expert_major_masked ";
  EXPECT_EQ(Run(masked + "--max-m 0", &out), 2);
  EXPECT_THAT(out, HasSubstr("cubist: error: moe layer: max_m: 0 is outside 1.."));
  EXPECT_EQ(Run(masked + "--max-m 16 --top-k 2", &out), 2);
  EXPECT_THAT(out, HasSubstr("moe layer: top_k: is a routing option; expert_major_masked "
                             "input is routed already"));
  EXPECT_EQ(Run(masked + "--max-m 16 --tokens 4", &out), 2);
  EXPECT_THAT(out, HasSubstr("--tokens: expert_major_masked input has E x max_m rows; give "
                             "--max-m instead"));
  EXPECT_EQ(Run(std::string(kLayer) + "--input-layout expert_major --max-m 16", &out), 2);
  EXPECT_THAT(out, HasSubstr("input_layout: 'expert_major' is not token_major or "
                             "expert_major_masked"));
  // Valid flags get past the checks to the runtime, whose manifest is absent here.
  EXPECT_EQ(Run(masked + "--max-m 16", &out), 5);
  EXPECT_THAT(out, ::testing::Not(HasSubstr("moe layer:")));
}

// --fuse-intermediate-quantization: a known mode, "on" for the fp8 x fp8 pair only.
TEST_F(RunCliTest, FuseIntermediateQuantizationIsCheckedBeforeTheRuntimeOpens) {
  std::string out;
  EXPECT_EQ(Run(std::string(kLayer) + "--top-k 2 --tokens 4 "
                "--fuse-intermediate-quantization maybe",
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("moe layer: fuse_intermediate_quantization: 'maybe' is not "
                             "auto, on or off"));
  EXPECT_EQ(Run(std::string(kLayer) + "--top-k 2 --tokens 4 "
                "--fuse-intermediate-quantization on",
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("'on' needs the fp8 x fp8 (per-tensor) pair"));
  EXPECT_EQ(Run("--op moe --weights fp8 --activations fp8 --activation swiglu --experts 8 "
                "--hidden 64 --intermediate 64 --top-k 2 --tokens 4 "
                "--fuse-intermediate-quantization on",
                &out),
            5);
  EXPECT_THAT(out, ::testing::Not(HasSubstr("moe layer:")));
}

// --pdl: on or off, refused before the runtime opens (no manifest is read).
TEST_F(RunCliTest, PdlModeIsCheckedBeforeTheRuntimeOpens) {
  std::string out;
  EXPECT_EQ(Run(std::string(kLayer) + "--top-k 2 --tokens 4 --pdl maybe", &out), 2);
  EXPECT_THAT(out, HasSubstr("--pdl: 'maybe' is not on or off"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("manifest")));
}

// --fuse-gather: a known mode, "on" for the bf16 x bf16 pair only.
TEST_F(RunCliTest, FuseGatherIsCheckedBeforeTheRuntimeOpens) {
  std::string out;
  EXPECT_EQ(Run(std::string(kLayer) + "--top-k 2 --tokens 4 --fuse-gather always", &out), 2);
  EXPECT_THAT(out, HasSubstr("moe layer: fuse_gather: 'always' is not auto, on or off"));
  EXPECT_EQ(Run("--op moe --weights fp8 --activations fp8 --activation swiglu --experts 8 "
                "--hidden 64 --intermediate 64 --top-k 2 --tokens 4 --fuse-gather on",
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("'on' needs the bf16 x bf16 pair; the fp8 x fp8 pair gathers "
                             "the rows inside its quantize kernel"));
  for (const char* mode : {"on", "off"}) {
    EXPECT_EQ(Run(std::string(kLayer) + "--top-k 2 --tokens 4 --fuse-gather " + mode, &out), 5)
        << mode;
    EXPECT_THAT(out, ::testing::Not(HasSubstr("moe layer:")));
  }
}

// --nvfp4-gemm-inputs: a known mode, "decoded" for the nvfp4 x nvfp4 pair only; the
// nvfp4 x bf16 pair is served.
TEST_F(RunCliTest, Nvfp4GemmInputsAreCheckedBeforeTheRuntimeOpens) {
  std::string out;
  const std::string nvfp4 =
      "--op moe --weights nvfp4 --activations nvfp4 --activation swiglu --experts 8 "
      "--hidden 64 --intermediate 64 --top-k 2 --tokens 4 ";
  EXPECT_EQ(Run(nvfp4 + "--nvfp4-gemm-inputs bf16", &out), 2);
  EXPECT_THAT(out, HasSubstr("moe layer: nvfp4_gemm_inputs: 'bf16' is not auto, packed or "
                             "decoded"));
  EXPECT_EQ(Run(std::string(kLayer) + "--top-k 2 --tokens 4 --nvfp4-gemm-inputs decoded",
                &out),
            2);
  EXPECT_THAT(out, HasSubstr("'decoded' needs the nvfp4 x nvfp4 pair"));
  for (const char* mode : {"decoded", "packed"}) {
    EXPECT_EQ(Run(nvfp4 + "--nvfp4-gemm-inputs " + mode, &out), 5) << mode;
    EXPECT_THAT(out, ::testing::Not(HasSubstr("moe layer:")));
  }
  EXPECT_EQ(Run("--op moe --weights nvfp4 --activations bf16 --activation swiglu --experts 8 "
                "--hidden 64 --intermediate 64 --top-k 2 --tokens 4",
                &out),
            5);
  EXPECT_THAT(out, ::testing::Not(HasSubstr("moe layer:")));
}

TEST_F(RunCliTest, UnservedPairIsUnimplementedNotAUsageError) {
  std::string out;
  const int rc = Run(
      "--op moe --weights mxfp4 --activations fp8 --experts 8 --hidden 64 "
      "--intermediate 64 --top-k 2 --tokens 4",
      &out);
  EXPECT_EQ(rc, 1);
  EXPECT_THAT(out, HasSubstr("the mxfp4 x fp8 pair is not served by the layer (bf16 x bf16"));
}

TEST_F(RunCliTest, BadOpAndMissingGemmShape) {
  std::string out;
  EXPECT_EQ(Run("--op gemv --weights bf16 --activations bf16 --experts 8 --tokens 4", &out), 2);
  EXPECT_THAT(out, HasSubstr("--op: 'gemv' is not moe_gemm (one GEMM) or moe (the routed layer)"));
  EXPECT_EQ(Run("--weights bf16 --activations bf16 --experts 8 --tokens 4", &out), 2);
  EXPECT_THAT(out, HasSubstr("--n and --k are required for --op moe_gemm"));
}

}  // namespace
}  // namespace cubist
