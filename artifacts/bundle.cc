#include "artifacts/bundle.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "artifacts/keep.h"
#include "artifacts/version_guard.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "manifest/checksums.h"
#include "manifest/message_text.h"
#include "manifest/path_rules.h"

namespace cubist {
namespace {

namespace fs = std::filesystem;

constexpr char kMarkerMember[] = "cubist-bundle";
constexpr std::string_view kManifestsDir = "manifests/";
constexpr std::string_view kObjectsDir = "objects/sha256/";
constexpr size_t kCopyBuffer = 1 << 20;

bool IsJson(std::string_view bytes) {
  const size_t first = bytes.find_first_not_of(" \t\r\n\xEF\xBB\xBF");
  return first != std::string_view::npos && bytes[first] == '{';
}

std::string ObjectMember(std::string_view sha) {
  return absl::StrCat(Sv(kObjectsDir), Sv(sha.substr(0, 2)), "/", Sv(sha));
}

absl::Status WriteAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("write ", path));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Removes a path (file or tree) unless released.
class Cleanup {
 public:
  explicit Cleanup(std::string path) : path_(std::move(path)) {}
  ~Cleanup() {
    if (!path_.empty()) {
      std::error_code ec;
      fs::remove_all(path_, ec);
    }
  }
  Cleanup(const Cleanup&) = delete;
  Cleanup& operator=(const Cleanup&) = delete;
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

// A manifest's member file name: its own name, so that the name a bundle gives a file
// (and `bundle import -o DIR` writes it under) is the set's.
std::string MemberFile(const Manifest& manifest, std::string_view bytes) {
  return absl::StrCat(manifest.name, IsJson(bytes) ? ".json" : ".checksums.txt");
}

struct PendingManifest {
  std::string member;  // manifests/<file>
  std::string bytes;
  std::optional<std::string> signature;
  Manifest manifest;
};

}  // namespace

absl::StatusOr<BundleReport> CreateBundle(const Store& store,
                                          const std::vector<BundleInput>& inputs,
                                          const std::string& output) {
  BundleReport report;
  std::set<std::string> names;
  std::map<std::string, uint64_t> objects;  // sorted: the archive's order
  for (const BundleInput& in : inputs) {
    const std::string file = MemberFile(in.manifest, in.bytes);
    if (absl::Status s = ValidateArtifactPath(file); !s.ok() || in.manifest.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bundle: manifest ", in.manifest.source, ": its name ",
          QuoteForMessage(in.manifest.name), " cannot name a bundle member"));
    }
    if (!names.insert(file).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "bundle: two manifests are named '", in.manifest.name,
          "'; a bundle holds one manifest per name"));
    }
    for (const Artifact& a : in.manifest.artifacts) {
      uint64_t size = 0;
      // Changed since it was published (store.h): only bytes that still hash to their
      // name go into a bundle.
      absl::StatusOr<ObjectState> state = store.ProbeConfirmed(a.sha256, a.size, &size);
      if (!state.ok()) return Annotate(state.status(), absl::StrCat("bundle: ", a.path));
      if (*state != ObjectState::kPresent) {
        return absl::NotFoundError(absl::StrCat(
            "bundle: ", a.path, " of ", in.manifest.source, " (sha256 ", a.sha256,
            ") is not in the cache at ", store.root(),
            "; run `cubist fetch` with that manifest first"));
      }
      objects.emplace(a.sha256, size);
    }
  }

  std::string temp = absl::StrCat(output, ".tmp-XXXXXX");
  UniqueFd fd(::mkstemp(temp.data()));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("bundle: create ", temp));
  Cleanup remove_temp(temp);
  std::string buffer;  // small writes gathered into large ones
  auto flush = [&]() -> absl::Status {
    CUBIST_RETURN_IF_ERROR(WriteAll(fd.get(), buffer, temp));
    buffer.clear();
    return absl::OkStatus();
  };
  TarWriter tar([&](std::string_view bytes) -> absl::Status {
    buffer.append(bytes.data(), bytes.size());
    if (buffer.size() >= kCopyBuffer) return flush();
    return absl::OkStatus();
  });
  auto member = [&](const std::string& name, std::string_view bytes) -> absl::Status {
    CUBIST_RETURN_IF_ERROR(tar.BeginMember(name, bytes.size()));
    CUBIST_RETURN_IF_ERROR(tar.Data(bytes));
    return tar.EndMember();
  };
  CUBIST_RETURN_IF_ERROR(member(kMarkerMember, kBundleMarker));
  for (const BundleInput& in : inputs) {
    const std::string name = absl::StrCat(Sv(kManifestsDir), MemberFile(in.manifest, in.bytes));
    CUBIST_RETURN_IF_ERROR(member(name, in.bytes));
    report.manifests.push_back(name);
    if (in.signature.has_value()) CUBIST_RETURN_IF_ERROR(member(name + ".sig", *in.signature));
  }
  std::vector<char> chunk(kCopyBuffer);
  for (const auto& [sha, size] : objects) {
    const std::string path = store.ObjectPath(sha);
    UniqueFd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!in.valid()) return ErrnoToStatus(errno, absl::StrCat("bundle: open ", path));
    CUBIST_RETURN_IF_ERROR(tar.BeginMember(ObjectMember(sha), size));
    uint64_t left = size;
    while (left > 0) {
      ssize_t n = ::read(in.get(), chunk.data(), std::min<uint64_t>(left, chunk.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return n == 0 ? absl::DataLossError(absl::StrCat("bundle: ", path, " shrank while read"))
                      : ErrnoToStatus(errno, absl::StrCat("bundle: read ", path));
      }
      CUBIST_RETURN_IF_ERROR(tar.Data(std::string_view(chunk.data(), static_cast<size_t>(n))));
      left -= static_cast<uint64_t>(n);
    }
    CUBIST_RETURN_IF_ERROR(tar.EndMember());
    ++report.objects;
    report.bytes += size;
  }
  CUBIST_RETURN_IF_ERROR(tar.Finish());
  CUBIST_RETURN_IF_ERROR(flush());
  if (::fchmod(fd.get(), 0644) != 0 || ::fsync(fd.get()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("bundle: flush ", temp));
  }
  if (::rename(temp.c_str(), output.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("bundle: rename ", temp, " to ", output));
  }
  remove_temp.Release();
  CUBIST_RETURN_IF_ERROR(SyncDir(DirName(output)));
  return report;
}

absl::StatusOr<BundleReport> ImportBundle(const Store& store, const std::string& bundle,
                                          const ImportBundleOptions& options) {
  UniqueFd fd(::open(bundle.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("bundle import: open ", bundle));
  ByteSource source = [&](char* buf, size_t size) -> absl::StatusOr<size_t> {
    for (;;) {
      ssize_t n = ::read(fd.get(), buf, size);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoToStatus(errno, absl::StrCat("bundle import: read ", bundle));
      return static_cast<size_t>(n);
    }
  };
  return ImportBundleFrom(store, std::move(source), bundle, options);
}

absl::StatusOr<BundleReport> ImportBundleFrom(const Store& store, ByteSource source,
                                              const std::string& name,
                                              const ImportBundleOptions& options) {
  TarReader tar(std::move(source), name,
                std::max(options.max_manifest_bytes, options.max_object_bytes));
  auto refuse = [&](const TarMember& m, std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": member ", QuoteForMessage(m.name),
                                                   " at byte ", m.offset, " refused: ", Sv(why)));
  };
  auto read_small = [&](const TarMember& m) -> absl::StatusOr<std::string> {
    if (m.size > options.max_manifest_bytes) {
      return refuse(m, absl::StrCat(m.size, " bytes is over the manifest limit of ",
                                    options.max_manifest_bytes));
    }
    std::string bytes(m.size, '\0');
    size_t done = 0;
    while (done < bytes.size()) {
      CUBIST_ASSIGN_OR_RETURN(size_t n, tar.Read(bytes.data() + done, bytes.size() - done));
      if (n == 0) break;
      done += n;
    }
    return bytes;
  };

  TarMember m;
  bool more = false;
  CUBIST_RETURN_IF_ERROR(tar.Next(&m, &more));
  if (!more || m.name != kMarkerMember) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": not a cubist bundle (its first member must be '", kMarkerMember,
        "'); make one with `cubist bundle create`"));
  }
  {
    CUBIST_ASSIGN_OR_RETURN(std::string marker, read_small(m));
    if (marker != kBundleMarker) {
      return refuse(m, absl::StrCat("this cubist reads cubist.bundle/1, the bundle says ",
                                    QuoteForMessage(marker)));
    }
  }

  // Manifests and signatures, in any order, before the first object.
  std::vector<PendingManifest> manifests;
  std::map<std::string, std::string> signatures;
  CUBIST_RETURN_IF_ERROR(tar.Next(&m, &more));
  while (more && absl::StartsWith(m.name, Sv(kManifestsDir))) {
    const std::string file = m.name.substr(kManifestsDir.size());
    if (file.find('/') != std::string::npos) return refuse(m, "manifests/ holds files only");
    CUBIST_ASSIGN_OR_RETURN(std::string bytes, read_small(m));
    if (absl::EndsWith(file, ".sig")) {
      if (!signatures.emplace(file.substr(0, file.size() - 4), std::move(bytes)).second) {
        return refuse(m, "listed twice");
      }
    } else if (absl::EndsWith(file, ".json") || absl::EndsWith(file, ".checksums.txt")) {
      for (const PendingManifest& p : manifests) {
        if (p.member == m.name) return refuse(m, "listed twice");
      }
      manifests.push_back({m.name, std::move(bytes), std::nullopt, {}});
    } else {
      return refuse(m, "expected manifests/<name>.json, .checksums.txt or .sig");
    }
    CUBIST_RETURN_IF_ERROR(tar.Next(&m, &more));
  }
  if (manifests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": the bundle holds no manifest"));
  }
  // Check each manifest as fetch would, before any object is read.
  absl::flat_hash_map<std::string, std::optional<uint64_t>> wanted;
  for (PendingManifest& p : manifests) {
    const std::string file = p.member.substr(kManifestsDir.size());
    if (auto it = signatures.find(file); it != signatures.end()) {
      p.signature = it->second;
      signatures.erase(it);
    }
    const std::string source = absl::StrCat(name, ":", p.member);
    CUBIST_RETURN_IF_ERROR(CheckManifestSignature(p.bytes, p.signature, options.trust, source));
    ManifestParseOptions parse;
    parse.checksums_name = file.substr(0, file.find('.'));
    if (parse.checksums_name.empty()) parse.checksums_name = "checksums";
    CUBIST_ASSIGN_OR_RETURN(p.manifest, ParseManifestOrChecksums(p.bytes, source, parse));
    if (MemberFile(p.manifest, p.bytes) != file) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": holds the set ", QuoteForMessage(p.manifest.name), ", which a bundle names ",
          Sv(kManifestsDir), MemberFile(p.manifest, p.bytes),
          "; a member's name must be its manifest's: the bundle was altered"));
    }
    CUBIST_RETURN_IF_ERROR(CheckManifestExpiry(p.manifest, options.trust, absl::Now()));
    for (const Artifact& a : p.manifest.artifacts) wanted.emplace(a.sha256, a.size);
  }
  if (!signatures.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": signature manifests/", signatures.begin()->first,
        ".sig belongs to no manifest of the bundle"));
  }
  // The rollback guard, as fetch applies it (version_guard.h): checked now, so that an
  // old bundle is refused before a byte of it is staged, and recorded before publishing.
  const VersionGuard guard(store.root());
  auto guarded = [](const PendingManifest& p) {
    return !p.manifest.name.empty() && p.manifest.version > 0;
  };
  for (const PendingManifest& p : manifests) {
    if (guarded(p)) CUBIST_RETURN_IF_ERROR(guard.Check(p.manifest, options.trust.allow_rollback));
  }
  // Roots in use (keep.h) before any object lands: a gc meanwhile keeps what these
  // manifests name, the objects already cached included.
  std::vector<RootLease> leases;
  for (const PendingManifest& p : manifests) {
    CUBIST_ASSIGN_OR_RETURN(leases.emplace_back(), RootLease::Take(store, p.manifest, p.bytes));
  }

  // Objects, staged under the cache's tmp/ and published only at the end. The staging
  // directory is flock()ed while this runs; gc removes one nobody holds (a killed
  // import's), and cannot come between its creation and the flock (gc.lock).
  const std::string tmp_root = store.root() + "/tmp";
  CUBIST_RETURN_IF_ERROR(MakeDirs(tmp_root));
  std::string staging = tmp_root + "/bundle-XXXXXX";
  UniqueFd staging_lock;
  {
    CUBIST_ASSIGN_OR_RETURN(GcLock gc, GcLock::Acquire(store.root(), /*exclusive=*/false,
                                                       absl::Minutes(10)));
    if (::mkdtemp(staging.data()) == nullptr) {
      return ErrnoToStatus(errno, absl::StrCat("bundle import: create a directory in ", tmp_root));
    }
    staging_lock = UniqueFd(::open(staging.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!staging_lock.valid() || ::flock(staging_lock.get(), LOCK_EX) != 0) {
      absl::Status s = ErrnoToStatus(errno, absl::StrCat("bundle import: lock ", staging));
      ::rmdir(staging.c_str());
      return s;
    }
  }
  Cleanup remove_staging(staging);
  std::set<std::string> staged;
  BundleReport report;
  std::vector<char> chunk(kCopyBuffer);
  while (more) {
    if (!absl::StartsWith(m.name, Sv(kObjectsDir))) {
      return refuse(m, absl::StartsWith(m.name, Sv(kManifestsDir))
                           ? "manifests must come before the objects"
                           : "expected objects/sha256/<2 hex>/<64 hex>");
    }
    const std::string rest = m.name.substr(kObjectsDir.size());
    const std::string sha = rest.size() == 67 ? rest.substr(3) : "";
    if (!IsSha256Hex(sha) || rest.substr(0, 2) != sha.substr(0, 2) || rest[2] != '/') {
      return refuse(m, "expected objects/sha256/<2 hex>/<64 hex>");
    }
    auto want = wanted.find(sha);
    if (want == wanted.end()) return refuse(m, "no manifest of the bundle names this object");
    if (want->second.has_value() && *want->second != m.size) {
      return refuse(m, absl::StrCat(m.size, " bytes, the manifest says ", *want->second));
    }
    if (!staged.insert(sha).second) return refuse(m, "listed twice");
    const std::string path = absl::StrCat(staging, "/", sha);
    UniqueFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!out.valid()) return ErrnoToStatus(errno, absl::StrCat("bundle import: create ", path));
    Sha256 hasher;
    for (;;) {
      CUBIST_ASSIGN_OR_RETURN(size_t n, tar.Read(chunk.data(), chunk.size()));
      if (n == 0) break;
      hasher.Update(chunk.data(), n);
      CUBIST_RETURN_IF_ERROR(WriteAll(out.get(), std::string_view(chunk.data(), n), path));
    }
    const std::string actual = ToHex(hasher.Finish());
    if (actual != sha) {
      return absl::DataLossError(absl::StrCat(
          name, ": member ", m.name, " hashes to ", actual,
          "; the bundle was altered or damaged: nothing was imported; copy it again"));
    }
    report.bytes += m.size;
    CUBIST_RETURN_IF_ERROR(tar.Next(&m, &more));
  }

  // Everything the manifests name must be here or already cached.
  for (const PendingManifest& p : manifests) {
    for (const Artifact& a : p.manifest.artifacts) {
      if (!staged.contains(a.sha256) &&
          store.Probe(a.sha256, a.size) != ObjectState::kPresent) {
        return absl::DataLossError(absl::StrCat(
            name, ": ", p.member, " names ", a.path, " (sha256 ", a.sha256,
            ") but the bundle does not hold it and the cache lacks it; nothing was imported"));
      }
    }
  }
  // Data before names: one syncfs for every staged object (an fdatasync each made the
  // import of FlashInfer's 2,127-file GEMM pin take 13.9 s), then the renames, then each
  // shard directory once.
  {
    UniqueFd dir(::open(staging.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir.valid() || ::syncfs(dir.get()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("bundle import: flush ", staging));
    }
  }
  for (const PendingManifest& p : manifests) {
    if (guarded(p)) {
      CUBIST_RETURN_IF_ERROR(guard.CheckAndRecord(p.manifest, options.trust.allow_rollback));
    }
  }
  std::set<std::string> published;
  for (const std::string& sha : staged) {
    CUBIST_ASSIGN_OR_RETURN(FileLock lock, store.LockObject(sha));
    if (store.Probe(sha, std::nullopt) == ObjectState::kPresent) {
      ++report.objects_already_cached;
      continue;
    }
    CUBIST_RETURN_IF_ERROR(store.Publish(absl::StrCat(staging, "/", sha), sha));
    published.insert(sha);
    ++report.objects;
  }
  // A crash before these syncs can lose a rename, never expose partial data: the
  // object is then simply missing and a second import adds it.
  std::set<std::string> synced;
  for (const std::string& sha : published) {
    if (synced.insert(sha.substr(0, 2)).second) CUBIST_RETURN_IF_ERROR(store.SyncObjectDir(sha));
  }
  for (const PendingManifest& p : manifests) {
    report.manifests.push_back(p.member);
    if (!p.manifest.name.empty()) {
      CUBIST_RETURN_IF_ERROR(store.KeepManifest(p.manifest, p.bytes));
    }
    if (!options.manifests_dir.empty()) {
      const std::string file = p.member.substr(kManifestsDir.size());
      CUBIST_RETURN_IF_ERROR(MakeDirs(options.manifests_dir));
      const std::string out = absl::StrCat(options.manifests_dir, "/", file);
      CUBIST_RETURN_IF_ERROR(WriteFileAtomically(out, p.bytes, 0644));
      if (p.signature.has_value()) {
        CUBIST_RETURN_IF_ERROR(WriteFileAtomically(out + ".sig", *p.signature, 0644));
      }
    }
  }
  return report;
}

}  // namespace cubist
