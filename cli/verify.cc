// cubist verify: exit 0 only if every artifact of the manifest is in the cache (with
// --deep: and re-hashes to its recorded SHA-256). Never touches CUDA or the network
// beyond reading the manifest.
#include <cstdio>
#include <iostream>

#include "artifacts/verify.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/trust_flags.h"
#include "report/reports.h"

namespace cubist::cli {
namespace {

struct VerifyFlags : report::VerifyRequest {
  bool json = false;
};

int RunVerify(const VerifyFlags& f) {
  VerifyReport report;
  absl::StatusOr<report::CommandReport> r = report::RunVerifyReport(f, &report);
  if (!r.ok()) return PrintError(r.status());
  if (f.json) {
    std::cout << r->json.dump(2) << "\n";
  } else {
    for (const VerifyEntry& e : report.entries) {
      if (e.state != VerifyState::kOk) {
        std::fprintf(stderr, "cubist: error: %s\n", e.message.c_str());
      }
    }
    const std::string cache = r->json["cache"];
    std::printf("%s: %d of %zu artifacts %s, %d missing, %d corrupt (%s hashed in %.2f s); "
                "cache %s\n",
                report.status.ok() ? "verified" : "FAILED", report.ok, report.entries.size(),
                f.deep ? "present and re-hashed"
                       : "present and unchanged since verified (size and publish stamp; "
                         "changed ones re-hashed)",
                report.missing, report.corrupt, HumanBytes(report.bytes_hashed).c_str(),
                absl::ToDoubleSeconds(report.elapsed), cache.c_str());
  }
  return ExitCodeFor(report.status);
}

}  // namespace

void RegisterVerify(CLI::App& app, Globals& g) {
  auto flags = std::make_shared<VerifyFlags>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "Check that every artifact of a manifest is in the cache (--deep: re-hash)");
  cmd->add_option("--manifest,-m", flags->manifest, "Manifest URL or path")->required();
  cmd->add_option("--cache", flags->cache, "Cache directory");
  cmd->add_flag("--deep", flags->deep,
                "Re-hash every byte on all cores; corrupt objects are removed so that "
                "'cubist fetch' repairs them");
  cmd->add_option("--threads", flags->threads, "Hashing threads for --deep (0: all cores)");
  cmd->add_flag("--offline", flags->offline, "Read a URL manifest from the cache's copy");
  cmd->add_flag("--json", flags->json, "Print a JSON report on stdout");
  AddTrustFlags(cmd, &flags->trust);
  cmd->callback([flags, &g] { g.exit_code = RunVerify(*flags); });
}

}  // namespace cubist::cli
