#include "dispatch/moe_quantize_reference.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "dispatch/reference.h"

namespace cubist::reference {
namespace {

// Elements sharing one scale.
int BlockOf(moe::MoeFormat f) {
  return f == moe::kFp8Block ? 128 : f == moe::kMxfp8 ? 32 : f == moe::kNvfp4 ? 16 : 0;
}

// The largest |x| of the block, NaN elements ignored (fmax drops a NaN operand).
float Amax(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

void PutFloat(std::vector<uint8_t>* out, float v) {
  const uint32_t b = std::bit_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<uint8_t>(b >> (8 * i)));
}

// Quantizes one block `x[0..n)` of a row; appends its scale (when the format has one)
// and writes the element factor the block's elements are multiplied by.
float BlockFactor(moe::MoeFormat f, const float* x, int n, float g, float inv_g,
                  std::vector<uint8_t>* scale) {
  const float amax = Amax(x, n);
  switch (f) {
    case moe::kFp8Block: {
      const float s = std::fmax(amax, 1e-4f) / 448.0f;
      PutFloat(scale, s);
      return Rcp(s);
    }
    case moe::kMxfp8: {
      const int biased = static_cast<int>((std::bit_cast<uint32_t>(amax) >> 23) & 0xFF);
      const int byte = biased > 8 ? biased - 8 : 0;
      scale->push_back(static_cast<uint8_t>(byte));
      return std::bit_cast<float>(static_cast<uint32_t>(254 - byte) << 23);  // 2^(127 - byte)
    }
    default: {  // nvfp4
      const float inv6 = Rcp(6.0f);
      const uint8_t sf = FloatToE4m3(g * (amax * inv6));
      scale->push_back(sf);
      const float sfv = E4m3ToFloat(sf);
      return sfv != 0.0f ? Rcp(sfv * inv_g) : 0.0f;
    }
  }
}

}  // namespace

float Rcp(float v) { return 1.0f / v; }

QuantizedRows QuantizeActivations(moe::MoeFormat format, const std::vector<uint16_t>& x,
                                  int rows, int k, float scale) {
  QuantizedRows q;
  const bool fp4 = format == moe::kNvfp4;
  const float g = scale, inv_g = Rcp(scale);
  const float inv_s = Rcp(scale);
  if (format == moe::kFp8) q.global = scale;
  if (fp4) q.global = inv_g;
  const int block = format == moe::kFp8 ? k : BlockOf(format);
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<uint8_t> codes(static_cast<size_t>(k));
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < k; ++c) row[c] = Bf16ToFloat(x[static_cast<size_t>(r) * k + c]);
    for (int c0 = 0; c0 < k; c0 += block) {
      const int n = std::min(block, k - c0);
      const float f = format == moe::kFp8 ? inv_s
                                          : BlockFactor(format, &row[c0], n, g, inv_g, &q.scale);
      for (int c = c0; c < c0 + n; ++c) {
        const float v = row[c] * f;
        codes[c] = fp4 ? FloatToE2m1(v) : FloatToE4m3(v);
      }
    }
    if (fp4) {
      for (int c = 0; c < k; c += 2) {
        q.data.push_back(static_cast<uint8_t>(codes[c] | (codes[c + 1] << 4)));
      }
    } else {
      q.data.insert(q.data.end(), codes.begin(), codes.end());
    }
  }
  return q;
}

}  // namespace cubist::reference
