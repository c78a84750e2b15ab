// The flags that describe one MoE GEMM problem, shared by `cubist select`, `run` and
// `tune`, into a report::ProblemSpec (report/problem_spec.h). Header-only so that each
// subcommand stays one file:
//   report::ProblemSpec pf;          // lives as long as the CLI::App
//   AddProblemFlags(sub, &pf, /*sm_required=*/true);
//   ... in the callback: absl::StatusOr<MoeProblem> p = pf.ToProblem();
#ifndef CUBIST_CLI_MOE_PROBLEM_FLAGS_H_
#define CUBIST_CLI_MOE_PROBLEM_FLAGS_H_

#include <CLI/CLI.hpp>

#include "report/problem_spec.h"

namespace cubist::cli {

// shape_required: --n and --k are required flags (run makes them optional because its
// `--op moe` describes a layer instead, and checks them itself for a GEMM).
inline void AddProblemFlags(CLI::App* cmd, report::ProblemSpec* f, bool sm_required,
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
  cmd->add_option("--routed-top-k", f->routed_top_k,
                  "The rows come from a top-K router: TOTAL / K tokens each pick K distinct "
                  "experts at random, so experts get uneven rows (as MoeLayer's GEMMs do); "
                  "priced, and timed, on that spread (default 0: rows spread evenly)")
      ->type_name("K");
  cmd->add_option("--routed-experts", f->routed_experts,
                  "The experts the router picks from when --experts is one rank's share of "
                  "them (expert parallelism; default: --experts)")
      ->type_name("R");
}

}  // namespace cubist::cli

#endif  // CUBIST_CLI_MOE_PROBLEM_FLAGS_H_
