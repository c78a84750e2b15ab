#include "dispatch/operand_reference.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "dispatch/reference.h"
#include "gtest/gtest.h"
#include "kernels/moe_gemm_abi.h"

namespace cubist {
namespace {

std::vector<uint8_t> Bytes(const OperandPattern& pattern, int64_t count) {
  std::vector<uint8_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) out[i] = pattern.Byte(static_cast<size_t>(i));
  return out;
}

std::vector<float> Floats(const OperandPattern& pattern, int64_t count) {
  const std::vector<uint8_t> b = Bytes(pattern, 4 * count);
  std::vector<float> out(static_cast<size_t>(count));
  if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());  // no null pointer when empty
  return out;
}

// The whole problem's reference, from whole copies of the pattern-filled buffers: what
// the sampled rows must agree with.
std::vector<double> WholeReference(const MoeProblem& p, const PatternOperand& a,
                                   const PatternOperand& b) {
  const moe::MoeGemmBytes bytes = moe::MoeGemmBytesFor(
      p.weight_format, p.activation_format, p.activation, p.experts, p.tokens, p.n, p.k);
  reference::MoeProblemData whole;
  whole.weight_format = p.weight_format;
  whole.activation_format = p.activation_format;
  whole.num_experts = static_cast<int>(p.experts);
  whole.num_tokens = static_cast<int>(p.tokens);
  whole.n = static_cast<int>(p.n);
  whole.k = static_cast<int>(p.k);
  for (int64_t e = 0; e <= p.experts; ++e) {
    whole.offsets.push_back(static_cast<int32_t>(e * p.tokens / p.experts));
  }
  whole.a = Bytes(a.elements, bytes.a);
  whole.b = Bytes(b.elements, bytes.b);
  whole.a_scale = Bytes(a.scales, bytes.a_scale);
  whole.b_scale = Bytes(b.scales, bytes.b_scale);
  whole.a_global_scale = Floats(a.global, bytes.a_global_scale / 4);
  whole.b_global_scale = Floats(b.global, bytes.b_global_scale / 4);
  return reference::ApplyActivation(whole, reference::ReferenceGemm(whole), p.activation);
}

struct Pair {
  DataFormat weights, activations;
  Activation activation;
};

class OperandReferenceTest : public ::testing::TestWithParam<Pair> {};

TEST_P(OperandReferenceTest, SampledRowsEqualTheWholeProblemsRows) {
  MoeProblem p;
  p.weight_format = GetParam().weights;
  p.activation_format = GetParam().activations;
  p.activation = GetParam().activation;
  p.experts = 3;
  p.tokens = 10;  // experts own rows 0-2, 3-5, 6-9
  p.n = 256;
  p.k = 256;
  const PatternOperand a(p.activation_format, 100);
  const PatternOperand b(p.weight_format, 200);
  const std::vector<double> whole = WholeReference(p, a, b);
  // Out of order, an expert left out, one listed twice: each run of rows of one expert
  // is decoded on its own.
  const std::vector<SampledRow> rows = {{9, 2}, {3, 1}, {5, 1}, {6, 2}, {4, 1}};
  const std::vector<double> sampled = ReferenceRows(p, a, b, rows);
  const int64_t cols = p.output_n();
  ASSERT_EQ(sampled.size(), rows.size() * cols);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      ASSERT_EQ(sampled[i * cols + j], whole[rows[i].row * cols + j])
          << "row " << rows[i].row << " column " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryFormat, OperandReferenceTest,
    ::testing::Values(Pair{moe::kBf16, moe::kBf16, moe::kIdentity},
                      Pair{moe::kFp8, moe::kFp8, moe::kSwiglu},
                      Pair{moe::kFp8Block, moe::kFp8Block, moe::kSitu},
                      Pair{moe::kMxfp8, moe::kMxfp8, moe::kRelu2},
                      Pair{moe::kMxfp4, moe::kBf16, moe::kGeglu},
                      Pair{moe::kMxfp4, moe::kMxfp8, moe::kSwiglu},
                      Pair{moe::kNvfp4, moe::kNvfp4, moe::kSitu}));

TEST(OperandReferenceTest, Bf16RowIsTheDotProductOfThePatternsBytes) {
  MoeProblem p;
  p.experts = 2;
  p.tokens = 4;  // expert 1 owns rows 2 and 3
  p.n = 8;
  p.k = 64;
  const PatternOperand a(moe::kBf16, 1);
  const PatternOperand b(moe::kBf16, 2);
  auto bf16 = [](const OperandPattern& pattern, int64_t index) {
    return static_cast<double>(reference::Bf16ToFloat(static_cast<uint16_t>(
        pattern.Byte(2 * index) | (pattern.Byte(2 * index + 1) << 8))));
  };
  const std::vector<double> got = ReferenceRows(p, a, b, {{3, 1}});
  ASSERT_EQ(got.size(), 8u);
  for (int64_t n = 0; n < p.n; ++n) {
    double want = 0;
    for (int64_t k = 0; k < p.k; ++k) {
      want += bf16(a.elements, 3 * p.k + k) * bf16(b.elements, (1 * p.n + n) * p.k + k);
    }
    EXPECT_DOUBLE_EQ(got[n], want) << "column " << n;
  }
}

TEST(OperandReferenceTest, SituDefaultsToBetaOne) {
  // With beta 0 situ would divide by zero; the ABI's default keeps it finite.
  EXPECT_EQ(moe::MoeActDefaults(moe::kSitu).beta, 1.0f);
  EXPECT_EQ(moe::MoeActDefaults(moe::kSwiglu).beta, 0.0f);
  EXPECT_EQ(moe::MoeActDefaults(moe::kSwiglu).alpha, 1.0f);
  EXPECT_TRUE(std::isinf(moe::MoeActDefaults(moe::kGeglu).limit));
  MoeProblem p;
  p.activation = moe::kSitu;
  p.experts = 1;
  p.tokens = 2;
  p.n = 16;
  p.k = 32;
  const PatternOperand a(moe::kBf16, 5);
  const PatternOperand b(moe::kBf16, 6);
  for (double v : ReferenceRows(p, a, b, {{0, 0}, {1, 0}})) EXPECT_TRUE(std::isfinite(v));
}

}  // namespace
}  // namespace cubist
