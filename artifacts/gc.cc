#include "artifacts/gc.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "artifacts/keep.h"
#include "artifacts/parsed_manifest_cache.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "manifest/checksums.h"

namespace cubist {
namespace {

constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(std::move(n));
  }
  ::closedir(d);
  return out;
}

// The whole file behind `fd` (a pending root may be unlinked by its holder meanwhile;
// the open descriptor still reads it).
absl::StatusOr<std::string> ReadFd(int fd, const std::string& path) {
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("read ", path));
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxManifestBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": over ", kMaxManifestBytes, " bytes"));
    }
  }
}

absl::StatusOr<Manifest> ParseKept(const std::string& bytes, const std::string& path) {
  auto m = ParseManifestOrChecksums(bytes, path);
  if (!m.ok()) {
    return absl::Status(m.status().code(),
                        absl::StrCat("gc: kept manifest ", path, " does not parse (",
                                     m.status().message(),
                                     "); nothing was deleted; remove or fix that file"));
  }
  if (m->digest.empty()) m->digest = Sha256Hex(bytes);
  return m;
}

// Whether --drop `spec` names `m` (see GcOptions::drop).
bool DropMatches(std::string_view spec, const Manifest& m) {
  if (spec == m.name) return true;
  const size_t at = spec.rfind('@');
  if (at == std::string_view::npos || spec.substr(0, at) != m.name) return false;
  const std::string v(spec.substr(at + 1));
  int64_t version = 0;
  if (!v.empty() && absl::c_all_of(v, absl::ascii_isdigit) && absl::SimpleAtoi(v, &version)) {
    return version == m.version;
  }
  return v.size() >= 8 && absl::StartsWith(m.digest, absl::AsciiStrToLower(v));
}

// A directory under tmp/ that a `bundle import` stages objects in: it holds an
// exclusive flock on the directory while it runs.
bool IsStagingDir(const std::string& name) { return absl::StartsWith(name, "bundle-"); }

absl::Status CheckLayout(const Store& store) {
  CUBIST_ASSIGN_OR_RETURN(int layout, ReadCacheLayout(store.root()));
  if (layout > kCacheLayout) {
    return absl::FailedPreconditionError(absl::StrCat(
        "gc: cache ", store.root(), " has layout ", layout, ", newer than this cubist knows (",
        kCacheLayout, "); nothing was deleted; run gc with the cubist that wrote it"));
  }
  return absl::OkStatus();
}

// One CollectGarbage, under the exclusive gc.lock: first what must stay (every object a
// root in use or a kept manifest names) is gathered, then everything else is removed.
class GcPass {
 public:
  GcPass(const Store& store, const GcOptions& options) : store_(store), options_(options) {}

  absl::Status KeepPendingRoots();
  absl::StatusOr<std::vector<std::string>> KeepManifests();
  void KeepExtra();
  absl::Status RemoveDropped(const std::vector<std::string>& to_drop) const;
  absl::Status RemoveUnkeptObjects();
  void RemoveAbandonedTemps();
  void RemoveUnkeptParsed();
  void RemoveFreeLocks();
  const GcReport& report() const { return report_; }

 private:
  void Keep(const Manifest& m) {
    kept_digests_.insert(m.digest);
    for (const Artifact& a : m.artifacts) keep_.insert(a.sha256);
  }

  const Store& store_;
  const GcOptions& options_;
  GcReport report_;
  absl::flat_hash_set<std::string> keep_;          // object names
  absl::flat_hash_set<std::string> kept_digests_;  // of the manifests kept
};

// The roots in use (keep.h): the manifests of fetches and imports in progress. One whose
// holder died is removed instead.
absl::Status GcPass::KeepPendingRoots() {
  const std::string pending = store_.ManifestsDir() + "/pending";
  for (const std::string& file : ListDir(pending)) {
    const std::string path = absl::StrCat(pending, "/", file);
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid()) continue;  // released meanwhile
    if (LockIfAbandoned(fd.get())) {
      if (options_.dry_run || ::unlink(path.c_str()) == 0) ++report_.roots_removed;
      continue;
    }
    auto bytes = ReadFd(fd.get(), path);
    if (!bytes.ok()) return Annotate(bytes.status(), "gc: nothing was deleted");
    CUBIST_ASSIGN_OR_RETURN(Manifest m, ParseKept(*bytes, path));
    ++report_.roots_in_use;
    Keep(m);
  }
  return absl::OkStatus();
}

// The kept manifests: each is kept, unless a --drop names it; then its file is returned,
// to be removed once every --drop is known to name one (else nothing is deleted).
absl::StatusOr<std::vector<std::string>> GcPass::KeepManifests() {
  std::vector<bool> drop_used(options_.drop.size(), false);
  std::vector<std::string> to_drop;
  std::vector<std::string> kept_names;
  for (const std::string& file : ListDir(store_.ManifestsDir())) {
    if (!absl::EndsWith(file, ".json")) continue;
    std::string path = absl::StrCat(store_.ManifestsDir(), "/", file);
    auto bytes = ReadFileToString(path, kMaxManifestBytes);
    if (!bytes.ok()) {
      return Annotate(bytes.status(), "gc: nothing was deleted");
    }
    CUBIST_ASSIGN_OR_RETURN(Manifest m, ParseKept(*bytes, path));
    bool dropped = false;
    for (size_t i = 0; i < options_.drop.size(); ++i) {
      if (DropMatches(options_.drop[i], m)) drop_used[i] = dropped = true;
    }
    kept_names.push_back(absl::StrCat(m.name, "@", m.version));
    if (dropped) {
      to_drop.push_back(path);
      report_.dropped.push_back(absl::StrCat(m.name, " v", m.version, " (", file, ")"));
      continue;
    }
    ++report_.kept_manifests;
    Keep(m);
  }
  for (size_t i = 0; i < options_.drop.size(); ++i) {
    if (drop_used[i]) continue;
    return absl::NotFoundError(absl::StrCat(
        "gc --drop ", options_.drop[i], ": no kept manifest is named so (kept: ",
        kept_names.empty() ? "none" : absl::StrJoin(kept_names, ", "),
        "; give NAME, NAME@VERSION or NAME@DIGEST-PREFIX); nothing was deleted"));
  }
  return to_drop;
}

void GcPass::KeepExtra() {
  for (const Manifest& m : options_.extra_keep) {
    ++report_.kept_manifests;
    Keep(m);
  }
}

absl::Status GcPass::RemoveDropped(const std::vector<std::string>& to_drop) const {
  if (options_.dry_run) return absl::OkStatus();
  for (const std::string& path : to_drop) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, absl::StrCat("gc --drop: remove ", path));
    }
  }
  return absl::OkStatus();
}

// Every object nothing keeps, unless a fetch holds its lock.
absl::Status GcPass::RemoveUnkeptObjects() {
  CUBIST_ASSIGN_OR_RETURN(std::vector<std::string> objects, store_.ListObjects());
  for (const std::string& name : objects) {
    if (keep_.contains(name)) {
      ++report_.objects_kept;
      continue;
    }
    std::string path = store_.ObjectPath(name);
    if (!IsSha256Hex(name)) {
      // Not ours (a planted or stray file); objects/ holds nothing else.
      path = absl::StrCat(store_.root(), "/objects/sha256/", name.substr(0, 2), "/", name);
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (IsSha256Hex(name)) {
      auto lock = store_.TryLockObject(name);
      if (!lock.ok() || !lock->held()) {
        ++report_.busy_skipped;
        continue;
      }
      if (!options_.dry_run && ::unlink(path.c_str()) != 0) continue;
    } else if (!options_.dry_run && ::unlink(path.c_str()) != 0) {
      continue;
    }
    ++report_.objects_removed;
    report_.bytes_freed += static_cast<uint64_t>(st.st_size);
  }
  return absl::OkStatus();
}

// Partial downloads: their writer holds the object's lock while alive. Staging
// directories of bundle imports: their importer holds a flock on the directory.
void GcPass::RemoveAbandonedTemps() {
  for (const std::string& file : ListDir(store_.root() + "/tmp")) {
    std::string path = absl::StrCat(store_.root(), "/tmp/", file);
    std::string sha = file.substr(0, file.find('.'));
    if (IsStagingDir(file)) {
      UniqueFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
      if (dir.valid()) {
        if (!LockIfAbandoned(dir.get())) {
          ++report_.busy_skipped;
          continue;
        }
        std::error_code ec;
        if (options_.dry_run || std::filesystem::remove_all(path, ec) > 0) {
          ++report_.temps_removed;
        }
        continue;
      }
    }
    if (IsSha256Hex(sha) && absl::EndsWith(file, ".part")) {
      auto lock = store_.TryLockObject(sha);
      if (!lock.ok() || !lock->held()) {
        ++report_.busy_skipped;
        continue;
      }
    }
    if (options_.dry_run || ::unlink(path.c_str()) == 0) ++report_.temps_removed;
  }
}

// Parsed manifests (parsed_manifest_cache.h) of manifests no longer kept: each is
// named by its manifest's digest; one still wanted is parsed and written again.
void GcPass::RemoveUnkeptParsed() {
  const ParsedManifestCache parsed(store_);
  for (const std::string& file : ListDir(parsed.dir())) {
    if (kept_digests_.contains(file.substr(0, 64))) continue;
    if (options_.dry_run || ::unlink(absl::StrCat(parsed.dir(), "/", file).c_str()) == 0) {
      ++report_.parsed_removed;
    }
  }
}

// Lock files: taking a free lock and releasing it unlinks the file (FileLock).
void GcPass::RemoveFreeLocks() {
  for (const std::string& file : ListDir(store_.root() + "/locks")) {
    if (options_.dry_run) continue;
    auto lock = FileLock::TryAcquire(absl::StrCat(store_.root(), "/locks/", file));
    if (lock.ok() && lock->held()) ++report_.locks_removed;
  }
}

}  // namespace

absl::StatusOr<GcReport> CollectGarbage(const Store& store, const GcOptions& options) {
  CUBIST_RETURN_IF_ERROR(CheckLayout(store));
  // No root is added while this is held (keep.h), so none escapes the lists below.
  CUBIST_ASSIGN_OR_RETURN(GcLock gc_lock,
                          GcLock::Acquire(store.root(), /*exclusive=*/true, options.lock_timeout));
  GcPass gc(store, options);
  // Roots in use first: a fetch writes its kept manifest before it lets go of its root,
  // so reading them in this order misses neither.
  CUBIST_RETURN_IF_ERROR(gc.KeepPendingRoots());
  CUBIST_ASSIGN_OR_RETURN(std::vector<std::string> to_drop, gc.KeepManifests());
  gc.KeepExtra();
  CUBIST_RETURN_IF_ERROR(gc.RemoveDropped(to_drop));

  CUBIST_RETURN_IF_ERROR(gc.RemoveUnkeptObjects());
  gc.RemoveAbandonedTemps();
  gc.RemoveUnkeptParsed();
  gc.RemoveFreeLocks();
  return gc.report();
}

}  // namespace cubist
