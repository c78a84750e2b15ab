#include "dispatch/operand_reference.h"

#include <cstring>

#include "dispatch/reference.h"
#include "kernels/moe_gemm_abi.h"

namespace cubist {
namespace {

// Appends bytes [begin, begin + count) of a pattern-filled buffer to `out`.
void AppendBytes(const OperandPattern& pattern, int64_t begin, int64_t count,
                 std::vector<uint8_t>* out) {
  for (int64_t i = 0; i < count; ++i) {
    out->push_back(pattern.Byte(static_cast<size_t>(begin + i)));
  }
}

// fp32 element `index` of a pattern-filled buffer.
float FloatAt(const OperandPattern& pattern, int64_t index) {
  std::vector<uint8_t> bytes;
  AppendBytes(pattern, index * 4, 4, &bytes);
  float f;
  std::memcpy(&f, bytes.data(), 4);
  return f;
}

// Expert `e` of the whole problem becomes the next expert of `sub`: its weights, block
// scales and global scale copied byte for byte.
void AddExpert(const MoeProblem& p, const PatternOperand& b, int64_t e,
               const moe::MoeGemmBytes& one, reference::MoeProblemData* sub) {
  AppendBytes(b.elements, e * one.b, one.b, &sub->b);
  AppendBytes(b.scales, e * one.b_scale, one.b_scale, &sub->b_scale);
  if (moe::FormatHasGlobalScale(p.weight_format)) {
    sub->b_global_scale.push_back(FloatAt(b.global, e));
  }
  sub->offsets.push_back(sub->offsets.back());
  ++sub->num_experts;
}

// Row `t` of the whole problem becomes the next row of `sub`'s last expert.
void AddRow(const PatternOperand& a, int64_t t, const moe::MoeGemmBytes& one,
            reference::MoeProblemData* sub) {
  AppendBytes(a.elements, t * one.a, one.a, &sub->a);
  AppendBytes(a.scales, t * one.a_scale, one.a_scale, &sub->a_scale);
  ++sub->offsets.back();
  ++sub->num_tokens;
}

}  // namespace

std::vector<double> ReferenceRows(const MoeProblem& problem, const PatternOperand& a,
                                  const PatternOperand& b,
                                  const std::vector<SampledRow>& rows) {
  // The sample as a problem of its own: one expert per run of rows of one expert, with
  // those rows as its tokens. Sizes of one row of A and one expert of B:
  const moe::MoeGemmBytes one =
      moe::MoeGemmBytesFor(problem.weight_format, problem.activation_format,
                           problem.activation, 1, 1, problem.n, problem.k);
  reference::MoeProblemData sub;
  sub.weight_format = problem.weight_format;
  sub.activation_format = problem.activation_format;
  sub.n = static_cast<int>(problem.n);
  sub.k = static_cast<int>(problem.k);
  sub.offsets = {0};
  if (moe::FormatHasGlobalScale(problem.activation_format)) {
    sub.a_global_scale = {FloatAt(a.global, 0)};
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i == 0 || rows[i].expert != rows[i - 1].expert) {
      AddExpert(problem, b, rows[i].expert, one, &sub);
    }
    AddRow(a, rows[i].row, one, &sub);
  }
  return reference::ApplyActivation(sub, reference::ReferenceGemm(sub), problem.activation);
}

}  // namespace cubist
