#include "dispatch/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "absl/strings/str_format.h"
#include "kernels/moe_gemm_layout.h"

namespace cubist::reference {
namespace {

using moe::kBf16;
using moe::kFp8;
using moe::kFp8Block;
using moe::kMxfp4;
using moe::kMxfp8;
using moe::kNvfp4;

uint32_t FloatBits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
float BitsFloat(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// Round-to-nearest-even encoding of |x| (finite, >= 0) into a small float format with
// `mbits` mantissa bits and exponent bias `bias`, saturating at code `max_code`. Codes of
// such formats are monotonic in value, so a mantissa that rounds up to 2^mbits carries
// into the exponent by plain addition, and subnormals fall out of clamping the exponent.
uint32_t EncodeMagnitude(double a, int mbits, int bias, uint32_t max_code) {
  if (a == 0) return 0;
  const int emin = 1 - bias;
  int ex;
  std::frexp(a, &ex);  // a = f * 2^ex, f in [0.5, 1)
  const int e = std::max(ex - 1, emin);
  const double q = std::nearbyint(std::ldexp(a, mbits - e));  // ties to even
  const double code = std::ldexp(1.0, mbits) * (e + bias) + q - std::ldexp(1.0, mbits);
  return code >= max_code ? max_code : static_cast<uint32_t>(code);
}

// Element format of a tensor: e4m3, e2m1 or bf16.
enum class Elem { kBf16, kE4m3, kE2m1 };
Elem ElemOf(MoeFormat f) {
  switch (f) {
    case kBf16: return Elem::kBf16;
    case kMxfp4:
    case kNvfp4: return Elem::kE2m1;
    default: return Elem::kE4m3;
  }
}

// Decoded element i of a row-major tensor (no scales).
float DecodeElement(Elem e, const std::vector<uint8_t>& data, int64_t i) {
  switch (e) {
    case Elem::kBf16: {
      uint16_t b;
      std::memcpy(&b, &data[2 * i], 2);
      return Bf16ToFloat(b);
    }
    case Elem::kE4m3: return E4m3ToFloat(data[i]);
    case Elem::kE2m1: {
      const uint8_t byte = data[i / 2];
      return E2m1ToFloat(i % 2 == 0 ? (byte & 0xF) : (byte >> 4));
    }
  }
  return 0;
}

float ScaleFloat(const std::vector<uint8_t>& s, int64_t i) {
  float v;
  std::memcpy(&v, &s[4 * i], 4);
  return v;
}

// Element times block scale (no global scale) of a [rows, k] tensor whose fp8-block
// scales are [ceil(rows/row_block), ceil(k/128)].
std::vector<float> DecodeBlockScaled(MoeFormat f, const std::vector<uint8_t>& data,
                                     const std::vector<uint8_t>& scale, int64_t rows, int k,
                                     int fp8_row_block) {
  std::vector<float> out(static_cast<size_t>(rows) * k);
  const Elem el = ElemOf(f);
  const int blk = moe::FormatScaleBlock(f);
  const int kb = (k + 127) / 128;
  for (int64_t r = 0; r < rows; ++r) {
    for (int c = 0; c < k; ++c) {
      const int64_t i = r * k + c;
      float v = DecodeElement(el, data, i);
      if (f == kMxfp4 || f == kMxfp8) {
        v *= Ue8m0ToFloat(scale[r * (k / blk) + c / blk]);
      } else if (f == kNvfp4) {
        v *= E4m3ToFloat(scale[r * (k / blk) + c / blk]);
      } else if (f == kFp8Block) {
        v *= ScaleFloat(scale, (r / fp8_row_block) * kb + c / 128);
      }
      out[i] = v;
    }
  }
  return out;
}

std::vector<float> DecodeNoGlobal(const MoeProblemData& p, bool is_a) {
  if (is_a) {
    return DecodeBlockScaled(p.activation_format, p.a, p.a_scale, p.num_tokens, p.k, 1);
  }
  // B: per expert for fp8-block (its 128x128 scale blocks restart at each expert).
  if (p.weight_format != kFp8Block) {
    return DecodeBlockScaled(p.weight_format, p.b, p.b_scale,
                             static_cast<int64_t>(p.num_experts) * p.n, p.k, 1);
  }
  std::vector<float> out;
  const moe::MoeGemmBytes one_expert =
      moe::MoeGemmBytesFor(p.weight_format, p.activation_format, moe::kIdentity, 1, 0, p.n, p.k);
  const int64_t per_data = one_expert.b;
  const int64_t per_scale = one_expert.b_scale;
  for (int e = 0; e < p.num_experts; ++e) {
    std::vector<uint8_t> d(p.b.begin() + e * per_data, p.b.begin() + (e + 1) * per_data);
    std::vector<uint8_t> s(p.b_scale.begin() + e * per_scale,
                           p.b_scale.begin() + (e + 1) * per_scale);
    std::vector<float> x = DecodeBlockScaled(kFp8Block, d, s, p.n, p.k, 128);
    out.insert(out.end(), x.begin(), x.end());
  }
  return out;
}

double GlobalA(const MoeProblemData& p) {
  return p.a_global_scale.empty() ? 1.0 : p.a_global_scale[0];
}
double GlobalB(const MoeProblemData& p, int e) {
  return p.b_global_scale.empty() ? 1.0 : p.b_global_scale[e];
}

void PutFloat(std::vector<uint8_t>* v, float x) {
  const uint32_t b = FloatBits(x);
  for (int i = 0; i < 4; ++i) v->push_back(static_cast<uint8_t>(b >> (8 * i)));
}

}  // namespace

// ---------------------------------------------------------------------------------

float Bf16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

uint16_t FloatToBf16(float x) {
  const uint32_t b = FloatBits(x);
  if (std::isnan(x)) return static_cast<uint16_t>((b >> 16) | 0x0040);
  const uint32_t rounded = b + 0x7FFF + ((b >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}

float E4m3ToFloat(uint8_t bits) {
  const int s = bits >> 7, e = (bits >> 3) & 0xF, m = bits & 7;
  if (e == 0xF && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(1.0f + m / 8.0f, e - 7);
  return s ? -mag : mag;
}

uint8_t FloatToE4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint32_t code = EncodeMagnitude(std::fabs(static_cast<double>(x)), 3, 7, 0x7E);
  return static_cast<uint8_t>(code | (std::signbit(x) ? 0x80 : 0));
}

float E2m1ToFloat(uint8_t nibble) {
  static constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = kValues[nibble & 7];
  return (nibble & 8) ? -mag : mag;
}

uint8_t FloatToE2m1(float x) {
  if (std::isnan(x)) return 0;
  const uint32_t code = EncodeMagnitude(std::fabs(static_cast<double>(x)), 1, 1, 7);
  return static_cast<uint8_t>(code | (std::signbit(x) ? 8 : 0));
}

float Ue8m0ToFloat(uint8_t bits) {
  if (bits == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

// ---------------------------------------------------------------------------------

namespace {

// max |x| over rows [r0, r1) and columns [c0, c1) of a [rows, k] matrix.
float AbsMax(const std::vector<float>& x, int k, int r0, int r1, int c0, int c1) {
  float m = 0;
  for (int r = r0; r < r1; ++r)
    for (int c = c0; c < c1; ++c) m = std::max(m, std::fabs(x[int64_t{r} * k + c]));
  return m;
}

void QuantizeBf16(const std::vector<float>& x, int64_t count, std::vector<uint8_t>* data) {
  for (int64_t i = 0; i < count; ++i) {
    const uint16_t b = FloatToBf16(x[i]);
    data->push_back(static_cast<uint8_t>(b));
    data->push_back(static_cast<uint8_t>(b >> 8));
  }
}

void QuantizeFp8(const std::vector<float>& x, int rows, int k, std::vector<uint8_t>* data,
                 float* global) {
  const float amax = AbsMax(x, k, 0, rows, 0, k);
  *global = amax > 0 ? amax / 448.0f : 1.0f;
  for (int64_t i = 0; i < int64_t{rows} * k; ++i) data->push_back(FloatToE4m3(x[i] / *global));
}

void QuantizeFp8Block(const std::vector<float>& x, int rows, int k, bool square_blocks,
                      std::vector<uint8_t>* data, std::vector<uint8_t>* scale) {
  const int rb = square_blocks ? 128 : 1;
  const int kb = (k + 127) / 128;
  const int nrb = (rows + rb - 1) / rb;
  std::vector<float> s(static_cast<size_t>(nrb) * kb);
  for (int i = 0; i < nrb; ++i) {
    for (int j = 0; j < kb; ++j) {
      const float amax = AbsMax(x, k, i * rb, std::min(rows, (i + 1) * rb), j * 128,
                                std::min(k, (j + 1) * 128));
      s[i * kb + j] = amax > 0 ? amax / 448.0f : 1.0f;
      PutFloat(scale, s[i * kb + j]);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < k; ++c)
      data->push_back(FloatToE4m3(x[int64_t{r} * k + c] / s[(r / rb) * kb + c / 128]));
}

// Two e2m1 codes a byte, element 2i in the low nibble.
void PackE2m1(const std::vector<float>& q, std::vector<uint8_t>* data) {
  for (size_t i = 0; i < q.size(); i += 2)
    data->push_back(static_cast<uint8_t>(FloatToE2m1(q[i]) | (FloatToE2m1(q[i + 1]) << 4)));
}

// OCP MX: shared exponent floor(log2(amax)) - emax(element), elements saturate.
void QuantizeMx(MoeFormat format, const std::vector<float>& x, int rows, int k,
                std::vector<uint8_t>* data, std::vector<uint8_t>* scale) {
  const int emax = format == kMxfp8 ? 8 : 2;
  std::vector<float> q(static_cast<size_t>(rows) * k);
  for (int r = 0; r < rows; ++r) {
    for (int c0 = 0; c0 < k; c0 += 32) {
      const float amax = AbsMax(x, k, r, r + 1, c0, c0 + 32);
      int se = 0;
      if (amax > 0) {
        int ex;
        std::frexp(amax, &ex);
        se = std::clamp(ex - 1 - emax, -127, 127);
      }
      scale->push_back(static_cast<uint8_t>(se + 127));
      for (int c = c0; c < c0 + 32; ++c)
        q[int64_t{r} * k + c] = std::ldexp(x[int64_t{r} * k + c], -se);
    }
  }
  if (format == kMxfp8) {
    for (float v : q) data->push_back(FloatToE4m3(v));
  } else {
    PackE2m1(q, data);
  }
}

void QuantizeNvfp4(const std::vector<float>& x, int rows, int k, std::vector<uint8_t>* data,
                   std::vector<uint8_t>* scale, float* global) {
  const float amax = AbsMax(x, k, 0, rows, 0, k);
  *global = amax > 0 ? amax / (448.0f * 6.0f) : 1.0f;
  std::vector<float> q(static_cast<size_t>(rows) * k);
  for (int r = 0; r < rows; ++r) {
    for (int c0 = 0; c0 < k; c0 += 16) {
      const float bmax = AbsMax(x, k, r, r + 1, c0, c0 + 16);
      const uint8_t sc = FloatToE4m3(bmax / 6.0f / *global);
      scale->push_back(sc);
      const float s = E4m3ToFloat(sc) * *global;
      for (int c = c0; c < c0 + 16; ++c)
        q[int64_t{r} * k + c] = s > 0 ? x[int64_t{r} * k + c] / s : 0.0f;
    }
  }
  PackE2m1(q, data);
}

}  // namespace

void Quantize(MoeFormat format, const std::vector<float>& x, int rows, int k,
              bool square_blocks, std::vector<uint8_t>* data, std::vector<uint8_t>* scale,
              float* global) {
  data->clear();
  scale->clear();
  *global = 1.0f;
  switch (format) {
    case kBf16: return QuantizeBf16(x, int64_t{rows} * k, data);
    case kFp8: return QuantizeFp8(x, rows, k, data, global);
    case kFp8Block: return QuantizeFp8Block(x, rows, k, square_blocks, data, scale);
    case kMxfp8:
    case kMxfp4: return QuantizeMx(format, x, rows, k, data, scale);
    case kNvfp4: return QuantizeNvfp4(x, rows, k, data, scale, global);
    case moe::kFp16:
    case moe::kMxint4:
      return;  // names only: no moe_gemm kernel takes them, so nothing to quantize for
  }
}

std::vector<float> DequantizeA(const MoeProblemData& p) {
  std::vector<float> a = DecodeNoGlobal(p, true);
  const float g = static_cast<float>(GlobalA(p));
  if (g != 1.0f) for (float& v : a) v *= g;
  return a;
}

std::vector<float> DequantizeB(const MoeProblemData& p) {
  std::vector<float> b = DecodeNoGlobal(p, false);
  const int64_t per = static_cast<int64_t>(p.n) * p.k;
  for (int e = 0; e < p.num_experts; ++e) {
    const float g = static_cast<float>(GlobalB(p, e));
    if (g != 1.0f) for (int64_t i = e * per; i < (e + 1) * per; ++i) b[i] *= g;
  }
  return b;
}

std::vector<double> ReferenceGemm(const MoeProblemData& p) {
  const std::vector<float> a = DecodeNoGlobal(p, true);
  const std::vector<float> b = DecodeNoGlobal(p, false);
  std::vector<double> c(static_cast<size_t>(p.num_tokens) * p.n, 0.0);
  auto work = [&](int e_begin, int e_end) {
    for (int e = e_begin; e < e_end; ++e) {
      const double g = GlobalA(p) * GlobalB(p, e);
      for (int t = p.offsets[e]; t < p.offsets[e + 1]; ++t) {
        const float* ar = &a[static_cast<size_t>(t) * p.k];
        for (int n = 0; n < p.n; ++n) {
          const float* br = &b[(static_cast<size_t>(e) * p.n + n) * p.k];
          double s = 0;
          for (int kk = 0; kk < p.k; ++kk) s += static_cast<double>(ar[kk]) * br[kk];
          c[static_cast<size_t>(t) * p.n + n] = s * g;
        }
      }
    }
  };
  const int threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  const int per = (p.num_experts + threads - 1) / threads;
  for (int i = 0; i < threads; ++i) {
    const int lo = i * per, hi = std::min(p.num_experts, lo + per);
    if (lo < hi) pool.emplace_back(work, lo, hi);
  }
  for (std::thread& t : pool) t.join();
  return c;
}

double ActivationValue(MoeActivation act, double x0, double x1, double alpha, double beta,
                       double limit) {
  auto sigmoid = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  switch (act) {
    case moe::kIdentity: return x0;
    case moe::kRelu2: {
      const double r = x0 < 0 ? 0.0 : x0;
      return r * r;
    }
    default: break;
  }
  // Comparisons written so that NaN passes through, as in the kernels.
  x1 = x1 > limit ? limit : x1;
  x0 = x0 > limit ? limit : (x0 < -limit ? -limit : x0);
  switch (act) {
    case moe::kSwiglu: return x1 * sigmoid(alpha * x1) * (x0 + beta);
    case moe::kGeglu: return 0.5 * x1 * (1.0 + std::erf(x1 / std::sqrt(2.0))) * x0;
    case moe::kSitu:
      return beta * std::tanh(x0 / beta) * alpha * std::tanh(x1 / alpha) * sigmoid(x1);
    default: return 0;
  }
}

std::vector<double> ApplyActivation(const MoeProblemData& p, const std::vector<double>& c,
                                    MoeActivation act) {
  const bool gated = moe::IsGated(act);
  const int cols = gated ? p.n / 2 : p.n;
  std::vector<double> out(static_cast<size_t>(p.num_tokens) * cols);
  for (int e = 0; e < p.num_experts; ++e) {
    const moe::MoeActParams defaults = moe::MoeActDefaults(act);
    const double alpha = p.alpha.empty() ? defaults.alpha : p.alpha[e];
    const double beta = p.beta.empty() ? defaults.beta : p.beta[e];
    const double limit = p.limit.empty() ? defaults.limit : p.limit[e];
    const float* bias = p.bias.empty() ? nullptr : &p.bias[static_cast<size_t>(e) * p.n];
    auto biased = [&](const double* row, int j) { return row[j] + (bias ? bias[j] : 0.0); };
    for (int t = p.offsets[e]; t < p.offsets[e + 1]; ++t) {
      const double* row = &c[static_cast<size_t>(t) * p.n];
      for (int j = 0; j < cols; ++j) {
        out[static_cast<size_t>(t) * cols + j] = ActivationValue(
            act, biased(row, j), gated ? biased(row, cols + j) : 0.0, alpha, beta, limit);
      }
    }
  }
  return out;
}

Tolerance ToleranceFor(MoeFormat weight_format, MoeFormat activation_format) {
  if (moe::UsesFp8Mma(weight_format, activation_format)) {
    return Tolerance{.rel_fro = 6e-3, .rtol = 1.6e-2, .atol_rel = 4e-3};
  }
  return Tolerance{.rel_fro = 4e-3, .rtol = 8e-3, .atol_rel = 2e-3};
}

double MaxAbs(const std::vector<double>& x) {
  double m = 0;
  for (double v : x)
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  return m;
}

Comparison CompareBf16(const std::vector<uint16_t>& out, const std::vector<double>& ref,
                       const Tolerance& tol, double atol_scale) {
  Comparison r;
  if (out.size() != ref.size()) {
    r.summary = absl::StrFormat("size mismatch: %d outputs, %d reference values", out.size(),
                                ref.size());
    return r;
  }
  double num = 0, den = 0;
  const double atol = tol.atol_rel * std::max(MaxAbs(ref), atol_scale);
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = Bf16ToFloat(out[i]), x = ref[i];
    bool bad;
    if (std::isnan(x) || std::isnan(o)) {
      bad = std::isnan(x) != std::isnan(o);
    } else if (std::isinf(x) || std::isinf(o)) {
      bad = o != x;
    } else {
      const double d = std::fabs(o - x);
      num += d * d;
      den += x * x;
      r.max_abs_err = std::max(r.max_abs_err, d);
      bad = d > atol + tol.rtol * std::fabs(x);
    }
    if (bad) {
      if (r.first_bad < 0) r.first_bad = static_cast<int64_t>(i);
      ++r.bad_elements;
    }
  }
  r.rel_fro = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  r.ok = r.bad_elements == 0 && r.rel_fro <= tol.rel_fro;
  r.summary = absl::StrFormat("rel_fro %.3g (max %.3g), max_abs %.3g, %d bad of %d",
                              r.rel_fro, tol.rel_fro, r.max_abs_err, r.bad_elements,
                              out.size());
  if (r.first_bad >= 0) {
    r.summary += absl::StrFormat(" (first at %d: got %g, want %g)", r.first_bad,
                                 Bf16ToFloat(out[r.first_bad]), ref[r.first_bad]);
  }
  return r;
}

}  // namespace cubist::reference
