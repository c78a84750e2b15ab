// GEMM1's gated weights in the row order the moe_gemm kernels take, from a checkpoint's.
//
// A gated activation (SwiGLU, GeGLU, SiTU) reads two halves of each expert's 2I rows: the
// kernels take rows 0..I-1 as the linear (up) half and I..2I-1 as the gate
// (kernels/moe_gemm_abi.h). Checkpoints store them in other orders, and a wrong order runs
// silently wrong, so the layouts have names:
//   "up_gate"              rows 0..I-1 up, I..2I-1 gate: the kernels' order already
//   "gate_up"              rows 0..I-1 gate, I..2I-1 up (vLLM's w13 = [w1; w3])
//   "gate_up_interleaved"  even rows gate, odd rows up (gpt-oss's checkpoint)
// Everything indexed by GEMM1's rows moves the same way: the weights [E, 2I, K] (a row is
// K elements in the weight format), their block scales [E, 2I, K / block] and the bias
// [E, 2I] (gpt-oss's gate_up_proj_bias). The functions work on host memory, where an
// engine holds a checkpoint before it uploads it; Python's cubist.gated_weights does the
// same on torch tensors.
#ifndef CUBIST_DISPATCH_GATED_LAYOUT_H_
#define CUBIST_DISPATCH_GATED_LAYOUT_H_

#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cubist {

enum class GatedLayout { kUpGate, kGateUp, kGateUpInterleaved };

// "gate_up" -> kGateUp; InvalidArgument naming the three layouts otherwise.
[[nodiscard]] absl::StatusOr<GatedLayout> ParseGatedLayout(std::string_view name);
std::string_view GatedLayoutName(GatedLayout layout);

// The row of a checkpoint in `layout` that holds row r (0 <= r < rows) of one expert in
// the kernels' order; rows = 2I, even.
int64_t GatedSourceRow(GatedLayout layout, int64_t rows, int64_t r);

// Copies `experts` x `rows` rows of `row_bytes` bytes each from `src` (the checkpoint's
// order) to `dst` (the kernels' order). InvalidArgument, with nothing written, for an odd
// or non-positive row count, a negative expert count or row size, null pointers with
// bytes to copy, or buffers that overlap (reorder into a second buffer).
[[nodiscard]] absl::Status ReorderGatedRows(GatedLayout layout, const void* src, void* dst,
                                            int64_t experts, int64_t rows, int64_t row_bytes);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_GATED_LAYOUT_H_
