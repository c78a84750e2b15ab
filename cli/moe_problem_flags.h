// The flags that describe one MoE GEMM problem, shared by `cubist select`, `run` and
// `tune`. Header-only so that each subcommand stays one file:
//   ProblemFlags pf;                 // lives as long as the CLI::App
//   AddProblemFlags(sub, &pf, /*sm_required=*/true);
//   ... in the callback: absl::StatusOr<MoeProblem> p = pf.ToProblem();
#ifndef CUBIST_CLI_MOE_PROBLEM_FLAGS_H_
#define CUBIST_CLI_MOE_PROBLEM_FLAGS_H_

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "dispatch/problem.h"

namespace cubist::cli {

struct ProblemFlags {
  std::string op = "moe_gemm";  // --op, offered by select only (run and tune launch moe_gemm)
  std::string output_format;    // --output-format, select only; empty: any
  std::string weights;
  std::string activations;
  std::string activation = "identity";
  int64_t experts = 0;
  int64_t tokens_per_expert = -1;
  int64_t tokens = -1;
  int64_t n = 0;
  int64_t k = 0;
  std::string sm;  // empty: the device's (run, tune)
  int sm_count = 0;

  // Errors are InvalidArgument naming the flag; the caller exits with kExitUsage.
  [[nodiscard]] absl::StatusOr<MoeProblem> ToProblem() const {
    MoeProblem p;
    auto flag_error = [](const char* flag, const absl::Status& s) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", s.message()));
    };
    auto o = ParseOp(op);
    if (!o.ok()) return flag_error("--op", o.status());
    p.op = *o;
    auto w = ParseDataFormat(weights);
    if (!w.ok()) return flag_error("--weights", w.status());
    auto a = ParseDataFormat(activations);
    if (!a.ok()) return flag_error("--activations", a.status());
    auto act = ParseActivation(activation);
    if (!act.ok()) return flag_error("--activation", act.status());
    if (!output_format.empty()) {
      auto out = ParseDataFormat(output_format);
      if (!out.ok()) return flag_error("--output-format", out.status());
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
      if (!s.ok()) return flag_error("--sm", s.status());
      p.sm = *s;
    }
    p.sm_count = sm_count;
    CUBIST_RETURN_IF_ERROR(ValidateProblem(p));
    return p;
  }
};

// shape_required: --n and --k are required flags (run makes them optional because its
// `--op moe` describes a layer instead, and checks them itself for a GEMM).
inline void AddProblemFlags(CLI::App* cmd, ProblemFlags* f, bool sm_required,
                            bool shape_required = true) {
  cmd->add_option("--weights", f->weights,
                  "Weight (B) format: bf16, fp8, fp8-block, mxfp4, mxfp8, nvfp4")
      ->required()
      ->type_name("FMT");
  cmd->add_option("--activations", f->activations, "Activation (A) format, same names")
      ->required()
      ->type_name("FMT");
  cmd->add_option("--activation", f->activation,
                  "Epilogue: identity (default), relu2, swiglu, geglu, situ")
      ->type_name("ACT");
  cmd->add_option("--experts", f->experts, "Number of experts E")->required()->type_name("E");
  cmd->add_option("--tokens-per-expert", f->tokens_per_expert,
                  "Tokens routed to each expert (tokens = T * E)")
      ->type_name("T");
  cmd->add_option("--tokens", f->tokens, "Total tokens (the offsets' total) instead")
      ->type_name("TOTAL");
  auto* n = cmd->add_option("--n", f->n, "N: output columns per expert (both halves when gated)");
  auto* k = cmd->add_option("--k", f->k, "K: the reduction length");
  if (shape_required) {
    n->required();
    k->required();
  }
  auto* sm = cmd->add_option("--sm", f->sm,
                             sm_required ? "Device SM, e.g. 90a (H100/H200), 100 (B200)"
                                         : "Device SM (default: the GPU's)")
                 ->type_name("SM");
  if (sm_required) sm->required();
  cmd->add_option("--sm-count", f->sm_count,
                  "Multiprocessors of the device (default: 132 for SM 90, 148 for SM 100)")
      ->type_name("N");
}

}  // namespace cubist::cli

#endif  // CUBIST_CLI_MOE_PROBLEM_FLAGS_H_
