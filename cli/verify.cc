// cubist verify: exit 0 only if every artifact of the manifest is in the cache (with
// --deep: and re-hashes to its recorded SHA-256). Never touches CUDA or the network
// beyond reading the manifest.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "artifacts/verify.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"

namespace cubist::cli {
namespace {

struct VerifyFlags {
  std::string manifest;
  std::string cache;
  bool deep = false;
  bool json = false;
  bool offline = false;
  int threads = 0;
  TrustFlags trust;
};

int RunVerify(const VerifyFlags& f) {
  auto store = OpenStore(f.cache, /*create=*/false);
  if (!store.ok()) return PrintError(store.status());
  auto opened = OpenManifestForCommand(f.manifest, f.trust, &*store, f.offline,
                                       /*record_version=*/false);
  if (!opened.ok()) return PrintError(opened.status());
  VerifyOptions options;
  options.deep = f.deep;
  options.threads = f.threads;
  VerifyReport report = VerifyArtifacts(*store, opened->manifest.artifacts, options);
  double secs = absl::ToDoubleSeconds(report.elapsed);
  if (f.json) {
    nlohmann::json j;
    j["manifest"] = f.manifest;
    j["digest"] = opened->manifest.digest;
    j["cache"] = store->root();
    j["deep"] = f.deep;
    j["seconds"] = secs;
    j["bytes_hashed"] = report.bytes_hashed;
    j["counts"] = {{"ok", report.ok}, {"missing", report.missing}, {"corrupt", report.corrupt}};
    nlohmann::json bad = nlohmann::json::array();
    for (const VerifyEntry& e : report.entries) {
      if (e.state == VerifyState::kOk) continue;
      nlohmann::json b = {{"path", e.path}, {"state", VerifyStateName(e.state)},
                          {"expected_sha256", e.expected_sha256},
                          {"actual_size", e.actual_size}, {"removed", e.removed},
                          {"message", e.message}};
      if (e.expected_size) b["expected_size"] = *e.expected_size;
      if (!e.actual_sha256.empty()) b["actual_sha256"] = e.actual_sha256;
      bad.push_back(std::move(b));
    }
    j["bad"] = std::move(bad);
    j["ok"] = report.status.ok();
    std::cout << j.dump(2) << "\n";
  } else {
    for (const VerifyEntry& e : report.entries) {
      if (e.state != VerifyState::kOk) {
        std::fprintf(stderr, "cubist: error: %s\n", e.message.c_str());
      }
    }
    std::printf("%s: %d of %zu artifacts %s, %d missing, %d corrupt (%s hashed in %.2f s); "
                "cache %s\n",
                report.status.ok() ? "verified" : "FAILED", report.ok, report.entries.size(),
                f.deep ? "present and re-hashed" : "present with the right size",
                report.missing, report.corrupt, HumanBytes(report.bytes_hashed).c_str(), secs,
                store->root().c_str());
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
