#include "manifest/manifest_builder.h"

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/unique_fd.h"
#include "manifest/manifest_parser.h"
#include "manifest/message_text.h"
#include "manifest/path_rules.h"

namespace cubist {
namespace {

namespace fs = std::filesystem;

struct FoundFile {
  std::string rel;  // artifact path
  std::string abs;  // what to open
};

absl::Status FsError(const std::error_code& ec, const std::string& path, std::string_view what) {
  return ErrnoToStatus(ec.value(), absl::StrCat(path, ": ", absl::string_view(what.data(), what.size())));
}

class Walker {
 public:
  Walker(std::string root_display, std::string root_canonical,
         absl::flat_hash_set<std::string> exclude)
      : display_(std::move(root_display)),
        root_(std::move(root_canonical)),
        root_prefix_(root_ == "/" ? "/" : root_ + "/"),
        exclude_(std::move(exclude)) {}

  // Lists `abs_dir` (canonical path `canonical`), whose artifact path prefix is `rel`.
  absl::Status Walk(const std::string& abs_dir, const std::string& canonical,
                    const std::string& rel) {
    ancestors_.push_back(canonical);
    std::error_code ec;
    fs::directory_iterator it(abs_dir, ec);
    if (ec) return FsError(ec, abs_dir, "cannot list directory");
    // Sorted later; gather names first so that the iterator is not held open while
    // recursing (file descriptors are finite on deep trees).
    std::vector<std::string> names;
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) return FsError(ec, abs_dir, "cannot list directory");
      names.push_back(it->path().filename().string());
    }
    if (ec) return FsError(ec, abs_dir, "cannot list directory");
    for (const std::string& name : names) {
      const std::string child_rel = rel.empty() ? name : rel + "/" + name;
      const std::string child_abs = abs_dir + "/" + name;
      if (exclude_.contains(child_rel)) continue;
      if (child_rel.size() > kMaxArtifactPathBytes) {
        return Annotate(ValidateArtifactPath(child_rel), display_);
      }
      const fs::file_status st = fs::symlink_status(child_abs, ec);
      if (ec) return FsError(ec, child_abs, "cannot stat");
      if (fs::is_symlink(st)) {
        CUBIST_RETURN_IF_ERROR(FollowLink(child_abs, child_rel));
      } else if (fs::is_directory(st)) {
        CUBIST_RETURN_IF_ERROR(Walk(child_abs, canonical + "/" + name, child_rel));
      } else if (fs::is_regular_file(st)) {
        CUBIST_RETURN_IF_ERROR(AddFile(child_abs, child_rel));
      }
    }
    ancestors_.pop_back();
    return absl::OkStatus();
  }

  std::vector<FoundFile> TakeFiles() { return std::move(files_); }

 private:
  absl::Status AddFile(const std::string& abs, const std::string& rel) {
    if (absl::Status s = ValidateArtifactPath(rel); !s.ok()) {
      return Annotate(s, absl::StrCat(display_, ": cannot publish this file"));
    }
    files_.push_back({rel, abs});
    return absl::OkStatus();
  }

  absl::Status FollowLink(const std::string& abs, const std::string& rel) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(abs, ec);
    const std::string target_text = ec ? std::string("?") : target.string();
    const fs::path resolved = fs::canonical(abs, ec);
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat(
          abs, ": symbolic link to ", QuoteForMessage(target_text),
          " cannot be resolved (", ec.message(), "); fix or remove the link"));
    }
    const std::string real = resolved.string();
    if (real != root_ && real.compare(0, root_prefix_.size(), root_prefix_) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          abs, ": symbolic link points outside ", display_, " (to ", real,
          "); copy the file into the directory or remove the link"));
    }
    const fs::file_status st = fs::status(resolved, ec);
    if (ec) return FsError(ec, abs, "cannot stat link target");
    if (fs::is_directory(st)) {
      if (std::find(ancestors_.begin(), ancestors_.end(), real) != ancestors_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            abs, ": symbolic link to an enclosing directory (", real,
            ") would list files forever; remove the link"));
      }
      return Walk(abs, real, rel);
    }
    if (fs::is_regular_file(st)) return AddFile(abs, rel);
    return absl::OkStatus();
  }

  const std::string display_;
  const std::string root_;
  const std::string root_prefix_;
  const absl::flat_hash_set<std::string> exclude_;
  std::vector<std::string> ancestors_;  // canonical paths of the directories being listed
  std::vector<FoundFile> files_;
};

std::string NormaliseExclude(std::string_view p) {
  while (p.substr(0, 2) == "./") p.remove_prefix(2);
  while (!p.empty() && p.back() == '/') p.remove_suffix(1);
  return std::string(p);
}

// Hashes every file on `threads` threads. Returns the first error in path order, so that
// the message does not depend on scheduling.
absl::Status HashAll(const std::vector<FoundFile>& files, int threads,
                     std::vector<Artifact>* out) {
  out->assign(files.size(), Artifact{});
  std::vector<absl::Status> errors(files.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < files.size(); i = next.fetch_add(1)) {
      uint64_t size = 0;
      absl::StatusOr<std::string> hex = Sha256File(files[i].abs, &size);
      if (!hex.ok()) {
        errors[i] = hex.status();
        continue;
      }
      Artifact& a = (*out)[i];
      a.path = files[i].rel;
      a.sha256 = *std::move(hex);
      a.size = size;
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (absl::Status& s : errors) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Manifest> BuildManifestFromDirectory(const std::string& dir,
                                                    const ManifestBuildOptions& options) {
  if (absl::Status s = ValidateManifestName(options.name); !s.ok()) {
    return Annotate(s, "manifest name");
  }
  if (options.version < 1 || options.version > kMaxManifestInteger) {
    return absl::InvalidArgumentError(absl::StrCat(
        "manifest version: expected an integer from 1 to ", kMaxManifestInteger, ", got ",
        options.version));
  }
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec) return FsError(ec, dir, "cannot open directory");
  if (!fs::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, ": not a directory; give the folder that holds the artifacts"));
  }
  const fs::path root = fs::canonical(dir, ec);
  if (ec) return FsError(ec, dir, "cannot resolve directory");

  absl::flat_hash_set<std::string> exclude;
  for (const std::string& e : options.exclude) exclude.insert(NormaliseExclude(e));
  std::string display = dir;
  while (display.size() > 1 && display.back() == '/') display.pop_back();
  Walker walker(display, root.string(), std::move(exclude));
  CUBIST_RETURN_IF_ERROR(walker.Walk(display, root.string(), ""));
  std::vector<FoundFile> files = walker.TakeFiles();
  std::sort(files.begin(), files.end(),
            [](const FoundFile& a, const FoundFile& b) { return a.rel < b.rel; });

  Manifest m;
  m.name = options.name;
  m.version = options.version;
  m.source = dir;
  int threads = options.threads > 0
                    ? options.threads
                    : std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
  threads = std::max(1, std::min<int>(threads, static_cast<int>(files.size())));
  CUBIST_RETURN_IF_ERROR(HashAll(files, threads, &m.artifacts));

  if (!options.kernels_file.empty()) {
    ManifestParseOptions parse_options;
    CUBIST_ASSIGN_OR_RETURN(std::string bytes,
                            ReadFileToString(options.kernels_file, parse_options.max_bytes));
    CUBIST_ASSIGN_OR_RETURN(m.kernels,
                            ParseKernelList(bytes, options.kernels_file, parse_options));
    absl::flat_hash_set<std::string_view> paths;
    for (const Artifact& a : m.artifacts) paths.insert(a.path);
    for (const KernelSpec& k : m.kernels) {
      if (!paths.contains(k.artifact)) {
        return absl::InvalidArgumentError(absl::StrCat(
            options.kernels_file, ": kernel ", QuoteForMessage(k.name), ": artifact ",
            QuoteForMessage(k.artifact), " is not a file under ", display,
            "; fix the kernel's \"artifact\" or add the file"));
      }
    }
  }
  return m;
}

}  // namespace cubist
