// cubist select: which kernel of a manifest would run a MoE GEMM problem, and why.
// Needs no GPU: the device is described by --sm (and --sm-count).
#include <cstdio>
#include <iostream>

#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/moe_problem_flags.h"
#include "cli/trust_flags.h"
#include "report/reports.h"
#include "dispatch/registry.h"
#include "dispatch/selector.h"

namespace cubist::cli {
namespace {

struct SelectFlags : report::SelectRequest {
  report::ProblemSpec problem_flags;
  bool json = false;
};

int RunSelect(const SelectFlags& f) {
  absl::StatusOr<MoeProblem> problem = f.problem_flags.ToProblem();
  if (!problem.ok()) {
    PrintError(problem.status());
    return kExitUsage;
  }
  report::SelectRequest request = f;
  request.problem = *problem;
  absl::StatusOr<std::unique_ptr<report::Selection>> selected = report::Select(request);
  if (!selected.ok()) return PrintError(selected.status());
  const report::Selection& sel = **selected;
  if (f.json) {
    report::CommandReport r = report::SelectReport(sel, f.explain);
    std::cout << r.json.dump(2) << "\n";
    return r.status.ok() ? kExitOk : ExitCodeFor(r.status);
  }

  if (f.explain) std::cout << FormatExplain(sel.problem, sel.verdicts);
  if (!sel.ranked.ok()) return PrintError(sel.ranked.status());
  const Candidate& best = sel.ranked->front();
  const KernelSpec& s = best.kernel->spec;
  if (f.explain) std::cout << "selected: ";
  std::cout << s.name << "\n";
  std::cout << absl::StrFormat(
      "  rank 1 of %d candidate%s on SM %d with %d SMs; estimated %s\n  %s in %s, %s, "
      "tile %dx%dx%d, cluster %dx%dx%d, %d threads, %d bytes of shared memory\n",
      static_cast<int>(sel.ranked->size()), sel.ranked->size() == 1 ? "" : "s",
      sel.problem.sm.number(), DeviceForProblem(sel.problem).sm_count, best.cost.ToString(),
      s.function, s.artifact, s.arch, s.tile_m, s.tile_n, s.tile_k, s.cluster[0],
      s.cluster[1], s.cluster[2], s.threads, s.shared_mem_bytes);
  return kExitOk;
}

}  // namespace

void RegisterSelect(CLI::App& app, Globals& g) {
  auto f = std::make_shared<SelectFlags>();
  CLI::App* cmd = app.add_subcommand(
      "select",
      "Show which kernel of a manifest runs a MoE GEMM problem (no GPU needed)");
  // --op trtllm_bmm: the same problem (experts, tokens, N, K, formats, activation) over
  // FlashInfer's trtllm-gen kernels imported with `cubist manifest import flashinfer`.
  cmd->add_option("--manifest", f->manifest, "Manifest URL or path")
      ->required()
      ->type_name("URL|PATH");
  AddProblemFlags(cmd, &f->problem_flags, /*sm_required=*/true);
  cmd->add_option("--op", f->problem_flags.op,
                  "Operation: moe_gemm (default) or trtllm_bmm (an imported FlashInfer set)")
      ->type_name("OP");
  cmd->add_option("--output-format", f->problem_flags.output_format,
                  "Only kernels that write this format (trtllm_bmm: bf16, fp8, nvfp4, ...)")
      ->type_name("FMT");
  cmd->add_option("--kernel", f->pin, "Consider only this kernel (debugging)")
      ->type_name("NAME");
  cmd->add_flag("--allow-inexact", f->allow_inexact,
                "Also consider kernels that round an operand on purpose (manifest "
                "\"exact\": false)");
  cmd->add_flag("--json", f->json, "Print the choice as JSON");
  cmd->add_flag("--explain", f->explain,
                "Say why each kernel was rejected or where it ranks");
  cmd->add_flag("--offline", f->offline, "Read a URL manifest from the cache's copy");
  cmd->add_option("--cache", f->cache, "Cache directory (for --offline)")->type_name("DIR");
  AddTrustFlags(cmd, &f->trust);
  cmd->callback([f, &g] { g.exit_code = RunSelect(*f); });
}

}  // namespace cubist::cli
