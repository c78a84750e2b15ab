// cubist export: an artifact set from the cache as a plain directory tree.
//   cubist export --layout flashinfer --manifest M [--cache DIR] [--pin REL] DIR
//       puts the pin's files at DIR/<pin>/<path>, as FlashInfer expects under
//       FLASHINFER_CUBIN_DIR=DIR (artifacts/export_tree.h: hard links or verified
//       copies, built aside and renamed into place).
//   --layout plain puts the set's files directly under DIR.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "artifacts/export_tree.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/trust_flags.h"
#include "manifest/flashinfer_import.h"

namespace cubist::cli {
namespace {

struct ExportFlags {
  std::string layout = "flashinfer";
  std::string manifest;
  std::string cache;
  std::string pin;
  std::string dir;
  bool offline = false;
  bool deep = false;
  bool copy = false;
  bool replace = false;
  bool quiet = false;
  report::TrustSpec trust;
};

// The pin directory: --pin, else what `manifest import flashinfer` recorded, else the
// manifest location's "<40 hex>/<name>/checksums.txt" shape.
std::string PinFor(const ExportFlags& f, const Manifest& m) {
  if (!f.pin.empty()) return f.pin;
  if (auto it = m.extras.find(kFlashinferPinExtra); it != m.extras.end()) {
    std::string v = it->second;
    if (v.size() >= 2 && v.front() == '"' && v.back() == '"') return v.substr(1, v.size() - 2);
  }
  return FlashinferPinFromLocation(f.manifest);
}

int RunExport(const ExportFlags& f) {
  if (f.layout != "flashinfer" && f.layout != "plain") {
    return PrintError(absl::InvalidArgumentError(absl::StrCat(
        "export: unknown layout '", f.layout, "'; expected flashinfer or plain")));
  }
  auto store = report::OpenStore(f.cache, /*create=*/false);
  if (!store.ok()) return PrintError(store.status());
  auto opened = report::OpenManifestForRequest(f.manifest, f.trust, &*store, f.offline,
                                               /*record_version=*/false);
  if (!opened.ok()) return PrintError(opened.status());
  ExportOptions options;
  options.deep = f.deep;
  options.copy_only = f.copy;
  options.replace = f.replace;
  if (f.layout == "flashinfer") {
    options.subdir = PinFor(f, opened->manifest);
    if (options.subdir.empty()) {
      return PrintError(absl::InvalidArgumentError(absl::StrCat(
          "export: cannot tell which FlashInfer pin ", f.manifest,
          " is (no flashinfer_pin in the manifest, and its location is not "
          ".../<40 hex>/<name>/checksums.txt); give it with --pin <commit>/<name>")));
    }
  }
  if (f.layout == "flashinfer" &&
      opened->manifest.FindArtifact(kFlashinferChecksumsPath) == nullptr &&
      opened->bytes.find_first_not_of(" \t\r\n") != std::string::npos &&
      opened->bytes[opened->bytes.find_first_not_of(" \t\r\n")] != '{') {
    // Fetched straight from a checksums.txt: FlashInfer reads that file from the pin
    // directory too, and these are its verified bytes.
    options.extra_files.emplace_back(kFlashinferChecksumsPath, opened->bytes);
  }
  absl::StatusOr<ExportReport> report = ExportTree(*store, opened->manifest, f.dir, options);
  if (!report.ok()) return PrintError(report.status());
  if (!f.quiet) {
    std::printf("exported %llu files (%llu hard links, %llu copies, %s) to %s%s\n",
                static_cast<unsigned long long>(report->linked + report->copied),
                static_cast<unsigned long long>(report->linked),
                static_cast<unsigned long long>(report->copied),
                HumanBytes(report->bytes).c_str(), report->root.c_str(),
                report->replaced ? " (replacing the previous tree)" : "");
    if (f.layout == "flashinfer") {
      std::printf("for FlashInfer: export FLASHINFER_CUBIN_DIR=%s\n", f.dir.c_str());
    }
  }
  return kExitOk;
}

}  // namespace

void RegisterExport(CLI::App& app, Globals& g) {
  auto f = std::make_shared<ExportFlags>();
  CLI::App* cmd = app.add_subcommand(
      "export", "Materialize a fetched set as a directory tree (e.g. for FLASHINFER_CUBIN_DIR)");
  cmd->add_option("DIR", f->dir, "Directory to export into")->required();
  cmd->add_option("--manifest", f->manifest, "Manifest URL or path")
      ->required()
      ->type_name("URL|PATH");
  cmd->add_option("--layout", f->layout,
                  "flashinfer (default): DIR/<pin>/<path>; plain: DIR/<path>");
  cmd->add_option("--pin", f->pin,
                  "FlashInfer pin directory, <commit>/<name> (default: from the manifest)");
  cmd->add_option("--cache", f->cache, "Cache directory")->type_name("DIR");
  cmd->add_flag("--offline", f->offline, "Read a URL manifest from the cache's copy");
  cmd->add_flag("--deep", f->deep, "Re-hash hard-linked files too (copies always are)");
  cmd->add_flag("--copy", f->copy, "Copy every file instead of hard-linking");
  cmd->add_flag("--replace", f->replace,
                 "Replace a non-empty directory at the target that cubist export did not make");
  cmd->add_flag("-q,--quiet", f->quiet, "Print nothing on success");
  AddTrustFlags(cmd, &f->trust);
  cmd->callback([f, &g] { g.exit_code = RunExport(*f); });
}

}  // namespace cubist::cli
