// The layer's activation quantizers on the CPU (dispatch/moe_quantize_reference.h):
// hand-computed codes and scales for each format's rounding rules (kernels/moe_layer_abi.h,
// MoeQuantizeParams), the edge cases (ties, saturation, NaN, infinities, all-zero and
// partial blocks), and the quantized layer reference against the bf16 one.
#include "dispatch/moe_quantize_reference.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dispatch/moe_layer_reference.h"
#include "dispatch/reference.h"
#include "gtest/gtest.h"

namespace cubist::reference {
namespace {

std::vector<uint16_t> Bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out;
  for (float x : v) out.push_back(FloatToBf16(x));
  return out;
}

float ScaleAt(const QuantizedRows& q, int i) {
  float v;
  std::memcpy(&v, q.scale.data() + 4 * i, 4);
  return v;
}

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(MoeQuantizeReferenceTest, Fp8PerTensorMultipliesByTheReciprocalAndSaturates) {
  // s = 0.5: every element times rcp(0.5) = 2.
  const std::vector<float> x = {1.0f, -3.0f, 300.0f, kNan, 0.0f, -0.0f, kInf, 0.0009765625f};
  const QuantizedRows q = QuantizeActivations(moe::kFp8, Bf16(x), 1, 8, 0.5f);
  // 2 = 0x40; -6 = 0xCC; 600 saturates to 448 = 0x7E; NaN = 0x7F; +0, -0; inf -> 448;
  // 2^-9 is e4m3's smallest subnormal, 0x01.
  EXPECT_EQ(q.data, (std::vector<uint8_t>{0x40, 0xCC, 0x7E, 0x7F, 0x00, 0x80, 0x7E, 0x01}));
  EXPECT_TRUE(q.scale.empty());
  EXPECT_EQ(q.global, 0.5f);
}

TEST(MoeQuantizeReferenceTest, Fp8BlockScalesEach128AndThePartialLastBlock) {
  // K = 136: one whole block with amax 448 (s = 1, elements exact) and a partial block of
  // 8 zeros (s = 1e-4 / 448, elements 0).
  std::vector<float> x(136, 0.0f);
  x[0] = 448.0f;
  x[1] = -1.5f;
  x[127] = 0.125f;
  const QuantizedRows q = QuantizeActivations(moe::kFp8Block, Bf16(x), 1, 136, 0.0f);
  ASSERT_EQ(q.scale.size(), 8u);
  EXPECT_EQ(ScaleAt(q, 0), 1.0f);
  EXPECT_EQ(ScaleAt(q, 1), 1e-4f / 448.0f);
  ASSERT_EQ(q.data.size(), 136u);
  EXPECT_EQ(q.data[0], 0x7E);    // 448
  EXPECT_EQ(q.data[1], 0xBC);    // -1.5: exponent 7, mantissa 4
  EXPECT_EQ(q.data[127], 0x20);  // 0.125 = 2^-3: exponent 4
  for (int i = 128; i < 136; ++i) EXPECT_EQ(q.data[i], 0) << i;
}

TEST(MoeQuantizeReferenceTest, Fp8BlockScaleIsAmaxOver448InFp32) {
  std::vector<float> x(128, 0.0f);
  x[5] = 3.0f;
  x[6] = -1.0f;
  const QuantizedRows q = QuantizeActivations(moe::kFp8Block, Bf16(x), 1, 128, 0.0f);
  const float s = 3.0f / 448.0f;
  EXPECT_EQ(ScaleAt(q, 0), s);
  EXPECT_EQ(q.data[5], FloatToE4m3(3.0f * (1.0f / s)));
  EXPECT_EQ(q.data[5], 0x7E);  // 3 x rcp(3/448) rounds to 448 (or just above): saturates
  EXPECT_EQ(q.data[6], FloatToE4m3(-1.0f * (1.0f / s)));
}

TEST(MoeQuantizeReferenceTest, Mxfp8SharedExponentFromAmax) {
  // Block 0: amax 3 (exponent 1, biased 128) -> byte 120, elements times 2^7.
  // Block 1: all zero -> byte 0. Block 2: an infinity -> byte 247, inf saturates.
  std::vector<float> x(96, 0.0f);
  x[0] = 3.0f;
  x[1] = 1.0f;
  x[2] = -0.5f;
  x[64] = kInf;
  x[65] = 2.0f;
  const QuantizedRows q = QuantizeActivations(moe::kMxfp8, Bf16(x), 1, 96, 0.0f);
  EXPECT_EQ(q.scale, (std::vector<uint8_t>{120, 0, 247}));
  EXPECT_EQ(q.data[0], 0x7C);  // 384 = 1.5 x 2^8
  EXPECT_EQ(q.data[1], 0x70);  // 128 = 2^7
  EXPECT_EQ(q.data[2], 0xE8);  // -64 = -2^6
  EXPECT_EQ(q.data[33], 0x00);
  EXPECT_EQ(q.data[64], 0x7E);  // inf -> 448
  EXPECT_EQ(q.data[65], 0x00);  // 2 x 2^-120 is below e4m3's smallest subnormal
}

TEST(MoeQuantizeReferenceTest, Nvfp4RoundsTiesToEvenAndWritesTheGlobal) {
  // g = 1, amax 6: sf = e4m3(6 x rcp(6)) = e4m3(1) = 0x38; f = rcp(1 x rcp(1)) = 1.
  const std::vector<float> x = {6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f,
                                -0.1f, kNan, -6.0f, 0.5f, 1.5f, 3.0f, 4.0f, -2.0f};
  const QuantizedRows q = QuantizeActivations(moe::kNvfp4, Bf16(x), 1, 16, 1.0f);
  EXPECT_EQ(q.scale, (std::vector<uint8_t>{0x38}));
  // codes: 6->7, .25->0, .75->2, 1.25->2, 1.75->4, 2.5->4, 3.5->6, 5->6, -0.1->-0 (8),
  // NaN->0, -6->15, .5->1, 1.5->3, 3->5, 4->6, -2->12; two per byte, low nibble first.
  EXPECT_EQ(q.data, (std::vector<uint8_t>{0x07, 0x22, 0x44, 0x66, 0x08, 0x1F, 0x53, 0xC6}));
  EXPECT_EQ(q.global, 1.0f);
}

TEST(MoeQuantizeReferenceTest, Nvfp4GlobalScaleAndZeroBlock) {
  // g = 128: block amax 12 -> sf = e4m3(128 x (12 x rcp(6))) = e4m3(256) = 0x78;
  // f = rcp(256 x rcp(128)) = 0.5. The second block is zero: sf 0, elements 0.
  std::vector<float> x(32, 0.0f);
  x[0] = 12.0f;
  x[1] = -3.0f;
  const float g = 128.0f;
  const QuantizedRows q = QuantizeActivations(moe::kNvfp4, Bf16(x), 1, 32, g);
  EXPECT_EQ(q.scale, (std::vector<uint8_t>{0x78, 0x00}));
  EXPECT_EQ(q.data[0], 0xB7);  // 6 (7) and -1.5 (0xB)
  for (int i = 8; i < 16; ++i) EXPECT_EQ(q.data[i], 0) << i;
  EXPECT_EQ(q.global, 1.0f / 128.0f);
}

TEST(MoeQuantizeReferenceTest, QuantizedLayerStaysNearTheBf16Layer) {
  // The same layer with fp8 activations and weights, and with nvfp4 ones: close to the
  // bf16 layer (quantization error only) and not identical to it.
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  MoeLayerData d;
  d.tokens = 6;
  d.hidden = 64;
  d.intermediate = 32;
  d.num_experts = d.num_local_experts = 4;
  d.activation = moe::kSwiglu;
  auto fill = [&](size_t n, float s) {
    std::vector<uint16_t> v(n);
    for (auto& b : v) b = FloatToBf16(nd(rng) * s);
    return v;
  };
  d.x = fill(6 * 64, 1.0f);
  d.w1 = fill(4 * 64 * 64, 0.125f);
  d.w2 = fill(4 * 64 * 32, 0.18f);
  Routing routing;
  routing.tokens = 6;
  routing.top_k = 2;
  for (int t = 0; t < 6; ++t) {
    routing.ids.insert(routing.ids.end(), {t % 4, (t + 1) % 4});
    routing.weights.insert(routing.weights.end(), {0.7f, 0.3f});
  }
  const std::vector<double> base = MoeLayerReference(d, routing);
  for (moe::MoeFormat f : {moe::kFp8, moe::kNvfp4}) {
    MoeLayerData q = d;
    q.weight_format = q.activation_format = f;
    QuantizeLayerWeights(&q);
    q.input_scale = ActivationScaleFor(f, 5.0f);
    q.intermediate_scale = ActivationScaleFor(f, 8.0f);
    const std::vector<double> got = MoeLayerReference(q, routing);
    double num = 0, den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      num += (got[i] - base[i]) * (got[i] - base[i]);
      den += base[i] * base[i];
    }
    const double rel = std::sqrt(num / den);
    EXPECT_GT(rel, 1e-4) << moe::FormatName(f) << ": quantization changed nothing";
    EXPECT_LT(rel, f == moe::kFp8 ? 0.08 : 0.3) << moe::FormatName(f);
  }
}

}  // namespace
}  // namespace cubist::reference
