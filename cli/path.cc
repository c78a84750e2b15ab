// cubist path: prints the local file of an artifact (or of a kernel's artifact), for
// scripts and for engines that load cubins themselves. Exit 5 when it is not cached.
#include <cstdio>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/trust_flags.h"

namespace cubist::cli {
namespace {

struct PathFlags {
  std::string manifest;
  std::string cache;
  std::string artifact;
  bool offline = false;
  report::TrustSpec trust;
};

int RunPath(const PathFlags& f) {
  auto store = report::OpenStore(f.cache, /*create=*/false);
  if (!store.ok()) return PrintError(store.status());
  auto opened = report::OpenManifestForRequest(f.manifest, f.trust, &*store, f.offline, false);
  if (!opened.ok()) return PrintError(opened.status());
  const Manifest& m = opened->manifest;
  const Artifact* a = m.FindArtifact(f.artifact);
  if (a == nullptr) {
    if (const KernelSpec* k = m.FindKernel(f.artifact)) a = m.FindArtifact(k->artifact);
  }
  if (a == nullptr) {
    return PrintError(absl::NotFoundError(absl::StrCat(
        "path: ", f.artifact, " is neither an artifact path nor a kernel name in ",
        f.manifest, "; see 'cubist list'")));
  }
  // Changed since it was published: never hand out a path before its bytes are hashed
  // again (store.h, "the publish record").
  absl::StatusOr<ObjectState> state = store->ProbeConfirmed(a->sha256, a->size);
  if (!state.ok()) {
    return PrintError(absl::Status(state.status().code(), absl::StrCat(
        "path: ", a->path, ": ", state.status().message(), "; run 'cubist fetch' to repair")));
  }
  if (*state != ObjectState::kPresent) {
    return PrintError(absl::NotFoundError(absl::StrCat(
        "path: ", a->path, " is not in the cache ", store->root(), "; run 'cubist fetch'")));
  }
  std::printf("%s\n", store->ObjectPath(a->sha256).c_str());
  return kExitOk;
}

}  // namespace

void RegisterPath(CLI::App& app, Globals& g) {
  auto flags = std::make_shared<PathFlags>();
  CLI::App* cmd = app.add_subcommand("path", "Print the cached file of an artifact or kernel");
  cmd->add_option("artifact", flags->artifact, "Artifact path or kernel name")->required();
  cmd->add_option("--manifest,-m", flags->manifest, "Manifest URL or path")->required();
  cmd->add_option("--cache", flags->cache, "Cache directory");
  cmd->add_flag("--offline", flags->offline, "Read a URL manifest from the cache's copy");
  AddTrustFlags(cmd, &flags->trust);
  cmd->callback([flags, &g] { g.exit_code = RunPath(*flags); });
}

}  // namespace cubist::cli
