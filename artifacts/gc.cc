#include "artifacts/gc.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "artifacts/parsed_manifest_cache.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/checksums.h"

namespace cubist {
namespace {

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

}  // namespace

absl::StatusOr<GcReport> CollectGarbage(const Store& store, const GcOptions& options) {
  GcReport report;
  absl::flat_hash_set<std::string> keep;
  absl::flat_hash_set<std::string> kept_digests;
  for (const std::string& file : ListDir(store.ManifestsDir())) {
    if (!absl::EndsWith(file, ".json")) continue;
    std::string path = absl::StrCat(store.ManifestsDir(), "/", file);
    auto bytes = ReadFileToString(path, uint64_t{64} << 20);
    if (!bytes.ok()) {
      return Annotate(bytes.status(), "gc: nothing was deleted");
    }
    auto m = ParseManifestOrChecksums(*bytes, path);
    if (!m.ok()) {
      return absl::Status(m.status().code(),
                          absl::StrCat("gc: kept manifest ", path, " does not parse (",
                                       m.status().message(),
                                       "); nothing was deleted; remove or fix that file"));
    }
    ++report.kept_manifests;
    kept_digests.insert(m->digest);
    for (const Artifact& a : m->artifacts) keep.insert(a.sha256);
  }
  for (const Manifest& m : options.extra_keep) {
    ++report.kept_manifests;
    kept_digests.insert(m.digest);
    for (const Artifact& a : m.artifacts) keep.insert(a.sha256);
  }

  CUBIST_ASSIGN_OR_RETURN(std::vector<std::string> objects, store.ListObjects());
  for (const std::string& name : objects) {
    if (keep.contains(name)) {
      ++report.objects_kept;
      continue;
    }
    std::string path = store.ObjectPath(name);
    if (!IsSha256Hex(name)) {
      // Not ours (a planted or stray file); objects/ holds nothing else.
      path = absl::StrCat(store.root(), "/objects/sha256/", name.substr(0, 2), "/", name);
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (IsSha256Hex(name)) {
      auto lock = store.TryLockObject(name);
      if (!lock.ok() || !lock->held()) {
        ++report.busy_skipped;
        continue;
      }
      if (!options.dry_run && ::unlink(path.c_str()) != 0) continue;
    } else if (!options.dry_run && ::unlink(path.c_str()) != 0) {
      continue;
    }
    ++report.objects_removed;
    report.bytes_freed += static_cast<uint64_t>(st.st_size);
  }

  // Partial downloads: their writer holds the object's lock while alive.
  for (const std::string& file : ListDir(store.root() + "/tmp")) {
    std::string path = absl::StrCat(store.root(), "/tmp/", file);
    std::string sha = file.substr(0, file.find('.'));
    if (IsSha256Hex(sha) && absl::EndsWith(file, ".part")) {
      auto lock = store.TryLockObject(sha);
      if (!lock.ok() || !lock->held()) {
        ++report.busy_skipped;
        continue;
      }
    }
    if (options.dry_run || ::unlink(path.c_str()) == 0) ++report.temps_removed;
  }
  // Parsed manifests (parsed_manifest_cache.h) of manifests no longer kept: each is
  // named by its manifest's digest; one still wanted is parsed and written again.
  const ParsedManifestCache parsed(store);
  for (const std::string& file : ListDir(parsed.dir())) {
    if (kept_digests.contains(file.substr(0, 64))) continue;
    if (options.dry_run || ::unlink(absl::StrCat(parsed.dir(), "/", file).c_str()) == 0) {
      ++report.parsed_removed;
    }
  }
  // Lock files: taking a free lock and releasing it unlinks the file (FileLock).
  for (const std::string& file : ListDir(store.root() + "/locks")) {
    if (options.dry_run) continue;
    auto lock = FileLock::TryAcquire(absl::StrCat(store.root(), "/locks/", file));
    if (lock.ok() && lock->held()) ++report.locks_removed;
  }
  return report;
}

}  // namespace cubist
