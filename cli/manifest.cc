// cubist manifest: the publisher's side.
//   cubist manifest build DIR [-o FILE] [--name N] [--version V] [--kernels FILE]
//       lists, hashes and sizes every file under DIR (manifest/manifest_builder.h) and
//       writes the manifest to FILE atomically, or to stdout. FILE under DIR is left out.
//   cubist manifest check FILE
//       parses and validates a manifest or checksums.txt and prints a one-line summary;
//       exit 8 (invalid input) with the error when it is not valid.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "manifest/checksums.h"
#include "manifest/manifest_builder.h"
#include "manifest/manifest_parser.h"
#include "manifest/manifest_writer.h"

namespace cubist::cli {
namespace {

namespace fs = std::filesystem;

struct BuildFlags {
  std::string dir;
  std::string output;
  std::string name;
  int64_t version = 1;
  std::string kernels;
  std::vector<std::string> exclude;
  int threads = 0;
};

struct CheckFlags {
  std::string file;
  bool json = false;
};

// "moe-gemm version 7: 12 artifacts, 123456 bytes, 40 kernels, digest 9f3e..."
std::string Summary(const Manifest& m, const std::string& digest) {
  uint64_t bytes = 0;
  size_t unsized = 0;
  for (const Artifact& a : m.artifacts) {
    if (a.size.has_value()) {
      bytes += *a.size;
    } else {
      ++unsized;
    }
  }
  std::string size_text = absl::StrCat(bytes, " bytes");
  if (unsized > 0) absl::StrAppend(&size_text, " (", unsized, " artifacts without a size)");
  return absl::StrCat(m.name, " version ", m.version, ": ", m.artifacts.size(), " artifacts, ",
                      size_text, ", ", m.kernels.size(), " kernels, digest ", digest);
}

// The path of `file` relative to `dir` when it lies inside it, else "".
std::string RelativeInside(const std::string& file, const std::string& dir) {
  std::error_code ec;
  const fs::path d = fs::weakly_canonical(dir, ec);
  if (ec) return "";
  const fs::path f = fs::weakly_canonical(file, ec);
  if (ec) return "";
  const std::string ds = d.string();
  const std::string fstr = f.string();
  const std::string prefix = ds == "/" ? ds : ds + "/";
  if (fstr.size() <= prefix.size() || fstr.compare(0, prefix.size(), prefix) != 0) return "";
  return fstr.substr(prefix.size());
}

int RunBuild(const BuildFlags& f) {
  ManifestBuildOptions options;
  options.name = f.name;
  if (options.name.empty()) {
    std::error_code ec;
    options.name = fs::weakly_canonical(f.dir, ec).filename().string();
  }
  if (absl::Status s = ValidateManifestName(options.name); !s.ok()) {
    return PrintError(absl::InvalidArgumentError(
        absl::StrCat("manifest build: name: ", s.message(),
                     "; give one with --name (the directory's name is the default)")));
  }
  options.version = f.version;
  options.kernels_file = f.kernels;
  options.exclude = f.exclude;
  options.threads = f.threads;
  if (!f.output.empty()) {
    // Never list the manifest in itself (a rebuild would otherwise hash the old one).
    if (std::string rel = RelativeInside(f.output, f.dir); !rel.empty()) {
      options.exclude.push_back(rel);
    }
  }
  absl::StatusOr<Manifest> m = BuildManifestFromDirectory(f.dir, options);
  if (!m.ok()) return PrintError(m.status());
  const std::string text = WriteManifest(*m);
  if (f.output.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (std::fflush(stdout) != 0) {
      return PrintError(absl::InternalError("manifest build: cannot write to stdout"));
    }
    return kExitOk;
  }
  if (absl::Status s = WriteFileAtomically(f.output, text, 0644); !s.ok()) {
    return PrintError(s);
  }
  std::printf("wrote %s: %s\n", f.output.c_str(), Summary(*m, Sha256Hex(text)).c_str());
  return kExitOk;
}

int RunCheck(const CheckFlags& f) {
  ManifestParseOptions options;
  absl::StatusOr<std::string> bytes = ReadFileToString(f.file, options.max_bytes);
  if (!bytes.ok()) return PrintError(bytes.status());
  absl::StatusOr<Manifest> m = ParseManifestOrChecksums(*bytes, f.file, options);
  if (!m.ok()) {
    // Whatever the parser's code, a file that does not parse is invalid input.
    return PrintError(absl::InvalidArgumentError(m.status().message()));
  }
  if (f.json) {
    uint64_t total = 0;
    for (const Artifact& a : m->artifacts) total += a.size.value_or(0);
    nlohmann::json j = {{"file", f.file},           {"name", m->name},
                        {"version", m->version},    {"artifacts", m->artifacts.size()},
                        {"bytes", total},           {"kernels", m->kernels.size()},
                        {"digest", m->digest}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%s: %s\n", f.file.c_str(), Summary(*m, m->digest).c_str());
  }
  return kExitOk;
}

}  // namespace

void RegisterManifest(CLI::App& app, Globals& g) {
  CLI::App* sub = app.add_subcommand(
      "manifest", "Build a manifest from a directory of artifacts, or check one");
  sub->require_subcommand(1);

  auto build = std::make_shared<BuildFlags>();
  CLI::App* b = sub->add_subcommand(
      "build", "List, hash and size every file under DIR and write the manifest");
  b->add_option("DIR", build->dir, "Directory that holds the artifacts")->required();
  b->add_option("-o,--output", build->output,
                "Write the manifest here (atomically) instead of stdout");
  b->add_option("--name", build->name,
                "Manifest name, [A-Za-z0-9._-]{1,128} (default: the directory's name)");
  b->add_option("--version", build->version, "Manifest version, an integer >= 1 (default 1)");
  b->add_option("--kernels", build->kernels,
                "JSON file with kernel metadata: an array of kernel objects or "
                "{\"kernels\": [...]}");
  b->add_option("--exclude", build->exclude,
                "Path under DIR to leave out (repeatable; a directory leaves out its files)");
  b->add_option("--threads", build->threads, "Hashing threads (default: one per core)");
  b->callback([build, &g] { g.exit_code = RunBuild(*build); });

  auto check = std::make_shared<CheckFlags>();
  CLI::App* c = sub->add_subcommand(
      "check", "Parse and validate a manifest (or checksums.txt) and summarise it");
  c->add_option("FILE", check->file, "Manifest file")->required();
  c->add_flag("--json", check->json, "Print the summary as JSON");
  c->callback([check, &g] { g.exit_code = RunCheck(*check); });
}

}  // namespace cubist::cli
