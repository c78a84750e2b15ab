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
  CUBIST_RETURN_IF_ERROR(ValidateProblem(p));
  return p;
}

}  // namespace cubist::report
