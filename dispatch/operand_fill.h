// Random but valid operand bytes for timing and smoke-testing MoE GEMM kernels without
// holding whole tensors on the host: each buffer repeats a seeded pattern of
// kOperandPeriod bytes, so byte i of a buffer is Byte(i) and a checker can decode any
// element it samples. The period is a multiple of 4 (elements and fp32 scales stay
// aligned) but not a power of two, so experts and rows see shifted, different data.
//
// Values are never zero-only and never NaN: bf16 in +-[2^-7, 2), e4m3 anything but NaN,
// e2m1 anything, ue8m0 scales 2^-5..2^3, e4m3 block scales in [0.5, 1], fp32 scales
// in [0.5, 2).
//
// Thread safety: an OperandPattern is immutable after construction.
#ifndef CUBIST_DISPATCH_OPERAND_FILL_H_
#define CUBIST_DISPATCH_OPERAND_FILL_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "dispatch/moe_types.h"
#include "loader/device_memory.h"

namespace cubist {

inline constexpr size_t kOperandPeriod = 4194300;  // 4 * 1048575

enum class OperandKind {
  kElements,     // the format's elements (bf16, e4m3, e2m1 pairs)
  kBlockScales,  // the format's block scales (ue8m0, e4m3 or fp32)
  kGlobalScale,  // fp32
};

class OperandPattern {
 public:
  OperandPattern(DataFormat format, OperandKind kind, uint64_t seed);
  uint8_t Byte(size_t offset) const { return bytes_[offset % bytes_.size()]; }
  // Fills `buffer` (synchronously) with the pattern from offset 0: one period from the
  // host, then device-to-device copies that double the filled prefix (gigabytes in
  // milliseconds). `driver` must be the buffer's.
  [[nodiscard]] absl::Status Fill(DriverApi& driver, DeviceBuffer& buffer) const;

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace cubist

#endif  // CUBIST_DISPATCH_OPERAND_FILL_H_
