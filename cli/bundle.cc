// cubist bundle: artifact sets in one tar file, for nodes without network access
// (artifacts/bundle.h).
//   cubist bundle create --manifest M... -o F.tar [--cache DIR] [--offline]
//   cubist bundle import F.tar [--cache DIR] [-o MANIFESTS_DIR] [--trusted-key K]...
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "artifacts/bundle.h"
#include "cli/command.h"
#include "cli/common.h"
#include "cli/exit_codes.h"
#include "cli/trust_flags.h"
#include "manifest/trust.h"

namespace cubist::cli {
namespace {

struct CreateFlags {
  std::vector<std::string> manifests;
  std::string output;
  std::string cache;
  bool offline = false;
  report::TrustSpec trust;
};

struct ImportFlags {
  std::string bundle;
  std::string cache;
  std::string manifests_dir;
  report::TrustSpec trust;
};

int RunCreate(const CreateFlags& f) {
  auto store = report::OpenStore(f.cache, /*create=*/false);
  if (!store.ok()) return PrintError(store.status());
  std::vector<BundleInput> inputs;
  for (const std::string& location : f.manifests) {
    auto opened = report::OpenManifestForRequest(location, f.trust, &*store, f.offline,
                                                 /*record_version=*/false);
    if (!opened.ok()) return PrintError(opened.status());
    BundleInput in{std::move(opened->manifest), std::move(opened->bytes), std::nullopt};
    // The signature travels with the manifest, so the node can check it.
    auto sig = ReadLocation(SignatureLocation(location), 64 << 10, absl::Seconds(30), 2);
    if (sig.ok()) {
      in.signature = *std::move(sig);
    } else if (sig.status().code() != absl::StatusCode::kNotFound) {
      return PrintError(Annotate(sig.status(), "bundle create: the manifest's signature"));
    }
    inputs.push_back(std::move(in));
  }
  absl::StatusOr<BundleReport> r = CreateBundle(*store, inputs, f.output);
  if (!r.ok()) return PrintError(r.status());
  std::printf("wrote %s: %zu manifest%s, %llu objects, %s\n", f.output.c_str(),
              r->manifests.size(), r->manifests.size() == 1 ? "" : "s",
              static_cast<unsigned long long>(r->objects), HumanBytes(r->bytes).c_str());
  return kExitOk;
}

int RunImport(const ImportFlags& f) {
  auto store = report::OpenStore(f.cache, /*create=*/true);
  if (!store.ok()) return PrintError(store.status());
  ImportBundleOptions options;
  auto policy = f.trust.Policy();
  if (!policy.ok()) return PrintError(policy.status());
  options.trust = *std::move(policy);
  options.manifests_dir = f.manifests_dir;
  absl::StatusOr<BundleReport> r = ImportBundle(*store, f.bundle, options);
  if (!r.ok()) return PrintError(r.status());
  std::printf("imported %s into %s: %s; %llu objects added (%s), %llu already cached\n",
              f.bundle.c_str(), store->root().c_str(), absl::StrJoin(r->manifests, ", ").c_str(),
              static_cast<unsigned long long>(r->objects), HumanBytes(r->bytes).c_str(),
              static_cast<unsigned long long>(r->objects_already_cached));
  return kExitOk;
}

}  // namespace

void RegisterBundle(CLI::App& app, Globals& g) {
  CLI::App* sub = app.add_subcommand(
      "bundle", "Carry artifact sets to nodes without network access in one tar file");
  sub->require_subcommand(1);

  auto c = std::make_shared<CreateFlags>();
  CLI::App* create = sub->add_subcommand(
      "create", "Write the manifests, their signatures and every object they name to a tar");
  create->add_option("--manifest", c->manifests, "Manifest URL or path (repeatable)")
      ->required()
      ->type_name("URL|PATH");
  create->add_option("-o,--output", c->output, "The bundle to write (atomically)")->required();
  create->add_option("--cache", c->cache, "Cache directory")->type_name("DIR");
  create->add_flag("--offline", c->offline, "Read URL manifests from the cache's copies");
  AddTrustFlags(create, &c->trust);
  create->callback([c, &g] { g.exit_code = RunCreate(*c); });

  auto i = std::make_shared<ImportFlags>();
  CLI::App* imp = sub->add_subcommand(
      "import", "Verify a bundle and add its objects and manifests to the cache");
  imp->add_option("BUNDLE", i->bundle, "The bundle (a tar from `cubist bundle create`)")
      ->required();
  imp->add_option("--cache", i->cache, "Cache directory")->type_name("DIR");
  imp->add_option("-o,--manifests-dir", i->manifests_dir,
                  "Also write the manifests (and signatures) into this directory")
      ->type_name("DIR");
  AddTrustFlags(imp, &i->trust);
  imp->callback([i, &g] { g.exit_code = RunImport(*i); });
}

}  // namespace cubist::cli
