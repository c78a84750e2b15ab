// cubist select: which kernel of a manifest would run a MoE GEMM problem, and why.
// Needs no GPU: the device is described by --sm (and --sm-count).
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/moe_problem_flags.h"
#include "dispatch/registry.h"
#include "dispatch/selector.h"

namespace cubist::cli {
namespace {

struct SelectFlags {
  std::string manifest;
  std::string cache;
  ProblemFlags problem;
  std::string pin;
  bool json = false;
  bool explain = false;
  bool offline = false;
  TrustFlags trust;
};

nlohmann::json ProblemJson(const MoeProblem& p) {
  return {{"op", OpName(p.op)},
          {"weights", DataFormatName(p.weight_format)},
          {"activations", DataFormatName(p.activation_format)},
          {"activation", ActivationName(p.activation)},
          {"experts", p.experts},
          {"tokens", p.tokens},
          {"tokens_per_expert", p.tokens_per_expert()},
          {"n", p.n},
          {"k", p.k},
          {"sm", p.sm.number()},
          {"sm_count", DeviceForProblem(p).sm_count}};
}

nlohmann::json CostJson(const CostEstimate& c) {
  return {{"time_us", c.time_us},       {"compute_us", c.compute_us},
          {"memory_us", c.memory_us},   {"ctas", c.ctas},
          {"ctas_per_sm", c.ctas_per_sm}, {"waves", c.waves},
          {"efficiency_m", c.efficiency_m}, {"efficiency_n", c.efficiency_n},
          {"efficiency_k", c.efficiency_k}};
}

nlohmann::json VerdictsJson(const std::vector<Verdict>& verdicts) {
  nlohmann::json out = nlohmann::json::array();
  for (const Verdict& v : verdicts) {
    nlohmann::json j = {{"kernel", v.kernel->name()}, {"rank", v.rank}};
    if (v.cost) j["estimate"] = CostJson(*v.cost);
    nlohmann::json rejections = nlohmann::json::array();
    for (const Rejection& r : v.rejections) {
      rejections.push_back({{"reason", RejectReasonName(r.reason)}, {"detail", r.detail}});
    }
    j["rejections"] = std::move(rejections);
    out.push_back(std::move(j));
  }
  return out;
}

int RunSelect(const SelectFlags& f) {
  absl::StatusOr<MoeProblem> problem = f.problem.ToProblem();
  if (!problem.ok()) {
    PrintError(problem.status());
    return kExitUsage;
  }
  // The cache only helps with URL manifests read offline; select never creates it.
  auto root = ResolveCacheDir(f.cache);
  std::optional<Store> store;
  if (root.ok()) {
    if (auto s = Store::Open(*root, /*create=*/false); s.ok()) store.emplace(std::move(*s));
  }
  auto opened = OpenManifestForCommand(f.manifest, f.trust, store ? &*store : nullptr,
                                       f.offline, /*record_version=*/false);
  if (!opened.ok()) return PrintError(opened.status());
  absl::StatusOr<Registry> registry = Registry::Create(opened->manifest);
  if (!registry.ok()) return PrintError(registry.status());

  SelectOptions options;
  options.pinned = f.pin;
  absl::StatusOr<std::vector<Candidate>> ranked =
      RankCandidates(*registry, *problem, options);
  std::vector<Verdict> verdicts;
  if (f.explain) verdicts = Explain(*registry, *problem, options);

  if (f.json) {
    nlohmann::json j = {{"manifest", registry->manifest_source()},
                        {"problem", ProblemJson(*problem)}};
    if (ranked.ok()) {
      const Candidate& best = ranked->front();
      const KernelSpec& s = best.kernel->spec;
      j["kernel"] = s.name;
      j["artifact"] = s.artifact;
      j["function"] = s.function;
      j["arch"] = s.arch;
      j["tile"] = {s.tile_m, s.tile_n, s.tile_k};
      j["cluster"] = s.cluster;
      j["threads"] = s.threads;
      j["shared_mem_bytes"] = s.shared_mem_bytes;
      j["estimate"] = CostJson(best.cost);
      nlohmann::json cands = nlohmann::json::array();
      for (const Candidate& c : *ranked) {
        cands.push_back({{"kernel", c.kernel->name()}, {"rank", c.rank},
                         {"time_us", c.cost.time_us}});
      }
      j["candidates"] = std::move(cands);
    } else {
      j["kernel"] = nullptr;
      j["error"] = std::string(ranked.status().message());
    }
    if (f.explain) j["verdicts"] = VerdictsJson(verdicts);
    std::cout << j.dump(2) << "\n";
    return ranked.ok() ? kExitOk : ExitCodeFor(ranked.status());
  }

  if (f.explain) std::cout << FormatExplain(*problem, verdicts);
  if (!ranked.ok()) return PrintError(ranked.status());
  const Candidate& best = ranked->front();
  const KernelSpec& s = best.kernel->spec;
  if (f.explain) std::cout << "selected: ";
  std::cout << s.name << "\n";
  std::cout << absl::StrFormat(
      "  rank 1 of %d candidate%s on SM %d with %d SMs; estimated %s\n  %s in %s, %s, "
      "tile %dx%dx%d, cluster %dx%dx%d, %d threads, %d bytes of shared memory\n",
      static_cast<int>(ranked->size()), ranked->size() == 1 ? "" : "s",
      problem->sm.number(), DeviceForProblem(*problem).sm_count, best.cost.ToString(), s.function, s.artifact, s.arch, s.tile_m, s.tile_n, s.tile_k,
      s.cluster[0], s.cluster[1], s.cluster[2], s.threads, s.shared_mem_bytes);
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
  AddProblemFlags(cmd, &f->problem, /*sm_required=*/true);
  cmd->add_option("--op", f->problem.op,
                  "Operation: moe_gemm (default) or trtllm_bmm (an imported FlashInfer set)")
      ->type_name("OP");
  cmd->add_option("--output-format", f->problem.output_format,
                  "Only kernels that write this format (trtllm_bmm: bf16, fp8, nvfp4, ...)")
      ->type_name("FMT");
  cmd->add_option("--kernel", f->pin, "Consider only this kernel (debugging)")
      ->type_name("NAME");
  cmd->add_flag("--json", f->json, "Print the choice as JSON");
  cmd->add_flag("--explain", f->explain,
                "Say why each kernel was rejected or where it ranks");
  cmd->add_flag("--offline", f->offline, "Read a URL manifest from the cache's copy");
  cmd->add_option("--cache", f->cache, "Cache directory (for --offline)")->type_name("DIR");
  AddTrustFlags(cmd, &f->trust);
  cmd->callback([f, &g] { g.exit_code = RunSelect(*f); });
}

}  // namespace cubist::cli
