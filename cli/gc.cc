// cubist gc: frees objects no kept manifest or root in use references, stale partial
// downloads, staging directories and roots, and unheld lock files; --drop forgets a
// kept manifest (artifacts/keep.h).
#include <cstdio>

#include "artifacts/gc.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"

namespace cubist::cli {
namespace {

struct GcFlags {
  std::string cache;
  std::vector<std::string> keep;
  std::vector<std::string> drop;
  bool dry_run = false;
};

int RunGc(const GcFlags& f) {
  auto store = report::OpenStore(f.cache, /*create=*/false);
  if (!store.ok()) return PrintError(store.status());
  GcOptions options;
  options.dry_run = f.dry_run;
  options.drop = f.drop;
  for (const std::string& k : f.keep) {
    OpenManifestOptions o;
    auto m = OpenManifest(k, o);
    if (!m.ok()) return PrintError(Annotate(m.status(), "gc --keep; nothing was deleted"));
    options.extra_keep.push_back(std::move(m->manifest));
  }
  auto report = CollectGarbage(*store, options);
  if (!report.ok()) return PrintError(report.status());
  for (const std::string& d : report->dropped) {
    std::printf("%s kept manifest %s\n", f.dry_run ? "would drop" : "dropped", d.c_str());
  }
  std::printf("%s %d objects (%s), %d partial downloads, %d lock files, %d parsed "
              "manifests, %d abandoned roots; kept %d objects of %d manifests and %d roots in use; "
              "%d busy, skipped; cache %s\n",
              f.dry_run ? "would remove" : "removed", report->objects_removed,
              HumanBytes(report->bytes_freed).c_str(), report->temps_removed,
              report->locks_removed, report->parsed_removed, report->roots_removed,
              report->objects_kept, report->kept_manifests, report->roots_in_use,
              report->busy_skipped, store->root().c_str());
  return kExitOk;
}

}  // namespace

void RegisterGc(CLI::App& app, Globals& g) {
  auto flags = std::make_shared<GcFlags>();
  CLI::App* cmd = app.add_subcommand(
      "gc", "Remove cached objects that no kept manifest references, and stale temp files");
  cmd->add_option("--cache", flags->cache, "Cache directory");
  cmd->add_option("--keep", flags->keep, "Also keep this manifest's objects; repeatable");
  cmd->add_option("--drop", flags->drop,
                  "Forget a kept manifest, so that its objects no other one names are "
                  "removed: NAME (every kept version), NAME@VERSION or NAME@DIGEST-PREFIX; "
                  "repeatable")->type_name("NAME[@VERSION]");
  cmd->add_flag("--dry-run,-n", flags->dry_run, "Say what would be removed; remove nothing");
  cmd->callback([flags, &g] { g.exit_code = RunGc(*flags); });
}

}  // namespace cubist::cli
