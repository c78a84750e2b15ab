// cubist manifest: the publisher's side.
//   cubist manifest build DIR [-o FILE] [--name N] [--version V] [--kernels FILE]
//       lists, hashes and sizes every file under DIR (manifest/manifest_builder.h) and
//       writes the manifest to FILE atomically, or to stdout. FILE under DIR is left out.
//   cubist manifest import flashinfer DIR|URL [-o FILE] [--name N] [--version V]
//       reads a FlashInfer trtllm-gen pin (checksums.txt + include/flashinferMetaInfo.h)
//       and writes a manifest whose kernels carry the header's metadata (op trtllm_bmm),
//       the header's hashes checked against checksums.txt (manifest/flashinfer_import.h).
//   cubist manifest check FILE
//       parses and validates a manifest or checksums.txt and prints a one-line summary;
//       exit 8 (invalid input) with the error when it is not valid.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "artifacts/cache_dir.h"
#include "artifacts/manifest_source.h"
#include "artifacts/store.h"
#include "artifacts/sources.h"
#include "dispatch/registry.h"
#include "manifest/checksums.h"
#include "manifest/flashinfer_import.h"
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

struct ImportFlags {
  std::string kind;
  std::string location;
  std::string output;
  std::string name;
  int64_t version = 1;
  std::vector<std::string> base_urls;
  std::string cache;
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

// The manifest's text to `output` atomically, or to stdout when it is "".
absl::Status WriteOutput(const std::string& text, const std::string& output,
                         const char* command) {
  if (!output.empty()) return WriteFileAtomically(output, text, 0644);
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (std::fflush(stdout) != 0) {
    return absl::InternalError(absl::StrCat(command, ": cannot write to stdout"));
  }
  return absl::OkStatus();
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
  if (absl::Status s = WriteOutput(text, f.output, "manifest build"); !s.ok()) {
    return PrintError(s);
  }
  if (f.output.empty()) return kExitOk;
  std::printf("wrote %s: %s\n", f.output.c_str(), Summary(*m, Sha256Hex(text)).c_str());
  return kExitOk;
}

// The pin directory of an import location: the location itself, or its directory when
// it names the checksums.txt.
std::string PinDirectory(std::string location) {
  while (location.size() > 1 && location.back() == '/') location.pop_back();
  const size_t slash = location.rfind('/');
  const std::string_view last =
      slash == std::string::npos ? std::string_view(location)
                                 : std::string_view(location).substr(slash + 1);
  if (last == "checksums.txt") return slash == std::string::npos ? "." : location.substr(0, slash);
  return location;
}

// Reads of the pin's files: a slow mirror gets a minute and four attempts per file.
constexpr absl::Duration kPinReadTimeout = absl::Seconds(60);
constexpr int kPinReadAttempts = 4;

// The pin's checksums.txt: its bytes, as read, and what it lists.
struct PinChecksums {
  std::string location;
  std::string bytes;
  Manifest manifest;
};

absl::StatusOr<PinChecksums> ReadPinChecksums(const std::string& dir, const std::string& name) {
  PinChecksums out;
  out.location = dir + "/checksums.txt";
  ManifestParseOptions parse;
  absl::StatusOr<std::string> sums =
      ReadLocation(out.location, parse.max_bytes, kPinReadTimeout, kPinReadAttempts);
  if (!sums.ok()) return Annotate(sums.status(), "manifest import");
  out.bytes = *std::move(sums);
  // A pin directory's own name ("batched_gemm-91e0ba0-896b90b") is the default name.
  parse.checksums_name = name;
  CUBIST_ASSIGN_OR_RETURN(out.manifest, ParseChecksums(out.bytes, out.location, parse));
  return out;
}

// The pin's kernel list (flashinferMetaInfo.h): its text, where it was read and its
// path inside the pin.
struct PinKernelList {
  std::string text;
  std::string location;
  std::string path;
};

// The kernel list under the name checksums.txt lists, else under each known name.
absl::StatusOr<PinKernelList> ReadPinKernelList(const std::string& dir,
                                                const Manifest& checksums) {
  constexpr uint64_t kMaxHeaderBytes = uint64_t{128} << 20;
  std::vector<std::string> header_paths;
  for (const char* path : kFlashinferMetaInfoPaths) {
    if (checksums.FindArtifact(path) != nullptr) header_paths.push_back(path);
  }
  if (header_paths.empty()) header_paths.assign(std::begin(kFlashinferMetaInfoPaths),
                                                std::end(kFlashinferMetaInfoPaths));
  absl::StatusOr<std::string> header = absl::NotFoundError("");
  PinKernelList out;
  for (const std::string& path : header_paths) {
    out.path = path;
    out.location = absl::StrCat(dir, "/", path);
    header = ReadLocation(out.location, kMaxHeaderBytes, kPinReadTimeout, kPinReadAttempts);
    if (header.status().code() != absl::StatusCode::kNotFound) break;
  }
  if (header.status().code() == absl::StatusCode::kNotFound) {
    return absl::NotFoundError(absl::StrCat(
        "manifest import: the pin's kernel list: ", dir, " has neither ",
        kFlashinferMetaInfoPath, " nor ", kFlashinferFmhaMetaInfoPath,
        " (only trtllm-gen pins, such as batched_gemm-* and the attention pin, have one); "
        "is this a FlashInfer cubin pin directory?"));
  }
  if (!header.ok()) return Annotate(header.status(), "manifest import: the pin's kernel list");
  out.text = *std::move(header);
  return out;
}

// A JSON manifest states every size. A local pin has them on disk; for a URL pin they
// come from the cache, where `cubist fetch` of its checksums.txt put the files.
absl::Status FillArtifactSizes(const std::string& dir, const std::optional<Store>& store,
                               const std::string& checksums_location, Manifest* m) {
  size_t unsized = 0;
  const Artifact* first_unsized = nullptr;
  for (Artifact& a : m->artifacts) {
    if (a.size.has_value()) continue;
    if (!IsUrl(dir)) {
      std::error_code ec;
      const uintmax_t size = fs::file_size(fs::path(dir) / a.path, ec);
      if (!ec) a.size = size;
    }
    uint64_t cached = 0;
    if (!a.size.has_value() && store.has_value() &&
        store->Probe(a.sha256, std::nullopt, &cached) == ObjectState::kPresent) {
      a.size = cached;
    }
    if (!a.size.has_value() && ++unsized == 1) first_unsized = &a;
  }
  if (unsized == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "manifest import: ", unsized, " of ", m->artifacts.size(),
      " artifacts have no known size (first: ", first_unsized->path,
      "); a manifest states every size, and they come from the pin's "
      "directory or the cache: run `cubist fetch --manifest ", checksums_location,
      "` first, then import again"));
}

// The pin's checksums.txt is one of its own artifacts (FLASHINFER_CUBIN_DIR needs it),
// but a fetch of the pin by that file downloads only what it lists: keep the bytes read
// here, so that the imported manifest fetches offline and exports from the cache.
void KeepChecksumsInCache(std::optional<Store>& store, const std::string& sha256,
                          const std::string& bytes) {
  if (!store.has_value() || sha256.empty()) return;
  if (absl::Status s = store->PutBytes(sha256, bytes); !s.ok()) {
    std::fprintf(stderr,
                 "cubist: warning: manifest import: %s not kept in the cache (%s); "
                 "`cubist fetch` of the manifest will download it\n",
                 kFlashinferChecksumsPath, std::string(s.message()).c_str());
  }
}

// "sm_100a 12, sm_100f 40": the kernels per arch.
std::string KernelsPerArch(const Manifest& m) {
  std::map<std::string, int> archs;
  for (const KernelSpec& k : m.kernels) ++archs[k.arch];
  std::string text;
  for (const auto& [arch, n] : archs) {
    absl::StrAppend(&text, text.empty() ? "" : ", ", arch, " ", n);
  }
  return text;
}

int RunImport(const ImportFlags& f) {
  if (f.kind != "flashinfer") {
    return PrintError(absl::InvalidArgumentError(absl::StrCat(
        "manifest import: unknown kind '", f.kind, "'; the only kind is flashinfer")));
  }
  const std::string dir = PinDirectory(f.location);
  absl::StatusOr<PinChecksums> sums = ReadPinChecksums(dir, f.name);
  if (!sums.ok()) return PrintError(sums.status());
  absl::StatusOr<PinKernelList> header = ReadPinKernelList(dir, sums->manifest);
  if (!header.ok()) return PrintError(header.status());

  FlashinferImportOptions options;
  options.version = f.version;
  options.pin = FlashinferPinFromLocation(sums->location);
  options.header_path = header->path;
  options.base_urls = f.base_urls;
  if (options.base_urls.empty() && (IsUrl(dir) || !f.output.empty())) {
    // The manifest may be written anywhere; its artifacts stay where the pin is.
    options.base_urls.push_back(NormalizeBase(dir));
  }
  absl::StatusOr<Manifest> m =
      ImportFlashinferPin(sums->manifest, header->text, header->location, options);
  if (!m.ok()) return PrintError(m.status());
  std::string checksums_sha256;  // the pin's checksums.txt, one of its own artifacts
  for (Artifact& a : m->artifacts) {
    if (a.path != kFlashinferChecksumsPath) continue;
    a.size = sums->bytes.size();
    checksums_sha256 = a.sha256;
  }
  std::optional<Store> store;
  if (auto root = ResolveCacheDir(f.cache); root.ok()) {
    if (auto s = Store::Open(*root, /*create=*/false); s.ok()) store.emplace(*std::move(s));
  }
  if (absl::Status s = FillArtifactSizes(dir, store, sums->location, &*m); !s.ok()) {
    return PrintError(s);
  }
  KeepChecksumsInCache(store, checksums_sha256, sums->bytes);
  // What select will do with it: refuse here rather than there.
  absl::StatusOr<Registry> registry = Registry::Create(*m);
  if (!registry.ok()) return PrintError(registry.status());
  const std::string text = WriteManifest(*m);
  if (absl::Status s = WriteOutput(text, f.output, "manifest import"); !s.ok()) {
    return PrintError(s);
  }
  if (f.output.empty()) return kExitOk;
  std::printf("wrote %s: %s (%s: %s)\n", f.output.c_str(), Summary(*m, Sha256Hex(text)).c_str(),
              kTrtllmBmmOp, KernelsPerArch(*m).c_str());
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

  auto imp = std::make_shared<ImportFlags>();
  CLI::App* i = sub->add_subcommand(
      "import", "Write a manifest with kernel metadata for another project's artifact set");
  i->add_option("KIND", imp->kind, "Kind of set: flashinfer (a trtllm-gen cubin pin)")
      ->required();
  i->add_option("LOCATION", imp->location,
                "The pin: a directory or URL holding checksums.txt and "
                "include/flashinferMetaInfo.h (the attention pin: flashInferMetaInfo.h), or "
                "the checksums.txt itself")
      ->required();
  i->add_option("-o,--output", imp->output, "Write the manifest here (atomically) instead of stdout");
  i->add_option("--name", imp->name, "Manifest name (default: the pin directory's name)");
  i->add_option("--version", imp->version, "Manifest version, an integer >= 1 (default 1)");
  i->add_option("--base-url", imp->base_urls,
                "Where the artifacts are served (repeatable; default: the pin's location "
                "when it is a URL or when -o is given)");
  i->add_option("--cache", imp->cache,
                "Cache to read sizes from for a URL pin (after `cubist fetch` of its "
                "checksums.txt)")
      ->type_name("DIR");
  i->callback([imp, &g] { g.exit_code = RunImport(*imp); });

  auto check = std::make_shared<CheckFlags>();
  CLI::App* c = sub->add_subcommand(
      "check", "Parse and validate a manifest (or checksums.txt) and summarise it");
  c->add_option("FILE", check->file, "Manifest file")->required();
  c->add_flag("--json", check->json, "Print the summary as JSON");
  c->callback([check, &g] { g.exit_code = RunCheck(*check); });
}

}  // namespace cubist::cli
