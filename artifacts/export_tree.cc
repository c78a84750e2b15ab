#include "artifacts/export_tree.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "manifest/path_rules.h"

namespace cubist {
namespace {

namespace fs = std::filesystem;

// Removes the temporary tree unless the export succeeded.
class TempTree {
 public:
  explicit TempTree(std::string path) : path_(std::move(path)) {}
  ~TempTree() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  TempTree(const TempTree&) = delete;
  TempTree& operator=(const TempTree&) = delete;
  const std::string& path() const { return path_; }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

// mkdir for each component of `subdir` under `dir`, refusing a component that exists as
// anything but a real directory (a planted symlink would send the tree elsewhere).
absl::Status MakeRealDirs(const std::string& dir, std::string_view subdir) {
  std::string path = dir;
  std::vector<std::string_view> parts;
  for (size_t start = 0; start < subdir.size();) {
    size_t slash = subdir.find('/', start);
    if (slash == std::string_view::npos) slash = subdir.size();
    parts.push_back(subdir.substr(start, slash - start));
    start = slash + 1;
  }
  for (std::string_view part : parts) {
    absl::StrAppend(&path, "/", Sv(part));
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, absl::StrCat("export: create ", path));
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("export: stat ", path));
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "export: ", path, " is ", S_ISLNK(st.st_mode) ? "a symlink" : "not a directory",
          "; refusing to write through it: remove it or export elsewhere"));
    }
  }
  return absl::OkStatus();
}

// Copies `from` to `to` (created exclusively, 0444), hashing the bytes written.
absl::Status CopyVerified(const std::string& from, const std::string& to, const Artifact& a) {
  UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!in.valid()) return ErrnoToStatus(errno, absl::StrCat("export: open ", from));
  UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444));
  if (!out.valid()) return ErrnoToStatus(errno, absl::StrCat("export: create ", to));
  Sha256 hasher;
  std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  for (;;) {
    ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("export: read ", from));
    if (n == 0) break;
    hasher.Update(buf.data(), static_cast<size_t>(n));
    total += static_cast<uint64_t>(n);
    for (ssize_t done = 0; done < n;) {
      ssize_t w = ::write(out.get(), buf.data() + done, static_cast<size_t>(n - done));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoToStatus(errno, absl::StrCat("export: write ", to));
      done += w;
    }
  }
  const std::string actual = ToHex(hasher.Finish());
  if (actual != a.sha256 || (a.size.has_value() && *a.size != total)) {
    return absl::DataLossError(absl::StrCat(
        "export ", a.path, ": cache object ", from, " has sha256 ", actual, " (", total,
        " bytes), expected ", a.sha256, "; run `cubist verify --deep` to remove it and "
        "`cubist fetch` to repair"));
  }
  return absl::OkStatus();
}

absl::Status CheckHash(const std::string& path, const Artifact& a) {
  CUBIST_ASSIGN_OR_RETURN(std::string actual, Sha256File(path));
  if (actual != a.sha256) {
    return absl::DataLossError(absl::StrCat(
        "export ", a.path, ": cache object has sha256 ", actual, ", expected ", a.sha256,
        "; run `cubist verify --deep` to remove it and `cubist fetch` to repair"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExportReport> ExportTree(const Store& store, const Manifest& manifest,
                                        const std::string& dir, const ExportOptions& options) {
  if (!options.subdir.empty()) {
    if (absl::Status s = ValidateArtifactPath(options.subdir); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("export: directory under ", dir, ": ",
                                                     s.message()));
    }
  }
  // Everything must be in the cache before anything is written.
  size_t missing = 0;
  const Artifact* first_missing = nullptr;
  for (const Artifact& a : manifest.artifacts) {
    if (store.Probe(a.sha256, a.size) != ObjectState::kPresent) {
      if (++missing == 1) first_missing = &a;
    }
  }
  if (missing > 0) {
    return absl::NotFoundError(absl::StrCat(
        "export: ", missing, " of ", manifest.artifacts.size(), " artifacts of ",
        manifest.source.empty() ? manifest.name : manifest.source,
        " are not in the cache at ", store.root(), " (first: ", first_missing->path,
        "); run `cubist fetch` with the same manifest and cache first"));
  }

  std::string top = dir;
  while (top.size() > 1 && top.back() == '/') top.pop_back();
  ExportReport report;
  if (options.subdir.empty()) {
    report.root = top;
    CUBIST_RETURN_IF_ERROR(MakeDirs(DirName(top)));
  } else {
    report.root = absl::StrCat(top, "/", options.subdir);
    CUBIST_RETURN_IF_ERROR(MakeDirs(top));
    const std::string parent_rel = DirName(options.subdir);
    CUBIST_RETURN_IF_ERROR(MakeRealDirs(top, parent_rel == "." ? "" : parent_rel));
  }
  const std::string parent = DirName(report.root);
  const std::string base = fs::path(report.root).filename().string();

  std::string templ = absl::StrCat(parent, "/.", base, ".cubist-export-XXXXXX");
  if (::mkdtemp(templ.data()) == nullptr) {
    return ErrnoToStatus(errno, absl::StrCat("export: create a temporary directory in ", parent));
  }
  TempTree temp(templ);
  ::chmod(temp.path().c_str(), 0755);

  for (const Artifact& a : manifest.artifacts) {
    const std::string object = store.ObjectPath(a.sha256);
    const std::string to = absl::StrCat(temp.path(), "/", a.path);
    CUBIST_RETURN_IF_ERROR(MakeRealDirs(temp.path(), DirName(a.path) == "." ? "" : DirName(a.path)));
    bool linked = false;
    if (!options.copy_only) {
      if (::link(object.c_str(), to.c_str()) == 0) {
        linked = true;
      } else if (errno != EXDEV && errno != EPERM && errno != EMLINK && errno != ENOTSUP) {
        return ErrnoToStatus(errno, absl::StrCat("export: link ", object, " to ", to));
      }
    }
    if (linked) {
      if (options.deep) CUBIST_RETURN_IF_ERROR(CheckHash(to, a));
      ++report.linked;
    } else {
      CUBIST_RETURN_IF_ERROR(CopyVerified(object, to, a));
      ++report.copied;
    }
    uint64_t size = 0;
    store.Probe(a.sha256, std::nullopt, &size);
    report.bytes += size;
  }

  for (const auto& [path, bytes] : options.extra_files) {
    if (absl::Status s = ValidateArtifactPath(path); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("export: extra file: ", s.message()));
    }
    if (manifest.FindArtifact(path) != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("export: extra file ", path, " is also an artifact"));
    }
    CUBIST_RETURN_IF_ERROR(MakeRealDirs(temp.path(), DirName(path) == "." ? "" : DirName(path)));
    const std::string to = absl::StrCat(temp.path(), "/", path);
    UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444));
    if (!out.valid()) return ErrnoToStatus(errno, absl::StrCat("export: create ", to));
    for (size_t done = 0; done < bytes.size();) {
      ssize_t w = ::write(out.get(), bytes.data() + done, bytes.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return ErrnoToStatus(errno, absl::StrCat("export: write ", to));
      done += static_cast<size_t>(w);
    }
    report.bytes += bytes.size();
  }

  // Data first, then the rename: syncfs flushes the whole tree in one call.
  {
    UniqueFd fd(::open(temp.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid() || ::syncfs(fd.get()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("export: flush ", temp.path()));
    }
  }
  struct stat st;
  if (::lstat(report.root.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "export: ", report.root, " exists and is ",
          S_ISLNK(st.st_mode) ? "a symlink" : "not a directory",
          "; refusing to replace it: remove it or export elsewhere"));
    }
    if (::renameat2(AT_FDCWD, temp.path().c_str(), AT_FDCWD, report.root.c_str(),
                    RENAME_EXCHANGE) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("export: swap ", temp.path(), " and ",
                                               report.root));
    }
    report.replaced = true;  // the old tree now sits at temp.path(); ~TempTree removes it
  } else {
    if (::rename(temp.path().c_str(), report.root.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("export: rename ", temp.path(), " to ",
                                               report.root));
    }
    temp.Release();
  }
  CUBIST_RETURN_IF_ERROR(SyncDir(parent));
  return report;
}

}  // namespace cubist
