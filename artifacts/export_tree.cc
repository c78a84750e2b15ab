#include "artifacts/export_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "artifacts/staging.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "manifest/path_rules.h"

namespace cubist {
namespace {

namespace fs = std::filesystem;

// The temporary tree of an export in progress, flock()ed by its process for as long as
// the process lives (a flock, not a pid: containers sharing a directory see different
// pids), so that a later export can tell a killed export's leftovers from a live one.
// Removes the tree unless the export succeeded.
class TempTree {
 public:
  TempTree(std::string path, UniqueFd lock) : lock_(std::move(lock)), remove_(std::move(path)) {}
  TempTree(TempTree&&) noexcept = default;
  const std::string& path() const { return remove_.path(); }
  void Release() { remove_.Release(); }

 private:
  UniqueFd lock_;
  RemoveOnExit remove_;  // declared after the lock: the tree goes before its lock
};

// True for the name of an export's temporary directory: ".<base>.cubist-export-XXXXXX".
bool IsExportTempName(std::string_view name) {
  return name.size() > 1 && name[0] == '.' && absl::StrContains(Sv(name), ".cubist-export-");
}

// Opens `path` (a directory, never followed through a link) and takes its flock without
// waiting; an invalid fd when it is not a directory or someone holds the lock.
UniqueFd TryLockDir(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.valid() && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) fd.Reset();
  return fd;
}

// Removes the temporary directories in `parent` of exports whose process died (killed
// mid-way: nothing else removes them). One whose flock is held is a live export's.
void ReapStaleTemps(const std::string& parent) {
  DIR* d = ::opendir(parent.c_str());
  if (d == nullptr) return;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (IsExportTempName(e->d_name)) names.emplace_back(e->d_name);
  }
  ::closedir(d);
  for (const std::string& name : names) {
    const std::string path = absl::StrCat(parent, "/", name);
    UniqueFd lock = TryLockDir(path);
    if (!lock.valid()) continue;
    std::error_code ec;
    fs::remove_all(path, ec);  // under its lock: its creator re-checks the path after locking
  }
}

// Creates and flock()s the temporary directory for `root`. The creator locks after
// mkdtemp, so a reaper may lock (and remove) it first: the path is checked to still be
// the locked directory, else another name is tried.
absl::StatusOr<TempTree> MakeLockedTemp(const std::string& parent, const std::string& base) {
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::string templ = absl::StrCat(parent, "/.", base, ".cubist-export-XXXXXX");
    if (::mkdtemp(templ.data()) == nullptr) {
      return ErrnoToStatus(errno,
                           absl::StrCat("export: create a temporary directory in ", parent));
    }
    UniqueFd lock = TryLockDir(templ);
    struct stat locked, at_path;
    if (lock.valid() && ::fstat(lock.get(), &locked) == 0 &&
        ::lstat(templ.c_str(), &at_path) == 0 && locked.st_ino == at_path.st_ino &&
        locked.st_dev == at_path.st_dev) {
      ::chmod(templ.c_str(), 0755);
      return TempTree(std::move(templ), std::move(lock));
    }
  }
  return absl::AbortedError(absl::StrCat(
      "export: temporary directories in ", parent, " kept being removed by another "
      "process; run the export again"));
}

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

// MakeRealDirs for the directory that holds `rel` (a relative path) under `dir`.
absl::Status MakeRealParentDirs(const std::string& dir, std::string_view rel) {
  const std::string parent = DirName(rel);
  return MakeRealDirs(dir, parent == "." ? "" : parent);
}

// Copies `from` to `to` (created exclusively, 0444), hashing the bytes written.
absl::Status CopyVerified(const std::string& from, const std::string& to, const Artifact& a) {
  UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!in.valid()) return ErrnoToStatus(errno, absl::StrCat("export: open ", from));
  UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444));
  if (!out.valid()) return ErrnoToStatus(errno, absl::StrCat("export: create ", to));
  std::vector<char> buf(1 << 20);
  CUBIST_ASSIGN_OR_RETURN(
      HashedCopy copy,
      CopyHashing(FdSource(in.get(), absl::StrCat("export: read ", from)), out.get(), buf,
                  "export: ", to));
  if (copy.sha256 != a.sha256 || (a.size.has_value() && *a.size != copy.bytes)) {
    return absl::DataLossError(absl::StrCat(
        "export ", a.path, ": cache object ", from, " has sha256 ", copy.sha256, " (",
        copy.bytes, " bytes), expected ", a.sha256, "; run `cubist verify --deep` to remove "
        "it and `cubist fetch` to repair"));
  }
  return absl::OkStatus();
}

// True when `path` is `dir` or below it (both canonical).
bool IsWithin(const fs::path& path, const fs::path& dir) {
  auto [d, p] = std::mismatch(dir.begin(), dir.end(), path.begin(), path.end());
  return d == dir.end();
}

// Refuses a target that would take the cache with it, or write into it.
absl::Status CheckOutsideCache(const Store& store, const std::string& root) {
  std::error_code ec;
  const fs::path cache = fs::weakly_canonical(store.root(), ec);
  if (ec) return absl::OkStatus();
  const fs::path target = fs::weakly_canonical(root, ec);
  if (ec) return absl::OkStatus();
  if (IsWithin(target, cache)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "export: ", root, " is inside the cache ", store.root(),
        "; refusing to write there (the cache holds only what cubist verified): export to a "
        "directory outside it"));
  }
  if (IsWithin(cache, target)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "export: ", root, " holds the cache ", store.root(),
        "; replacing it would delete the cache: export to another directory"));
  }
  return absl::OkStatus();
}

// The (device, inode) of every object the manifest names, to recognize hard links.
std::set<std::pair<dev_t, ino_t>> ObjectInodes(const Store& store, const Manifest& manifest) {
  std::set<std::pair<dev_t, ino_t>> out;
  for (const Artifact& a : manifest.artifacts) {
    struct stat st;
    if (::lstat(store.ObjectPath(a.sha256).c_str(), &st) == 0) out.emplace(st.st_dev, st.st_ino);
  }
  return out;
}

// True when the regular file `path` (stat `st`) is a hard link to a cache object:
// first among this manifest's objects, else by its hash (an older set's export).
bool IsLinkToObject(const Store& store, const std::string& path, const struct stat& st,
                    const std::set<std::pair<dev_t, ino_t>>& known) {
  if (st.st_nlink < 2) return false;
  if (known.count({st.st_dev, st.st_ino}) > 0) return true;
  auto hash = Sha256File(path);
  if (!hash.ok()) return false;
  struct stat object;
  return ::lstat(store.ObjectPath(*hash).c_str(), &object) == 0 &&
         object.st_dev == st.st_dev && object.st_ino == st.st_ino;
}

// Decides whether the directory at `root` may be replaced: absent, empty, made by an
// earlier export (its marker file), made by an export older than the marker (every file
// a hard link to a cache object), or `replace`. Never when another export lives inside it
// (`--pin a` after `--pin a/b/c`), or when a live export builds inside it.
absl::Status CheckReplaceable(const Store& store, const Manifest& manifest,
                              const std::string& root, const ExportOptions& options) {
  struct stat st;
  if (::lstat(root.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoToStatus(errno, absl::StrCat("export: stat ", root));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "export: ", root, " exists and is ", S_ISLNK(st.st_mode) ? "a symlink" : "not a directory",
        "; refusing to replace it: remove it or export elsewhere"));
  }
  const bool marked = ::lstat(absl::StrCat(root, "/", kExportMarker).c_str(), &st) == 0 &&
                      S_ISREG(st.st_mode);
  std::set<std::pair<dev_t, ino_t>> known;
  std::string foreign;  // the first file that no export made
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string path = it->path().string();
    const std::string name = it->path().filename().string();
    if (it.depth() > 0 && name == kExportMarker) {
      return absl::FailedPreconditionError(absl::StrCat(
          "export: replacing ", root, " would delete the export at ", DirName(path),
          " inside it; refusing: remove that export by hand first, or export elsewhere"));
    }
    if (IsExportTempName(name) && it->is_directory()) {
      if (!TryLockDir(path).valid()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "export: another export is writing ", path, " inside ", root,
            "; refusing to replace it now: try again when it has finished"));
      }
      it.disable_recursion_pending();
      continue;
    }
    if (marked || options.replace || !foreign.empty()) continue;
    if (::lstat(path.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) continue;
    const std::string rel = path.substr(root.size() + 1);
    bool ours = false;
    if (S_ISREG(st.st_mode)) {
      if (known.empty()) known = ObjectInodes(store, manifest);
      ours = IsLinkToObject(store, path, st, known);
      for (const auto& [extra, bytes] : options.extra_files) {
        if (!ours && extra == rel) {
          auto held = ReadFileToString(path, bytes.size());
          ours = held.ok() && *held == bytes;
        }
      }
    }
    if (!ours) foreign = rel;
  }
  if (ec) return ErrnoToStatus(ec.value(), absl::StrCat("export: list ", root));
  if (!foreign.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "export: ", root, " is not empty and was not made by cubist export (no ",
        kExportMarker, " file, and ", foreign,
        " is not a hard link to a cache object); refusing to replace it: export into an "
        "empty or new directory, or pass --replace to replace it anyway"));
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

// The set as messages name it.
const std::string& SetName(const Manifest& manifest) {
  return manifest.source.empty() ? manifest.name : manifest.source;
}

// Everything must be in the cache before anything is written.
absl::Status CheckAllCached(const Store& store, const Manifest& manifest) {
  size_t missing = 0;
  const Artifact* first_missing = nullptr;
  for (const Artifact& a : manifest.artifacts) {
    // One written since it was published is hashed: exported when its bytes are still
    // the right ones, refused (not called missing) when they are not.
    absl::StatusOr<ObjectState> state = store.ProbeConfirmed(a.sha256, a.size);
    if (!state.ok()) {
      return absl::Status(state.status().code(),
                          absl::StrCat("export ", a.path, ": ", state.status().message(),
                                       "; run `cubist fetch` with the same manifest to "
                                       "repair it"));
    }
    if (*state != ObjectState::kPresent) {
      if (++missing == 1) first_missing = &a;
    }
  }
  if (missing > 0) {
    return absl::NotFoundError(absl::StrCat(
        "export: ", missing, " of ", manifest.artifacts.size(), " artifacts of ",
        SetName(manifest), " are not in the cache at ", store.root(), " (first: ",
        first_missing->path, "); run `cubist fetch` with the same manifest and cache first"));
  }
  return absl::OkStatus();
}

// The directory the export puts the tree at (`dir`, or options.subdir below it), checked
// to lie outside the cache, with the directories above it created.
absl::StatusOr<std::string> PrepareRoot(const Store& store, const Manifest& manifest,
                                        const std::string& dir, const ExportOptions& options) {
  std::string top = dir;
  while (top.size() > 1 && top.back() == '/') top.pop_back();
  std::string root = options.subdir.empty() ? top : absl::StrCat(top, "/", options.subdir);
  CUBIST_RETURN_IF_ERROR(CheckOutsideCache(store, root));
  if (manifest.FindArtifact(kExportMarker) != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "export: ", SetName(manifest), " has an artifact named ", kExportMarker,
        ", the name of export's own marker file"));
  }
  if (options.subdir.empty()) {
    CUBIST_RETURN_IF_ERROR(MakeDirs(DirName(top)));
  } else {
    CUBIST_RETURN_IF_ERROR(MakeDirs(top));
    CUBIST_RETURN_IF_ERROR(MakeRealParentDirs(top, options.subdir));
  }
  return root;
}

// Puts the artifact `a` into the tree at `temp`: a hard link to its cache object, or a
// copy hashed on the way where a link cannot be made (another filesystem) or is unwanted.
absl::Status PlaceArtifact(const Store& store, const Artifact& a, const std::string& temp,
                           const ExportOptions& options, ExportReport* report) {
  const std::string object = store.ObjectPath(a.sha256);
  const std::string to = absl::StrCat(temp, "/", a.path);
  CUBIST_RETURN_IF_ERROR(MakeRealParentDirs(temp, a.path));
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
    ++report->linked;
  } else {
    CUBIST_RETURN_IF_ERROR(CopyVerified(object, to, a));
    ++report->copied;
  }
  uint64_t size = 0;
  store.Probe(a.sha256, std::nullopt, &size);
  report->bytes += size;
  return absl::OkStatus();
}

// Writes one of options.extra_files (`path`, holding `bytes`) into the tree at `temp`.
absl::Status WriteExtraFile(const Manifest& manifest, const std::string& path,
                            std::string_view bytes, const std::string& temp,
                            ExportReport* report) {
  if (absl::Status s = ValidateArtifactPath(path); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("export: extra file: ", s.message()));
  }
  if (manifest.FindArtifact(path) != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("export: extra file ", path, " is also an artifact"));
  }
  CUBIST_RETURN_IF_ERROR(MakeRealParentDirs(temp, path));
  const std::string to = absl::StrCat(temp, "/", path);
  UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444));
  if (!out.valid()) return ErrnoToStatus(errno, absl::StrCat("export: create ", to));
  CUBIST_RETURN_IF_ERROR(WriteAll(out.get(), bytes, "export: ", to));
  report->bytes += bytes.size();
  return absl::OkStatus();
}

absl::Status WriteMarker(const Manifest& manifest, const std::string& temp) {
  const std::string marker = absl::StrCat(
      "Made by cubist export from ", SetName(manifest),
      ".\nThe next export to this directory replaces the whole tree; remove this file to "
      "keep it from that.\n");
  return WriteFileAtomically(absl::StrCat(temp, "/", kExportMarker), marker, 0444);
}

// Puts the finished tree at `root`: swapped with the tree there in one rename (the old
// one then sits at temp's path, and ~TempTree removes it), or renamed to it.
absl::Status MoveIntoPlace(TempTree& temp, const std::string& root, bool* replaced) {
  struct stat st;
  if (::lstat(root.c_str(), &st) == 0) {
    if (::renameat2(AT_FDCWD, temp.path().c_str(), AT_FDCWD, root.c_str(),
                    RENAME_EXCHANGE) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("export: swap ", temp.path(), " and ", root));
    }
    *replaced = true;
    return absl::OkStatus();
  }
  if (::rename(temp.path().c_str(), root.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("export: rename ", temp.path(), " to ", root));
  }
  temp.Release();
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
  CUBIST_RETURN_IF_ERROR(CheckAllCached(store, manifest));
  ExportReport report;
  CUBIST_ASSIGN_OR_RETURN(report.root, PrepareRoot(store, manifest, dir, options));
  const std::string parent = DirName(report.root);
  const std::string base = fs::path(report.root).filename().string();
  CUBIST_RETURN_IF_ERROR(CheckReplaceable(store, manifest, report.root, options));

  // The tree is built beside its place and moved there whole.
  ReapStaleTemps(parent);
  CUBIST_ASSIGN_OR_RETURN(TempTree temp, MakeLockedTemp(parent, base));
  for (const Artifact& a : manifest.artifacts) {
    CUBIST_RETURN_IF_ERROR(PlaceArtifact(store, a, temp.path(), options, &report));
  }
  for (const auto& [path, bytes] : options.extra_files) {
    CUBIST_RETURN_IF_ERROR(WriteExtraFile(manifest, path, bytes, temp.path(), &report));
  }
  CUBIST_RETURN_IF_ERROR(WriteMarker(manifest, temp.path()));

  // Data first, then the rename: syncfs flushes the whole tree in one call.
  CUBIST_RETURN_IF_ERROR(FlushFilesystemOf(temp.path(), "export"));
  // Checked again: the tree may have appeared or changed while this one was built.
  CUBIST_RETURN_IF_ERROR(CheckReplaceable(store, manifest, report.root, options));
  CUBIST_RETURN_IF_ERROR(MoveIntoPlace(temp, report.root, &report.replaced));
  CUBIST_RETURN_IF_ERROR(SyncDir(parent));
  return report;
}

}  // namespace cubist
