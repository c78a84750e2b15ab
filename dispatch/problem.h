// What the dispatcher is asked to solve: one MoE batched-GEMM problem on one kind of
// device. MoeProblem is the selection key (style.md 10): it has operator==,
// AbslHashValue and operator<<, so a miss can print exactly what was asked.
//
// Shapes follow docs/kernels.md: A is [tokens, K] sorted by expert, B is [experts, N, K],
// the output is [tokens, N] (or [tokens, N/2] for gated activations). `tokens` is the
// offsets' total (offsets[experts]); the host need not know how they split.
#ifndef CUBIST_DISPATCH_PROBLEM_H_
#define CUBIST_DISPATCH_PROBLEM_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "dispatch/moe_types.h"
#include "dispatch/routed_load.h"
#include "loader/compat.h"

namespace cubist {

// Parses a device SM (loader/compat.h's DeviceSm) as users write it: "90", "90a",
// "sm_90a", "9.0", "100f", "120".
// A trailing a/f is accepted and ignored: a device has a compute capability, not a
// variant; the variant belongs to kernels. InvalidArgument on anything else.
[[nodiscard]] absl::StatusOr<DeviceSm> ParseDeviceSm(std::string_view text);

struct MoeProblem {
  Op op = Op::kMoeGemm;
  DataFormat weight_format = DataFormat::kBf16;
  DataFormat activation_format = DataFormat::kBf16;
  Activation activation = Activation::kIdentity;
  int64_t experts = 0;  // E >= 1
  int64_t tokens = 0;   // T = offsets[E] >= 0, the rows of A
  int64_t n = 0;        // B's rows per expert (both halves for gated activations)
  int64_t k = 0;        // reduction length
  DeviceSm sm{9, 0};    // the device it runs on
  // The output's format when the caller needs a particular one (trtllm_bmm kernels
  // write bf16, fp8 or FP4 outputs); nullopt: whatever the kernel writes (moe_gemm
  // kernels write bf16).
  std::optional<DataFormat> output_format;
  int sm_count = 0;     // its multiprocessors (0: the default for `sm`)
  // A per-expert bias row is added before the activation: only moe_gemm kernels of
  // parameter struct version 3 or newer read one (kernels/moe_gemm_abi.h).
  bool bias = false;
  // A's rows are read through a row map (MoeGemmArgs::a_row_map): only moe_gemm kernels
  // whose entry says "a_gather" (parameter struct version 5) serve it, and only it.
  bool gather_a = false;
  // How the rows spread over the experts, which the cost model prices (dispatch/
  // routed_load.h): 0 - evenly, tokens / experts each (the offsets MoeGemm's callers
  // build themselves are assumed so); k >= 1 - as a router sends them: tokens / k
  // tokens each pick k distinct experts of routed_experts uniformly at random, so an
  // expert's rows are Binomial(ceil(tokens / k), k / routed_experts) and its last tile is
  // partly empty (MoeLayer's GEMMs). routed_experts: the model's experts when this
  // problem's are one rank's share of them (expert parallelism); 0 - experts.
  int64_t routed_top_k = 0;
  int64_t routed_experts = 0;

  // The routing routed_top_k describes (ceil(tokens / k) tokens, k, routed_experts or
  // experts); meaningful only when routed_top_k >= 1.
  RoutedLoad routed_load() const {
    RoutedLoad l;
    l.top_k = routed_top_k > 0 ? routed_top_k : 1;
    l.tokens = (tokens + l.top_k - 1) / l.top_k;
    l.routed_experts = routed_experts > 0 ? routed_experts : experts;
    return l;
  }

  // Average rows per expert, rounded up (0 when there are no tokens).
  int64_t tokens_per_expert() const {
    return experts > 0 ? (tokens + experts - 1) / experts : 0;
  }
  // Columns of the output: n, or n / 2 for gated activations.
  int64_t output_n() const { return IsGated(activation) ? n / 2 : n; }
  // Useful floating-point operations (2 per multiply-add).
  double flops() const {
    return 2.0 * static_cast<double>(tokens) * static_cast<double>(n) *
           static_cast<double>(k);
  }

  bool operator==(const MoeProblem&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const MoeProblem& p) {
    return H::combine(std::move(h), p.op, p.weight_format, p.activation_format,
                      p.activation, p.experts, p.tokens, p.n, p.k, p.sm.major, p.sm.minor,
                      p.sm_count, p.output_format, p.bias, p.gather_a, p.routed_top_k,
                      p.routed_experts);
  }
};

// Copies the fields that say which grouped GEMM a problem is - formats, activation,
// experts, n and k - between the structs that carry them (MoeProblem, MoeGemmArgs,
// ShapeBucket), so that the list is written once. Tokens are not copied: a bucket holds
// tokens per expert instead.
template <typename To, typename From>
void CopyGemmShape(const From& from, To* to) {
  to->weight_format = from.weight_format;
  to->activation_format = from.activation_format;
  to->activation = from.activation;
  to->experts = from.experts;
  to->n = from.n;
  to->k = from.k;
}

// Checks what every kernel needs regardless of its tiles: experts >= 1, tokens >= 0,
// n >= 1, k >= 1, gated activations with an even n, and a routing the experts can take
// (routed_top_k 0 or at most the routed experts, routed_experts 0 or at least experts).
// InvalidArgument naming the field.
[[nodiscard]] absl::Status ValidateProblem(const MoeProblem& problem);

// "moe_gemm{weights=mxfp4 activations=bf16 activation=swiglu experts=128 tokens=1024
// (8/expert) n=5760 k=2880 sm=90 sms=132}"
std::string ToString(const MoeProblem& problem);
std::ostream& operator<<(std::ostream& os, const MoeProblem& problem);

}  // namespace cubist

#endif  // CUBIST_DISPATCH_PROBLEM_H_
