#include "artifacts/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "artifacts/keep.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "manifest/manifest.h"

namespace cubist {

absl::StatusOr<Store> Store::Open(const std::string& root, bool create) {
  if (root.empty()) return absl::InvalidArgumentError("cache directory: empty path");
  if (!create) {
    struct stat st;
    if (::stat(root.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "cache ", root, ": does not exist; run 'cubist fetch' first or pass --cache"));
    }
    return Store(root);
  }
  for (const char* sub : {"", "/objects/sha256", "/tmp", "/locks", "/manifests", "/state"}) {
    absl::Status s = MakeDirs(root + sub);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("cache ", root, ": ", s.message(),
                                                 "; choose a writable directory with "
                                                 "--cache or CUBIST_CACHE_DIR"));
    }
  }
  if (::access(root.c_str(), W_OK) != 0 || ::access((root + "/tmp").c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cache ", root, ": not writable by this user; choose a writable directory with "
        "--cache or CUBIST_CACHE_DIR"));
  }
  // Best effort: without the file gc reads the cache as layout 1, which it also knows.
  (void)EnsureCacheLayout(root);
  return Store(root);
}

std::string Store::ObjectPath(std::string_view sha256) const {
  return absl::StrCat(root_, "/objects/sha256/", Sv(sha256.substr(0, 2)), "/", Sv(sha256));
}
std::string Store::TempPath(std::string_view sha256) const {
  return absl::StrCat(root_, "/tmp/", Sv(sha256), ".part");
}
std::string Store::LockPath(std::string_view sha256) const {
  return absl::StrCat(root_, "/locks/", Sv(sha256), ".lock");
}

int64_t StampFor(uint64_t size) {
  constexpr int64_t k20000101 = 946684800;
  return k20000101 + static_cast<int64_t>(size);
}

namespace {

bool Stamped(const struct stat& st) {
  return st.st_mtim.tv_nsec == 0 &&
         st.st_mtim.tv_sec == StampFor(static_cast<uint64_t>(st.st_size));
}

absl::Status SetStamp(int fd, uint64_t size, const std::string& path) {
  struct timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;  // atime: left alone
  times[1].tv_sec = StampFor(size);
  times[1].tv_nsec = 0;
  if (::futimens(fd, times) != 0) return ErrnoToStatus(errno, absl::StrCat("stamp ", path));
  return absl::OkStatus();
}

// What an object's lstat (stat_rc, st) says, for Probe and BatchProbe alike.
ObjectState StateOf(int stat_rc, const struct stat& st, std::optional<uint64_t> size,
                    uint64_t* actual_size) {
  if (stat_rc != 0) return ObjectState::kMissing;
  if (!S_ISREG(st.st_mode)) return ObjectState::kNotRegular;
  if (actual_size != nullptr) *actual_size = static_cast<uint64_t>(st.st_size);
  if (size.has_value() && static_cast<uint64_t>(st.st_size) != *size) {
    return ObjectState::kWrongSize;
  }
  return Stamped(st) ? ObjectState::kPresent : ObjectState::kUnconfirmed;
}

}  // namespace

ObjectState Store::Probe(std::string_view sha256, std::optional<uint64_t> size,
                         uint64_t* actual_size) const {
  struct stat st;
  const int rc = ::lstat(ObjectPath(sha256).c_str(), &st);
  return StateOf(rc, st, size, actual_size);
}

absl::StatusOr<ObjectState> Store::ProbeConfirmed(std::string_view sha256,
                                                  std::optional<uint64_t> size,
                                                  uint64_t* actual_size) const {
  const ObjectState state = Probe(sha256, size, actual_size);
  if (state != ObjectState::kUnconfirmed) return state;
  absl::Status confirmed = Confirm(sha256, actual_size);
  if (absl::IsNotFound(confirmed)) return ObjectState::kMissing;
  if (!confirmed.ok()) return confirmed;
  return ObjectState::kPresent;
}

Store::BatchProbe::BatchProbe(const Store& store)
    : store_(store),
      dir_(::open((store.root() + "/objects/sha256").c_str(),
                  O_PATH | O_DIRECTORY | O_CLOEXEC)) {}

ObjectState Store::BatchProbe::Probe(std::string_view sha256,
                                     std::optional<uint64_t> size) const {
  // "<2 hex>/<64 hex>": anything else (never a valid artifact hash) takes Probe's path.
  char name[2 + 1 + 64 + 1];
  if (!dir_.valid() || sha256.size() != 64) return store_.Probe(sha256, size);
  name[0] = sha256[0];
  name[1] = sha256[1];
  name[2] = '/';
  std::memcpy(name + 3, sha256.data(), 64);
  name[67] = '\0';
  struct stat st;
  const int rc = ::fstatat(dir_.get(), name, &st, AT_SYMLINK_NOFOLLOW);
  return StateOf(rc, st, size, nullptr);
}

absl::StatusOr<FileLock> Store::LockObject(std::string_view sha256,
                                           absl::Duration timeout) const {
  return FileLock::Acquire(LockPath(sha256), timeout);
}

absl::StatusOr<FileLock> Store::TryLockObject(std::string_view sha256) const {
  return FileLock::TryAcquire(LockPath(sha256));
}

absl::Status Store::Publish(const std::string& temp_path, std::string_view sha256) const {
  std::string dest = ObjectPath(sha256);
  CUBIST_RETURN_IF_ERROR(MakeDirs(DirName(dest)));
  {
    // The publish record (store.h): the stamp goes on before the name, so the object
    // is never seen under its name without it.
    UniqueFd fd(::open(temp_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    struct stat st;
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("open ", temp_path));
    }
    CUBIST_RETURN_IF_ERROR(SetStamp(fd.get(), static_cast<uint64_t>(st.st_size), temp_path));
    if (::fchmod(fd.get(), 0444) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("chmod ", temp_path));
    }
  }
  // Something planted at the object's path (a symlink, a directory) must not survive:
  // rename() replaces a file or link atomically, but not a directory.
  struct stat st;
  if (::lstat(dest.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        dest, ": a directory stands where a cache object belongs; remove it"));
  }
  if (::rename(temp_path.c_str(), dest.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("rename into ", dest));
  }
  return absl::OkStatus();
}

absl::Status Store::SyncObjectDir(std::string_view sha256) const {
  return SyncDir(DirName(ObjectPath(sha256)));
}

absl::Status Store::PutBytes(std::string_view sha256, std::string_view bytes,
                             absl::Duration timeout) const {
  if (Sha256Hex(bytes) != sha256) {
    return absl::DataLossError(absl::StrCat("object ", Sv(sha256), ": ", bytes.size(),
                                            " bytes in memory hash to ", Sha256Hex(bytes)));
  }
  if (Probe(sha256, bytes.size()) == ObjectState::kPresent) return absl::OkStatus();
  CUBIST_ASSIGN_OR_RETURN(FileLock lock, LockObject(sha256, timeout));
  // A fetch that held the lock may have published it meanwhile.
  if (Probe(sha256, bytes.size()) == ObjectState::kPresent) return absl::OkStatus();
  const std::string temp = TempPath(sha256);
  CUBIST_RETURN_IF_ERROR(MakeDirs(DirName(temp)));
  CUBIST_RETURN_IF_ERROR(WriteFileAtomically(temp, bytes, 0644));
  if (absl::Status s = Publish(temp, sha256); !s.ok()) {
    ::unlink(temp.c_str());
    return s;
  }
  return SyncObjectDir(sha256);
}

absl::Status Store::Confirm(std::string_view sha256, uint64_t* actual_size) const {
  const std::string path = ObjectPath(sha256);
  uint64_t size = 0;
  CUBIST_ASSIGN_OR_RETURN(std::string actual, Sha256File(path, &size));
  if (actual_size != nullptr) *actual_size = size;
  if (actual != sha256) {
    return absl::DataLossError(absl::StrCat(
        path, ": changed after it was verified (its publish stamp no longer matches): "
        "sha256 ", actual, " (", size, " bytes), expected ", Sv(sha256)));
  }
  // Best effort: an object of another user keeps its old mtime and is hashed again
  // next time, which costs time, never correctness. A publish that replaced it meanwhile
  // stamped it already.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.valid()) (void)SetStamp(fd.get(), size, path);
  return absl::OkStatus();
}

absl::Status Store::Remove(std::string_view sha256) const {
  std::string path = ObjectPath(sha256);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, absl::StrCat("remove ", path));
  }
  return absl::OkStatus();
}

bool Store::IsKept(const Manifest& manifest, std::string_view bytes) const {
  struct stat st;
  return ::stat(absl::StrCat(ManifestsDir(), "/", KeptManifestFileName(manifest, bytes)).c_str(),
                &st) == 0;
}

absl::Status Store::KeepManifest(const Manifest& manifest, std::string_view bytes) const {
  if (manifest.name.empty()) return absl::OkStatus();
  // The name holds the digest of the bytes: a file there holds these bytes already.
  if (IsKept(manifest, bytes)) return absl::OkStatus();
  const std::string path =
      absl::StrCat(ManifestsDir(), "/", KeptManifestFileName(manifest, bytes));
  absl::Status s = WriteFileAtomically(path, bytes, 0644);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("keep manifest ", manifest.name,
                                             " for 'cubist gc': ", s.message(),
                                             "; its objects are not kept until it is: free "
                                             "space and run the command again"));
}

absl::StatusOr<std::vector<std::string>> Store::ListObjects() const {
  std::vector<std::string> out;
  std::string base = root_ + "/objects/sha256";
  DIR* top = ::opendir(base.c_str());
  if (top == nullptr) {
    if (errno == ENOENT) return out;
    return ErrnoToStatus(errno, absl::StrCat("list ", base));
  }
  while (dirent* shard = ::readdir(top)) {
    std::string name = shard->d_name;
    // Shards are two hex digits; ".." is two characters too.
    if (name.size() != 2 || !std::isxdigit(static_cast<unsigned char>(name[0])) ||
        !std::isxdigit(static_cast<unsigned char>(name[1]))) {
      continue;
    }
    std::string dir = base + "/" + name;
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) continue;
    while (dirent* e = ::readdir(d)) {
      std::string obj = e->d_name;
      if (obj == "." || obj == "..") continue;
      out.push_back(obj);
    }
    ::closedir(d);
  }
  ::closedir(top);
  return out;
}

}  // namespace cubist
