#include "tests/testlib/flashinfer_pin.h"

#include <cctype>

#include "absl/strings/str_cat.h"
#include "base/sha256.h"
#include "tests/testlib/temp_files.h"

namespace cubist::testing {

std::vector<PinKernel> DefaultPinKernels() {
  PinKernel mx;
  mx.function = "bmm_Bfloat16_MxE2m1Bfloat16_Fp32_t128x8x256_s4_et128x8_m128x8x32_c1x1x1_rM_"
                "TN_transOut_swiGlu_sm100f";
  mx.fused_act = 1;
  mx.act_type = 0;
  PinKernel mx_wide = mx;
  mx_wide.function = "bmm_Bfloat16_MxE2m1Bfloat16_Fp32_t128x64x256_s4_et128x64_m128x64x32_"
                     "c1x1x1_rM_TN_transOut_swiGlu_sm100f";
  mx_wide.tile_n = 64;
  PinKernel fp8;
  fp8.function = "bmm_E4m3_E4m3E4m3_Fp32_t128x16x128_s3_et128x16_m128x16x32_c1x1x1_rM_TN_"
                 "transOut_relu2_sm103a";
  fp8.dtype_a = fp8.dtype_b = fp8.dtype_c = kDtypeE4m3;
  fp8.tile_n = 16;
  fp8.tile_k = 128;
  fp8.eltwise_act = 2;
  fp8.sm = "Sm103a";
  fp8.threads = 256;
  return {mx, mx_wide, fp8};
}

std::string MetaInfoHeader(const std::vector<PinKernel>& kernels,
                           const std::vector<std::string>& hashes) {
  std::string h =
      "/*\n* SPDX-License-Identifier: Apache-2.0 (a test file in the generator's shape)\n*/\n\n"
      "#pragma once\n\n#include <flashinfer/trtllm/batched_gemm/trtllmGen_bmm_export/"
      "BatchedGemmOptions.h>\n\nnamespace batchedGemm {\n\nnamespace tensorrt_llm\n{\n\n"
      "namespace kernels\n{\n// clang-format off\n\n#define TLLM_GEN_EXPORT_VERSION \"7.0.4.0.4.0\"\n\n";
  absl::StrAppend(&h, "static constexpr size_t tllmGenBatchedGemmListLen = ", kernels.size(),
                  ";\n\n\nstatic const batchedGemm::BatchedGemmConfig tllmGenBatchedGemmList[] = {\n"
                  "#ifndef EXCLUDE_SM_100\n");
  for (size_t i = 0; i < kernels.size(); ++i) {
    const PinKernel& k = kernels[i];
    auto opt = [&](const char* name, const std::string& value) {
      absl::StrAppend(&h, ", /* ", name, " */ ", value, "\n");
    };
    absl::StrAppend(&h, "{nullptr, 0, ", k.smem, ", \"", k.function, "\", ", k.threads, ", \"",
                    hashes[i], "\", \"\", nullptr, nullptr, nullptr, 0, { /* mAllReduceAlgo */ "
                    "gemm::AllReduceAlgo(0)\n");
    auto dtype = [](int64_t code) { return absl::StrCat("trtllm::gen::Dtype(", code, ")"); };
    opt("mBiasDtype", dtype(kDtypeFp32));
    opt("mBlockK", "-1");
    opt("mClusterDimX", "1");
    opt("mClusterDimY", "1");
    opt("mClusterDimZ", "1");
    opt("mDtypeAcc", dtype(kDtypeFp32));
    opt("mDtypeA", dtype(k.dtype_a));
    opt("mDtypeB", dtype(k.dtype_b));
    opt("mDtypeC", dtype(k.dtype_c));
    opt("mEltwiseActType", absl::StrCat("gemm::EltwiseActType(", k.eltwise_act, ")"));
    opt("mEpilogueTileM", absl::StrCat(k.tile_m));
    opt("mEpilogueTileN", absl::StrCat(k.tile_n));
    opt("mKernelTraits", "{}");
    opt("mLayoutA", "gemm::MatrixLayout(0)");
    opt("mLayoutB", "gemm::MatrixLayout(0)");
    opt("mMmaK", "32");
    opt("mMmaKind", "trtllm::gen::MmaKind(2)");
    opt("mMmaM", absl::StrCat(k.tile_m));
    opt("mMmaN", absl::StrCat(k.tile_n));
    opt("mNumStagesA", "4");
    opt("mTileK", absl::StrCat(k.tile_k));
    opt("mTileM", absl::StrCat(k.tile_m));
    opt("mTileN", absl::StrCat(k.tile_n));
    opt("mTransposeMmaOutput", "1");
    opt("mUseDeepSeekFp8", absl::StrCat(k.deepseek_fp8));
    opt("mUseShuffledMatrix", "1");
    opt("mActType", absl::StrCat("gemmGatedAct::ActType(", k.act_type, ")"));
    opt("mBatchedM", "{}");
    opt("mBatchMode", "batchedGemm::BatchedGemmOptions::BatchMode(1)");
    opt("mFusedAct", absl::StrCat(k.fused_act));
    opt("mRouteSfsImpl", "{batchedGemm::RouteImpl(0)}");
    absl::StrAppend(&h, " }, gemm::SmVersion::", k.sm, "},\n");
  }
  h += "#endif // EXCLUDE_SM_100\n};\n// clang-format on\n} // namespace kernels\n"
       "} // namespace tensorrt_llm\n\n}\n";
  return h;
}

std::vector<std::string> WritePin(const std::string& dir, const std::vector<PinKernel>& kernels,
                                  const std::string& header_path) {
  std::vector<std::string> hashes;
  std::string sums;
  for (size_t i = 0; i < kernels.size(); ++i) {
    std::string name = kernels[i].function;
    name[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(name[0])));
    name += ".cubin";
    const std::string bytes = RandomBytes(1000 + 97 * i, 7 + i);
    WriteFileOrDie(dir + "/" + name, bytes);
    hashes.push_back(Sha256Hex(bytes));
    absl::StrAppend(&sums, hashes.back(), "  ", name, "\n");
  }
  const std::string header = MetaInfoHeader(kernels, hashes);
  WriteFileOrDie(dir + "/" + header_path, header);
  absl::StrAppend(&sums, Sha256Hex(header), "  ", header_path, "\n");
  WriteFileOrDie(dir + "/checksums.txt", sums);
  return hashes;
}

}  // namespace cubist::testing
