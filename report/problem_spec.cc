#include "report/problem_spec.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace cubist::report {
namespace {

absl::Status FlagError(const char* flag, const absl::Status& s) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
}

}  // namespace

absl::StatusOr<MoeProblem> ProblemSpec::ToProblem() const {
  MoeProblem p;
  auto o = ParseOp(op);
  if (!o.ok()) return FlagError("--op", o.status());
  p.op = *o;
  auto w = ParseDataFormat(weights);
  if (!w.ok()) return FlagError("--weights", w.status());
  auto a = ParseDataFormat(activations);
  if (!a.ok()) return FlagError("--activations", a.status());
  auto act = ParseActivation(activation);
  if (!act.ok()) return FlagError("--activation", act.status());
  if (!output_format.empty()) {
    auto out = ParseDataFormat(output_format);
    if (!out.ok()) return FlagError("--output-format", out.status());
    p.output_format = *out;
  }
  p.weight_format = *w;
  p.activation_format = *a;
  p.activation = *act;
  p.experts = experts;
  if ((tokens_per_expert >= 0) == (tokens >= 0)) {
    return absl::InvalidArgumentError(
        "give exactly one of --tokens-per-expert T and --tokens TOTAL");
  }
  p.tokens = tokens >= 0 ? tokens : tokens_per_expert * experts;
  p.n = n;
  p.k = k;
  if (!sm.empty()) {
    auto s = ParseDeviceSm(sm);
    if (!s.ok()) return FlagError("--sm", s.status());
    p.sm = *s;
  }
  p.sm_count = sm_count;
  const int64_t routed = routed_experts > 0 ? routed_experts : experts;
  if (routed_top_k < 0 || (routed_top_k > routed && routed >= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--routed-top-k ", routed_top_k, ": give 0 (rows spread evenly) or the router's top-k, "
        "1..", routed, " (the experts it picks from: --routed-experts, default --experts)"));
  }
  if (routed_experts < 0 || (routed_experts > 0 && routed_experts < experts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--routed-experts ", routed_experts, ": give the model's experts, at least --experts ",
        experts, " (this rank's share of them), or 0 for --experts"));
  }
  if (routed_experts > 0 && routed_top_k == 0) {
    return absl::InvalidArgumentError(
        "--routed-experts needs --routed-top-k: the top-k the router picks from them");
  }
  p.routed_top_k = routed_top_k;
  p.routed_experts = routed_experts;
  CUBIST_RETURN_IF_ERROR(ValidateProblem(p));
  return p;
}

}  // namespace cubist::report
