// Importing a FlashInfer trtllm-gen pin (manifest/flashinfer_import.h) and selecting
// among its kernels (op trtllm_bmm).
#include "manifest/flashinfer_import.h"

#include "base/sha256.h"
#include "dispatch/registry.h"
#include "dispatch/selector.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "manifest/checksums.h"
#include "manifest/manifest_parser.h"
#include "manifest/manifest_writer.h"
#include "tests/testlib/flashinfer_pin.h"
#include "tests/testlib/status_matchers.h"
#include "tests/testlib/temp_files.h"

namespace cubist {
namespace {

using ::cubist::testing::DefaultPinKernels;
using ::cubist::testing::MetaInfoHeader;
using ::cubist::testing::PinKernel;
using ::cubist::testing::TempDir;
using ::cubist::testing::WritePin;
using ::cubist::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kPin[] = "d2c5915bf45ae64308a947824c14966c2718a292/batched_gemm-91e0ba0-896b90b";

class ImportTest : public ::testing::Test {
 protected:
  absl::StatusOr<Manifest> Import(const std::vector<PinKernel>& kernels) {
    hashes_ = WritePin(dir_.path(), kernels);
    return ImportFrom(cubist::testing::ReadFileOrDie(dir_.Join("include/flashinferMetaInfo.h")));
  }
  absl::StatusOr<Manifest> ImportFrom(const std::string& header) {
    auto sums = ParseChecksums(cubist::testing::ReadFileOrDie(dir_.Join("checksums.txt")),
                               absl::StrCat("https://h/", kPin, "/checksums.txt"));
    if (!sums.ok()) return sums.status();
    FlashinferImportOptions o;
    o.pin = kPin;
    return ImportFlashinferPin(*sums, header, "include/flashinferMetaInfo.h", o);
  }
  TempDir dir_;
  std::vector<std::string> hashes_;
};

TEST_F(ImportTest, KernelsCarryTheHeadersMetadata) {
  auto m = Import(DefaultPinKernels());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "batched_gemm-91e0ba0-896b90b");
  ASSERT_EQ(m->artifacts.size(), 5u);  // three cubins, the header, checksums.txt
  EXPECT_EQ(m->artifacts[4].path, "checksums.txt");
  EXPECT_EQ(m->artifacts[4].sha256,
            Sha256Hex(cubist::testing::ReadFileOrDie(dir_.Join("checksums.txt"))));
  ASSERT_EQ(m->kernels.size(), 3u);
  const KernelSpec& k = m->kernels[0];
  EXPECT_EQ(k.op, "trtllm_bmm");
  EXPECT_EQ(k.artifact, "Bmm_Bfloat16_MxE2m1Bfloat16_Fp32_t128x8x256_s4_et128x8_m128x8x32_"
                        "c1x1x1_rM_TN_transOut_swiGlu_sm100f.cubin");
  EXPECT_EQ(k.arch, "sm_100f");
  EXPECT_EQ(k.weight_format, "mxfp4");
  EXPECT_EQ(k.activation_format, "bf16");
  EXPECT_EQ(k.activation, "swiglu");
  EXPECT_EQ(k.tile_m, 8);    // tokens: trtllm's tile N, the output being transposed
  EXPECT_EQ(k.tile_n, 128);  // weight rows
  EXPECT_EQ(k.tile_k, 256);
  EXPECT_EQ(k.stages, 4);
  EXPECT_EQ(k.threads, 384);
  EXPECT_EQ(k.shared_mem_bytes, 150528);
  EXPECT_EQ(k.extras.at("gated"), "true");
  EXPECT_EQ(k.extras.at("dtype_a"), "\"MxE2m1\"");
  EXPECT_EQ(k.extras.at("output_format"), "\"bf16\"");
  EXPECT_EQ(k.extras.at("trtllm_tile"), "[128,8,256]");
  EXPECT_EQ(k.extras.at("layout_a"), "\"MajorK\"");
  EXPECT_EQ(m->kernels[2].arch, "sm_103a");
  EXPECT_EQ(m->kernels[2].weight_format, "fp8");
  EXPECT_EQ(m->kernels[2].activation, "relu2");
  EXPECT_EQ(m->extras.at("flashinfer_pin"), absl::StrCat("\"", kPin, "\""));
  // It survives the JSON round trip (which wants sizes) and the registry.
  for (Artifact& a : m->artifacts) a.size = 1;
  auto back = ParseManifest(WriteManifest(*m), "m.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(SameContent(*back, *m));
  CUBIST_EXPECT_OK(Registry::Create(*back));
}

TEST_F(ImportTest, DeepSeekFp8AndGeluAreNamed) {
  auto kernels = DefaultPinKernels();
  kernels[2].deepseek_fp8 = 1;
  kernels[2].eltwise_act = 1;
  auto m = Import(kernels);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->kernels[2].weight_format, "fp8-block");
  EXPECT_EQ(m->kernels[2].activation, "gelu");
}

TEST_F(ImportTest, HeaderHashThatContradictsChecksumsIsDataLoss) {
  auto kernels = DefaultPinKernels();
  hashes_ = WritePin(dir_.path(), kernels);
  std::vector<std::string> lying = hashes_;
  lying[1] = Sha256Hex("something else");
  auto sums = ParseChecksums(cubist::testing::ReadFileOrDie(dir_.Join("checksums.txt")),
                             "checksums.txt");
  ASSERT_TRUE(sums.ok());
  // Without the header's own line, so that the per-kernel checks are the ones that fire.
  sums->artifacts.pop_back();
  // Same file name, other bytes.
  EXPECT_THAT(ImportFlashinferPin(*sums, MetaInfoHeader(kernels, lying), "h.h"),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr(absl::StrCat("h.h:58: kernel ", kernels[1].function,
                                              ": the header's sha256 ", lying[1]))));
  // A cubin checksums.txt does not list at all.
  sums->artifacts.erase(sums->artifacts.begin() + 1);
  EXPECT_THAT(ImportFlashinferPin(*sums, MetaInfoHeader(kernels, lying), "h.h"),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("is not in checksums.txt; the header and checksums.txt "
                                 "come from different pins")));
}

TEST_F(ImportTest, EditedHeaderIsCaughtByItsChecksum) {
  hashes_ = WritePin(dir_.path(), DefaultPinKernels());
  std::string header = cubist::testing::ReadFileOrDie(dir_.Join("include/flashinferMetaInfo.h"));
  header += "\n";
  EXPECT_THAT(ImportFrom(header),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("the header belongs to another pin or is corrupt")));
}

TEST_F(ImportTest, UnknownDtypeNamesTheKernel) {
  auto kernels = DefaultPinKernels();
  kernels[0].dtype_a = 12345;
  EXPECT_THAT(Import(kernels),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("kernel ", kernels[0].function,
                                              ": option mDtypeA: unknown trtllm-gen dtype "
                                              "code 12345"))));
}

TEST_F(ImportTest, SelectChoosesByFormatActivationAndTile) {
  auto m = Import(DefaultPinKernels());
  ASSERT_TRUE(m.ok()) << m.status();
  auto r = Registry::Create(*m);
  ASSERT_TRUE(r.ok()) << r.status();
  MoeProblem p;
  p.op = Op::kTrtllmBmm;
  p.weight_format = DataFormat::kMxfp4;
  p.activation_format = DataFormat::kBf16;
  p.activation = Activation::kSwiglu;
  p.experts = 8;
  p.tokens = 8 * 64;
  p.n = 4096;
  p.k = 2048;
  p.sm = {10, 0};
  auto best = SelectKernel(*r, p);
  ASSERT_TRUE(best.ok()) << best.status();
  // 64 tokens per expert fill the 64-wide tile; the 8-wide one needs 8 times the CTAs.
  EXPECT_EQ(best->kernel->spec.tile_m, 64);
  p.tokens = 8 * 4;
  best = SelectKernel(*r, p);
  ASSERT_TRUE(best.ok()) << best.status();
  EXPECT_EQ(best->kernel->spec.tile_m, 8);
  // The moe_gemm op has no kernel here.
  p.op = Op::kMoeGemm;
  EXPECT_THAT(SelectKernel(*r, p), StatusIs(absl::StatusCode::kNotFound, HasSubstr("op:")));
  // An output format no kernel writes.
  p.op = Op::kTrtllmBmm;
  p.output_format = DataFormat::kNvfp4;
  EXPECT_THAT(SelectKernel(*r, p),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("output format: kernel writes bf16, problem wants nvfp4")));
}

TEST_F(ImportTest, OnHopperTheMissNamesTheSetsArchitectures) {
  auto m = Import(DefaultPinKernels());
  ASSERT_TRUE(m.ok()) << m.status();
  auto r = Registry::Create(*m);
  ASSERT_TRUE(r.ok()) << r.status();
  MoeProblem p;
  p.op = Op::kTrtllmBmm;
  p.weight_format = DataFormat::kMxfp4;
  p.activation_format = DataFormat::kBf16;
  p.activation = Activation::kSwiglu;
  p.experts = 8;
  p.tokens = 64;
  p.n = 4096;
  p.k = 2048;
  p.sm = {9, 0};
  EXPECT_THAT(SelectKernel(*r, p),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("its trtllm_bmm kernels are for sm_100f (2), sm_103a (1) and "
                                 "none runs on SM 90: run on one of those GPUs or use a set "
                                 "built for this one")));
}

TEST(FlashinferPinFromLocationTest, TakesTheCommitAndTheDirectory) {
  EXPECT_EQ(FlashinferPinFromLocation(absl::StrCat("https://h/a/", kPin, "/checksums.txt")), kPin);
  EXPECT_EQ(FlashinferPinFromLocation(absl::StrCat(kPin, "/checksums.txt")), kPin);
  EXPECT_EQ(FlashinferPinFromLocation("/x/y/checksums.txt"), "");
  EXPECT_EQ(FlashinferPinFromLocation("checksums.txt"), "");
}

TEST(RegistryOpSupportTest, MoeGemmKernelsCannotClaimTrtllmOnlyFormats) {
  Manifest m;
  m.source = "m.json";
  m.artifacts.push_back({"a.cubin", std::string(64, 'a'), 1, {}});
  KernelSpec k;
  k.name = "k";
  k.artifact = "a.cubin";
  k.function = "f";
  k.arch = "sm_90a";
  k.op = "moe_gemm";
  k.abi = 1;
  k.weight_format = "fp16";
  k.activation_format = "bf16";
  k.activation = "identity";
  k.tile_m = k.tile_n = k.tile_k = 64;
  k.stages = 2;
  k.threads = 128;
  m.kernels.push_back(k);
  EXPECT_THAT(Registry::Create(m),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "m.json: kernels[0].weight_format: op moe_gemm has no fp16 kernels"));
}

}  // namespace
}  // namespace cubist
