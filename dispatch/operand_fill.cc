#include "dispatch/operand_fill.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "base/status_macros.h"

namespace cubist {

OperandPattern::OperandPattern(DataFormat format, OperandKind kind, uint64_t seed)
    : bytes_(kOperandPeriod) {
  // A cheap generator: the pattern is 4 MB and built once per buffer kind.
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(kind) * 131 +
                      static_cast<uint64_t>(format));
  auto bits = [&] { return rng(); };
  auto put_f32 = [&](size_t i, float f) { std::memcpy(&bytes_[i], &f, 4); };
  const size_t n = bytes_.size();
  if (kind == OperandKind::kGlobalScale ||
      (kind == OperandKind::kBlockScales && format == DataFormat::kFp8Block)) {
    for (size_t i = 0; i < n; i += 4) {
      put_f32(i, 0.5f + 1.5f * static_cast<float>(bits() >> 40) / static_cast<float>(1 << 24));
    }
    return;
  }
  if (kind == OperandKind::kBlockScales) {
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = bits();
      bytes_[i] = format == DataFormat::kNvfp4
                      ? static_cast<uint8_t>(0x30 + r % 9)     // e4m3 0.5 .. 1
                      : static_cast<uint8_t>(122 + r % 9);     // ue8m0 2^-5 .. 2^3
    }
    return;
  }
  switch (format) {
    case DataFormat::kBf16:
      for (size_t i = 0; i < n; i += 2) {
        const uint64_t r = bits();
        const uint16_t v = static_cast<uint16_t>(((r & 1) << 15) | ((120 + (r >> 1) % 8) << 7) |
                                                 ((r >> 8) & 0x7F));
        std::memcpy(&bytes_[i], &v, 2);
      }
      break;
    case DataFormat::kMxfp4:
    case DataFormat::kNvfp4:
      for (size_t i = 0; i < n; ++i) bytes_[i] = static_cast<uint8_t>(bits());
      break;
    default:  // e4m3: anything but NaN (S.1111.111)
      for (size_t i = 0; i < n; ++i) {
        uint8_t b = static_cast<uint8_t>(bits());
        if ((b & 0x7F) == 0x7F) b ^= 1;
        bytes_[i] = b;
      }
      break;
  }
}

absl::Status OperandPattern::Fill(DriverApi& driver, DeviceBuffer& buffer) const {
  const size_t size = buffer.size();
  size_t filled = std::min(bytes_.size(), size);
  if (filled == 0) return absl::OkStatus();
  CUBIST_RETURN_IF_ERROR(buffer.CopyFromHost(bytes_.data(), filled));
  // `filled` stays a multiple of the period, so byte i is still bytes_[i % period].
  while (filled < size) {
    const size_t n = std::min(filled, size - filled);
    CUBIST_RETURN_IF_ERROR(CuCheck(driver,
                                   driver.MemcpyDtoD(buffer.get() + filled, buffer.get(), n),
                                   "fill operand: cuMemcpyDtoD"));
    filled += n;
  }
  return absl::OkStatus();
}

}  // namespace cubist
