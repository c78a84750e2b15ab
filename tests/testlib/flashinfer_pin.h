// Small FlashInfer trtllm-gen pins for tests: cubin files (random bytes, named as
// FlashInfer names them), checksums.txt, and include/flashinferMetaInfo.h in the
// generator's syntax with trtllm-gen's enum values as they appear in a real pin.
#ifndef CUBIST_TESTS_TESTLIB_FLASHINFER_PIN_H_
#define CUBIST_TESTS_TESTLIB_FLASHINFER_PIN_H_

#include <cstdint>
#include <string>
#include <vector>

namespace cubist::testing {

// trtllm-gen Dtype codes, as the header prints them (trtllm::gen::Dtype(<code>)).
inline constexpr int64_t kDtypeBfloat16 = 1052672;
inline constexpr int64_t kDtypeE4m3 = 1050629;
inline constexpr int64_t kDtypeE2m1 = 17826818;
inline constexpr int64_t kDtypeMxE2m1 = 17826828;
inline constexpr int64_t kDtypeMxE4m3 = 17827853;
inline constexpr int64_t kDtypeFp32 = 1056776;

struct PinKernel {
  std::string function;  // "bmm_Bfloat16_MxE2m1Bfloat16_..._sm100f"
  int64_t dtype_a = kDtypeMxE2m1;  // weights (the output is transposed)
  int64_t dtype_b = kDtypeBfloat16;
  int64_t dtype_c = kDtypeBfloat16;
  int tile_m = 128;  // along weight rows
  int tile_n = 8;    // along tokens
  int tile_k = 256;
  int fused_act = 0;     // 1: gated, act_type applies
  int act_type = 2;      // 0 SwiGlu, 1 GeGlu, 2 None
  int eltwise_act = 0;   // 0 None, 1 Gelu, 2 Relu2, 3 Silu
  int deepseek_fp8 = 0;
  std::string sm = "Sm100f";
  int smem = 150528;
  int threads = 384;
};

// Three kernels of distinct formats, activations, tiles and SMs.
std::vector<PinKernel> DefaultPinKernels();

// The header text for `kernels`, whose cubin hashes are `hashes` (same order).
std::string MetaInfoHeader(const std::vector<PinKernel>& kernels,
                           const std::vector<std::string>& hashes);

// Writes a pin into `dir`: one cubin per kernel (random bytes), the header, and
// checksums.txt listing them all (the header included, at `header_path`: the attention
// pin's is include/flashInferMetaInfo.h). Returns the cubin hashes.
std::vector<std::string> WritePin(const std::string& dir, const std::vector<PinKernel>& kernels,
                                  const std::string& header_path = "include/flashinferMetaInfo.h");

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_FLASHINFER_PIN_H_
