// cubist list: a manifest's artifacts and kernels with their local state.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "artifacts/cache_dir.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/trust_flags.h"

namespace cubist::cli {
namespace {

struct ListFlags {
  std::string manifest;
  std::string cache;
  bool json = false;
  bool offline = false;
  report::TrustSpec trust;
};

const char* StateName(ObjectState s) {
  switch (s) {
    case ObjectState::kPresent: return "cached";
    case ObjectState::kMissing: return "missing";
    case ObjectState::kWrongSize: return "corrupt";
    case ObjectState::kNotRegular: return "corrupt";
    case ObjectState::kUnconfirmed: return "changed";  // `verify` or `fetch` hashes it
  }
  return "?";
}

int RunList(const ListFlags& f) {
  auto root = ResolveCacheDir(f.cache);
  if (!root.ok()) return PrintError(root.status());
  // A missing cache is fine here: everything is simply "missing".
  auto store = Store::Open(*root, /*create=*/false);
  const Store* sp = store.ok() ? &*store : nullptr;
  auto opened = report::OpenManifestForRequest(f.manifest, f.trust, sp, f.offline, false);
  if (!opened.ok()) return PrintError(opened.status());
  const Manifest& m = opened->manifest;
  auto state = [&](const Artifact& a) {
    return sp ? sp->Probe(a.sha256, a.size) : ObjectState::kMissing;
  };
  if (f.json) {
    nlohmann::json j;
    j["name"] = m.name;
    j["version"] = m.version;
    j["digest"] = m.digest;
    j["cache"] = *root;
    nlohmann::json arts = nlohmann::json::array();
    for (const Artifact& a : m.artifacts) {
      nlohmann::json x = {{"path", a.path}, {"sha256", a.sha256}, {"state", StateName(state(a))}};
      if (a.size) x["size"] = *a.size;
      if (sp) x["local_path"] = sp->ObjectPath(a.sha256);
      arts.push_back(std::move(x));
    }
    nlohmann::json ks = nlohmann::json::array();
    for (const KernelSpec& k : m.kernels) {
      const Artifact* a = m.FindArtifact(k.artifact);
      ks.push_back({{"name", k.name}, {"artifact", k.artifact}, {"arch", k.arch},
                    {"op", k.op}, {"weight_format", k.weight_format},
                    {"activation_format", k.activation_format}, {"activation", k.activation},
                    {"tile", {k.tile_m, k.tile_n, k.tile_k}},
                    {"state", a ? StateName(state(*a)) : "missing"}});
    }
    j["artifacts"] = std::move(arts);
    j["kernels"] = std::move(ks);
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  int cached = 0;
  std::printf("%s v%lld  digest %s  cache %s\n", m.name.c_str(),
              static_cast<long long>(m.version), m.digest.c_str(), root->c_str());
  std::printf("artifacts (%zu):\n", m.artifacts.size());
  for (const Artifact& a : m.artifacts) {
    ObjectState s = state(a);
    cached += s == ObjectState::kPresent;
    std::printf("  %-8s %10s  %s\n", StateName(s), a.size ? HumanBytes(*a.size).c_str() : "?",
                a.path.c_str());
  }
  if (!m.kernels.empty()) {
    std::printf("kernels (%zu):\n", m.kernels.size());
    for (const KernelSpec& k : m.kernels) {
      const Artifact* a = m.FindArtifact(k.artifact);
      std::printf("  %-8s %-7s %s x %s %-8s %dx%dx%d  %s\n",
                  a ? StateName(state(*a)) : "missing", k.arch.c_str(),
                  k.weight_format.c_str(), k.activation_format.c_str(), k.activation.c_str(),
                  k.tile_m, k.tile_n, k.tile_k, k.name.c_str());
    }
  }
  std::printf("%d of %zu artifacts cached\n", cached, m.artifacts.size());
  return kExitOk;
}

}  // namespace

void RegisterList(CLI::App& app, Globals& g) {
  auto flags = std::make_shared<ListFlags>();
  CLI::App* cmd = app.add_subcommand("list", "List a manifest's artifacts and kernels with their local state");
  cmd->add_option("--manifest,-m", flags->manifest, "Manifest URL or path")->required();
  cmd->add_option("--cache", flags->cache, "Cache directory");
  cmd->add_flag("--offline", flags->offline, "Read a URL manifest from the cache's copy");
  cmd->add_flag("--json", flags->json, "Print JSON on stdout");
  AddTrustFlags(cmd, &flags->trust);
  cmd->callback([flags, &g] { g.exit_code = RunList(*flags); });
}

}  // namespace cubist::cli
