// The CPU reference for sampled output rows of a problem whose operands are
// OperandPatterns (operand_fill.h): `cubist run` fills the device buffers from patterns
// it never holds whole on the host, and checks the kernel's output on a sample of rows
// against dispatch/reference.h - the same decoders, GEMM and activation (with the ABI's
// default parameters) as every other check of the kernels.
#ifndef CUBIST_DISPATCH_OPERAND_REFERENCE_H_
#define CUBIST_DISPATCH_OPERAND_REFERENCE_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "dispatch/moe_types.h"
#include "dispatch/operand_fill.h"
#include "dispatch/problem.h"

namespace cubist {

// One operand (A or B) filled from patterns: its elements, its block scales and its
// global scale(s), each a buffer of its own filled from offset 0 (MoeGemmBytesFor says
// how long). Seeds seed, seed + 1 and seed + 2.
struct PatternOperand {
  PatternOperand(DataFormat format, uint64_t seed)
      : elements(format, OperandKind::kElements, seed),
        scales(format, OperandKind::kBlockScales, seed + 1),
        global(format, OperandKind::kGlobalScale, seed + 2) {}

  OperandPattern elements, scales, global;
};

// A row of the output and the expert that owns it (offsets[expert] <= row <
// offsets[expert + 1]).
struct SampledRow {
  int64_t row = 0;
  int64_t expert = 0;
};

// act(A * B^T) of the sampled rows of `problem` (alpha, beta and limit at
// moe::MoeActDefaults), problem.output_n() values per row in the order of `rows`. Only
// the experts that `rows` names are decoded; rows of one expert listed next to each
// other share one decode.
std::vector<double> ReferenceRows(const MoeProblem& problem, const PatternOperand& a,
                                  const PatternOperand& b,
                                  const std::vector<SampledRow>& rows);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_OPERAND_REFERENCE_H_
