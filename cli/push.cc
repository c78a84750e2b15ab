// `cubist push`: publishes an artifact set to an OCI registry (artifacts/oci_push.h).
//   cubist push --manifest DIR/manifest.json oci://HOST[:PORT]/REPO:TAG [-j N]
//   cubist push --manifest URL [--cache DIR] oci://HOST[:PORT]/REPO:TAG
// Artifacts come from beside a local manifest, else from the cache (a fetched set, e.g.
// a FlashInfer pin, mirrored into a site's own registry).
// Prints the image manifest's digest on stdout (the pinned name of the whole set:
// oci://HOST/REPO@sha256:...), a summary on stderr. Re-running an interrupted push
// uploads only the blobs the registry lacks.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "artifacts/manifest_source.h"
#include "artifacts/oci_push.h"
#include "artifacts/sources.h"
#include "base/file_util.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/trust_flags.h"
#include "manifest/trust.h"

namespace cubist::cli {
namespace {

struct PushFlags {
  std::string manifest;
  std::string cache;
  std::string target;
  int jobs = 8;
  bool quiet = false;
  report::TrustSpec trust;
};

int RunPush(const PushFlags& f) {
  auto ref = ParseOciReference(f.target);
  if (!ref.ok()) return PrintError(ref.status());
  const bool remote = IsUrl(f.manifest) || IsOciReference(f.manifest);
  // The cache: where a remote set's artifacts must be, and where a local manifest's
  // come from when they are not beside it.
  std::optional<Store> store;
  if (auto s = report::OpenStore(f.cache, /*create=*/false); s.ok()) {
    store.emplace(*std::move(s));
  } else if (remote) {
    return PrintError(Annotate(s.status(), absl::StrCat("push ", f.manifest)));
  }
  // The same checks as any consumer (schema, paths, and the signature when keys are
  // trusted), so that a set the fetchers would refuse is not published.
  auto opened = report::OpenManifestForRequest(f.manifest, f.trust, remote ? &*store : nullptr,
                                               /*offline=*/false, /*record_version=*/false);
  if (!opened.ok()) return PrintError(opened.status());
  PushSource source;
  source.manifest_bytes = opened->bytes;
  source.manifest = opened->manifest;
  source.cache = store.has_value() ? &*store : nullptr;
  if (!remote) {
    std::string dir = DirName(f.manifest);
    source.artifact_dir = dir.empty() ? "." : dir;
    auto sig = ReadFileToString(SignatureLocation(f.manifest), 64 << 10);
    if (sig.ok()) source.signature = *std::move(sig);
  }
  PushOptions options;
  options.jobs = f.jobs;
  auto report = PushArtifactSet(*ref, source, options);
  if (!report.ok()) return PrintError(report.status());
  if (!f.quiet) {
    std::fprintf(stderr,
                 "pushed %s: %zu artifacts, %d blobs uploaded (%s), %d already in the "
                 "registry, in %.2f s; pinned: oci://%s/%s@%s\n",
                 ref->ToString().c_str(), source.manifest.artifacts.size(),
                 report->blobs_uploaded, HumanBytes(report->bytes_uploaded).c_str(),
                 report->blobs_present, absl::ToDoubleSeconds(report->elapsed),
                 ref->host.c_str(), ref->repository.c_str(), report->digest.c_str());
  }
  std::printf("%s\n", report->digest.c_str());
  return 0;
}

}  // namespace

void RegisterPush(CLI::App& app, Globals& g) {
  auto flags = std::make_shared<PushFlags>();
  CLI::App* cmd = app.add_subcommand(
      "push", "Publish an artifact set to an OCI registry (prints the manifest digest)");
  cmd->add_option("--manifest,-m", flags->manifest,
                  "Manifest: a local file (artifacts from beside it, else the cache), or a "
                  "URL or oci:// set already fetched (artifacts from the cache)")
      ->required();
  cmd->add_option("--cache", flags->cache,
                  "Cache to take artifacts from (default: $CUBIST_CACHE_DIR, "
                  "$XDG_CACHE_HOME/cubist, ~/.cache/cubist)")
      ->type_name("DIR");
  cmd->add_option("target", flags->target, "oci://HOST[:PORT]/REPO:TAG")->required();
  cmd->add_option("-j,--jobs", flags->jobs, "Blobs uploaded at once")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", flags->quiet, "Print only the digest");
  AddTrustFlags(cmd, &flags->trust, /*overrides=*/false);
  cmd->callback([flags, &g] { g.exit_code = RunPush(*flags); });
}

}  // namespace cubist::cli
