// cubist tune: times the best candidates for a MoE GEMM problem on the GPU and records
// the winner for the problem's shape bucket in the tuning file, where every Runtime on
// this kind of GPU, driver and manifest then finds it.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/moe_problem_flags.h"
#include "cli/trust_flags.h"
#include "dispatch/moe_gemm.h"
#include "dispatch/runtime.h"

namespace cubist::cli {
namespace {

struct TuneFlags {
  std::string manifest;
  std::string cache;
  std::string tuning_file;
  report::ProblemSpec problem;
  int device = 0;
  int top = 4;
  int iterations = 20;
  int warmup = 3;
  bool dry_run = false;
  bool json = false;
  bool offline = false;
  bool allow_inexact = false;
  report::TrustSpec trust;
};

int RunTune(const TuneFlags& f) {
  absl::StatusOr<MoeProblem> problem = f.problem.ToProblem();
  if (!problem.ok()) {
    PrintError(problem.status());
    return kExitUsage;
  }
  absl::StatusOr<RuntimeOptions> ro =
      RuntimeOptionsForCommand(f.manifest, f.cache, f.device, f.offline, f.trust);
  if (!ro.ok()) return PrintError(ro.status());
  ro->tuning_file = f.tuning_file;
  auto rt = Runtime::Open(*ro);
  if (!rt.ok()) return PrintError(rt.status());
  MoeGemmOptions mo;
  mo.allow_inexact = f.allow_inexact;
  auto gemm = MoeGemm::Create(**rt, mo);
  if (!gemm.ok()) return PrintError(gemm.status());
  MoeGemmTuneOptions to;
  to.autotune.top_k = f.top > 0 ? f.top : static_cast<int>((*rt)->registry().size());
  to.iterations = f.iterations;
  to.warmup = f.warmup;
  to.record = !f.dry_run;
  auto result = (*gemm)->Tune(*problem, to);
  if (!result.ok()) return PrintError(result.status());
  MoeProblem p = *problem;
  p.sm = (*rt)->sm();
  p.sm_count = (*rt)->device_info().sm_count;
  if (f.json) {
    nlohmann::json timings = nlohmann::json::array();
    for (const TimedCandidate& t : result->timings) {
      nlohmann::json j = {{"kernel", t.kernel->name()}, {"model_rank", t.model_rank},
                          {"model_us", t.model_us}};
      if (t.error.ok()) {
        j["measured_us"] = t.measured_us;
      } else {
        j["error"] = std::string(t.error.message());
      }
      timings.push_back(std::move(j));
    }
    nlohmann::json j = {{"device", (*rt)->device_name()},
                        {"problem", ToString(p)},
                        {"bucket", BucketOf(p).ToString()},
                        {"winner", result->winner->name()},
                        {"winner_us", result->winner_us},
                        {"timings", std::move(timings)},
                        {"tuning_file", f.dry_run ? "" : (*rt)->tuning_path()}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "problem: " << ToString(p) << "\nbucket: " << BucketOf(p).ToString() << "\n"
            << FormatAutotune(*result) << "winner: " << result->winner->name()
            << absl::StrFormat(" (%.1f us, %.1f TFLOP/s)\n", result->winner_us,
                               p.flops() / (result->winner_us * 1e-6) / 1e12);
  if (!f.dry_run && !(*rt)->tuning_path().empty()) {
    std::cout << "recorded in " << (*rt)->tuning_path() << "\n";
  }
  return kExitOk;
}

}  // namespace

void RegisterTune(CLI::App& app, Globals& g) {
  auto f = std::make_shared<TuneFlags>();
  CLI::App* cmd = app.add_subcommand(
      "tune", "Time the best kernel candidates for a MoE GEMM problem on the GPU and record "
              "the winner for its shape bucket");
  cmd->add_option("--manifest", f->manifest, "Manifest URL or path")->required()->type_name("URL|PATH");
  AddProblemFlags(cmd, &f->problem, /*sm_required=*/false);
  cmd->add_option("--top", f->top, "Candidates to time, best-ranked first (0: all; default 4)");
  cmd->add_option("--iterations", f->iterations, "Timed launches per candidate (default 20)");
  cmd->add_option("--warmup", f->warmup, "Launches before timing (default 3)");
  cmd->add_option("--device", f->device, "CUDA device ordinal (default 0)");
  cmd->add_option("--tuning-file", f->tuning_file,
                  "Where winners are recorded (default: <cache>/tuning.json)")
      ->type_name("FILE");
  cmd->add_flag("--dry-run", f->dry_run, "Time and print, record nothing");
  cmd->add_flag("--allow-inexact", f->allow_inexact,
                "Also consider kernels that round an operand on purpose (manifest "
                "\"exact\": false)");
  cmd->add_flag("--json", f->json, "Print the timings as JSON");
  cmd->add_flag("--offline", f->offline, "No network: the manifest and kernels must be cached");
  cmd->add_option("--cache", f->cache, "Cache directory")->type_name("DIR");
  AddTrustFlags(cmd, &f->trust);
  cmd->callback([f, &g] { g.exit_code = RunTune(*f); });
}

}  // namespace cubist::cli
