#include "artifacts/bundle.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "artifacts/keep.h"
#include "artifacts/staging.h"
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

// ---- bundle create ----

// Every object the inputs name, once, with its size, sorted: the archive's order.
// Refuses a manifest whose name cannot name a member, two manifests of one name, and an
// object the cache lacks.
absl::StatusOr<std::map<std::string, uint64_t>> CollectBundleObjects(
    const Store& store, const std::vector<BundleInput>& inputs) {
  std::set<std::string> names;
  std::map<std::string, uint64_t> objects;
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
  return objects;
}

absl::Status AppendMember(TarWriter& tar, const std::string& name, std::string_view bytes) {
  CUBIST_RETURN_IF_ERROR(tar.BeginMember(name, bytes.size()));
  CUBIST_RETURN_IF_ERROR(tar.Data(bytes));
  return tar.EndMember();
}

// Appends the cache object `sha` (`size` bytes) as its member, copied through `chunk`.
absl::Status AppendObject(const Store& store, const std::string& sha, uint64_t size,
                          TarWriter& tar, std::vector<char>& chunk) {
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
  return tar.EndMember();
}

// Makes the whole temporary file `temp` the bundle at `output`: readable by all,
// flushed, renamed over it, and the rename made durable.
absl::Status CommitBundle(int fd, RemoveOnExit& temp, const std::string& output) {
  if (::fchmod(fd, 0644) != 0 || ::fsync(fd) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("bundle: flush ", temp.path()));
  }
  if (::rename(temp.path().c_str(), output.c_str()) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("bundle: rename ", temp.path(), " to ", output));
  }
  temp.Release();
  return SyncDir(DirName(output));
}

// ---- bundle import ----

// One ImportBundleFrom, a step per method in the archive's order: the marker; the
// manifests, all checked before any object is read; the objects, staged under the
// cache's tmp/; and, once the whole bundle is read and accounted for, the publishing.
class BundleImport {
 public:
  BundleImport(const Store& store, ByteSource source, const std::string& name,
               const ImportBundleOptions& options)
      : store_(store),
        name_(name),
        options_(options),
        tar_(std::move(source), name,
             std::max(options.max_manifest_bytes, options.max_object_bytes)),
        guard_(store.root()) {}

  absl::Status ReadMarker();
  absl::Status ReadManifests();
  absl::Status CheckManifests();
  absl::Status GuardAndLease();
  absl::Status CreateStaging();
  absl::Status StageObjects();
  absl::Status CheckComplete() const;
  absl::Status Publish();
  absl::Status KeepManifests();
  const BundleReport& report() const { return report_; }

 private:
  // The member under the reader (m_) refused, naming it and where it starts.
  absl::Status Refuse(std::string_view why) const {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": member ", QuoteForMessage(m_.name),
                                                   " at byte ", m_.offset,
                                                   " refused: ", Sv(why)));
  }
  // The member under the reader, whole: the marker, a manifest or a signature.
  absl::StatusOr<std::string> ReadSmall();
  absl::Status StageObject(std::vector<char>& chunk);
  // Whether the rollback guard (version_guard.h) applies to `p`, as fetch applies it.
  static bool Guarded(const PendingManifest& p) {
    return !p.manifest.name.empty() && p.manifest.version > 0;
  }

  const Store& store_;
  const std::string& name_;
  const ImportBundleOptions& options_;
  TarReader tar_;
  TarMember m_;        // the member under the reader
  bool more_ = false;  // false once the archive has ended
  std::vector<PendingManifest> manifests_;
  std::map<std::string, std::string> signatures_;  // manifest file -> its .sig's bytes
  absl::flat_hash_map<std::string, std::optional<uint64_t>> wanted_;  // sha -> size
  const VersionGuard guard_;
  std::vector<RootLease> leases_;
  std::string staging_;
  UniqueFd staging_lock_;
  std::optional<RemoveOnExit> remove_staging_;  // declared after the lock: removed first
  std::set<std::string> staged_;
  BundleReport report_;
};

absl::StatusOr<std::string> BundleImport::ReadSmall() {
  if (m_.size > options_.max_manifest_bytes) {
    return Refuse(absl::StrCat(m_.size, " bytes is over the manifest limit of ",
                               options_.max_manifest_bytes));
  }
  std::string bytes(m_.size, '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    CUBIST_ASSIGN_OR_RETURN(size_t n, tar_.Read(bytes.data() + done, bytes.size() - done));
    if (n == 0) break;
    done += n;
  }
  return bytes;
}

absl::Status BundleImport::ReadMarker() {
  CUBIST_RETURN_IF_ERROR(tar_.Next(&m_, &more_));
  if (!more_ || m_.name != kMarkerMember) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": not a cubist bundle (its first member must be '", kMarkerMember,
        "'); make one with `cubist bundle create`"));
  }
  CUBIST_ASSIGN_OR_RETURN(std::string marker, ReadSmall());
  if (marker != kBundleMarker) {
    return Refuse(absl::StrCat("this cubist reads cubist.bundle/1, the bundle says ",
                               QuoteForMessage(marker)));
  }
  return absl::OkStatus();
}

// Manifests and signatures, in any order, before the first object.
absl::Status BundleImport::ReadManifests() {
  CUBIST_RETURN_IF_ERROR(tar_.Next(&m_, &more_));
  while (more_ && absl::StartsWith(m_.name, Sv(kManifestsDir))) {
    const std::string file = m_.name.substr(kManifestsDir.size());
    if (file.find('/') != std::string::npos) return Refuse("manifests/ holds files only");
    CUBIST_ASSIGN_OR_RETURN(std::string bytes, ReadSmall());
    if (absl::EndsWith(file, ".sig")) {
      if (!signatures_.emplace(file.substr(0, file.size() - 4), std::move(bytes)).second) {
        return Refuse("listed twice");
      }
    } else if (absl::EndsWith(file, ".json") || absl::EndsWith(file, ".checksums.txt")) {
      for (const PendingManifest& p : manifests_) {
        if (p.member == m_.name) return Refuse("listed twice");
      }
      manifests_.push_back({m_.name, std::move(bytes), std::nullopt, {}});
    } else {
      return Refuse("expected manifests/<name>.json, .checksums.txt or .sig");
    }
    CUBIST_RETURN_IF_ERROR(tar_.Next(&m_, &more_));
  }
  if (manifests_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name_, ": the bundle holds no manifest"));
  }
  return absl::OkStatus();
}

// Checks each manifest as fetch would (signature, parse, expiry), before any object is
// read, and learns the objects they name.
absl::Status BundleImport::CheckManifests() {
  for (PendingManifest& p : manifests_) {
    const std::string file = p.member.substr(kManifestsDir.size());
    if (auto it = signatures_.find(file); it != signatures_.end()) {
      p.signature = it->second;
      signatures_.erase(it);
    }
    const std::string source = absl::StrCat(name_, ":", p.member);
    CUBIST_RETURN_IF_ERROR(CheckManifestSignature(p.bytes, p.signature, options_.trust, source));
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
    CUBIST_RETURN_IF_ERROR(CheckManifestExpiry(p.manifest, options_.trust, absl::Now()));
    for (const Artifact& a : p.manifest.artifacts) wanted_.emplace(a.sha256, a.size);
  }
  if (!signatures_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name_, ": signature manifests/", signatures_.begin()->first,
        ".sig belongs to no manifest of the bundle"));
  }
  return absl::OkStatus();
}

absl::Status BundleImport::GuardAndLease() {
  // The rollback guard, as fetch applies it (version_guard.h): checked now, so that an
  // old bundle is refused before a byte of it is staged, and recorded before publishing.
  for (const PendingManifest& p : manifests_) {
    if (Guarded(p)) CUBIST_RETURN_IF_ERROR(guard_.Check(p.manifest, options_.trust.allow_rollback));
  }
  // Roots in use (keep.h) before any object lands: a gc meanwhile keeps what these
  // manifests name, the objects already cached included.
  for (const PendingManifest& p : manifests_) {
    CUBIST_ASSIGN_OR_RETURN(leases_.emplace_back(), RootLease::Take(store_, p.manifest, p.bytes));
  }
  return absl::OkStatus();
}

// Objects are staged under the cache's tmp/ and published only at the end. The staging
// directory is flock()ed while this runs; gc removes one nobody holds (a killed
// import's), and cannot come between its creation and the flock (gc.lock).
absl::Status BundleImport::CreateStaging() {
  const std::string tmp_root = store_.root() + "/tmp";
  CUBIST_RETURN_IF_ERROR(MakeDirs(tmp_root));
  staging_ = tmp_root + "/bundle-XXXXXX";
  {
    CUBIST_ASSIGN_OR_RETURN(GcLock gc, GcLock::Acquire(store_.root(), /*exclusive=*/false,
                                                       absl::Minutes(10)));
    if (::mkdtemp(staging_.data()) == nullptr) {
      return ErrnoToStatus(errno, absl::StrCat("bundle import: create a directory in ", tmp_root));
    }
    staging_lock_ = UniqueFd(::open(staging_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!staging_lock_.valid() || ::flock(staging_lock_.get(), LOCK_EX) != 0) {
      absl::Status s = ErrnoToStatus(errno, absl::StrCat("bundle import: lock ", staging_));
      ::rmdir(staging_.c_str());
      return s;
    }
  }
  remove_staging_.emplace(staging_);
  return absl::OkStatus();
}

absl::Status BundleImport::StageObjects() {
  std::vector<char> chunk(kCopyBuffer);
  while (more_) {
    CUBIST_RETURN_IF_ERROR(StageObject(chunk));
    CUBIST_RETURN_IF_ERROR(tar_.Next(&m_, &more_));
  }
  return absl::OkStatus();
}

// The member under the reader: an object a manifest names, with the size it says,
// copied into the staging directory and hashed on the way; refused unless the bytes
// hash to its name.
absl::Status BundleImport::StageObject(std::vector<char>& chunk) {
  if (!absl::StartsWith(m_.name, Sv(kObjectsDir))) {
    return Refuse(absl::StartsWith(m_.name, Sv(kManifestsDir))
                      ? "manifests must come before the objects"
                      : "expected objects/sha256/<2 hex>/<64 hex>");
  }
  const std::string rest = m_.name.substr(kObjectsDir.size());
  const std::string sha = rest.size() == 67 ? rest.substr(3) : "";
  if (!IsSha256Hex(sha) || rest.substr(0, 2) != sha.substr(0, 2) || rest[2] != '/') {
    return Refuse("expected objects/sha256/<2 hex>/<64 hex>");
  }
  auto want = wanted_.find(sha);
  if (want == wanted_.end()) return Refuse("no manifest of the bundle names this object");
  if (want->second.has_value() && *want->second != m_.size) {
    return Refuse(absl::StrCat(m_.size, " bytes, the manifest says ", *want->second));
  }
  if (!staged_.insert(sha).second) return Refuse("listed twice");
  const std::string path = absl::StrCat(staging_, "/", sha);
  UniqueFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!out.valid()) return ErrnoToStatus(errno, absl::StrCat("bundle import: create ", path));
  auto read = [this](char* buffer, size_t size) { return tar_.Read(buffer, size); };
  CUBIST_ASSIGN_OR_RETURN(HashedCopy copy, CopyHashing(read, out.get(), chunk, "", path));
  if (copy.sha256 != sha) {
    return absl::DataLossError(absl::StrCat(
        name_, ": member ", m_.name, " hashes to ", copy.sha256,
        "; the bundle was altered or damaged: nothing was imported; copy it again"));
  }
  report_.bytes += m_.size;
  return absl::OkStatus();
}

// Everything the manifests name must be here or already cached.
absl::Status BundleImport::CheckComplete() const {
  for (const PendingManifest& p : manifests_) {
    for (const Artifact& a : p.manifest.artifacts) {
      if (!staged_.contains(a.sha256) &&
          store_.Probe(a.sha256, a.size) != ObjectState::kPresent) {
        return absl::DataLossError(absl::StrCat(
            name_, ": ", p.member, " names ", a.path, " (sha256 ", a.sha256,
            ") but the bundle does not hold it and the cache lacks it; nothing was imported"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BundleImport::Publish() {
  // Data before names: one syncfs for every staged object (an fdatasync each made the
  // import of FlashInfer's 2,127-file GEMM pin take 13.9 s), then the renames, then each
  // shard directory once.
  CUBIST_RETURN_IF_ERROR(FlushFilesystemOf(staging_, "bundle import"));
  for (const PendingManifest& p : manifests_) {
    if (Guarded(p)) {
      CUBIST_RETURN_IF_ERROR(guard_.CheckAndRecord(p.manifest, options_.trust.allow_rollback));
    }
  }
  std::set<std::string> published;
  for (const std::string& sha : staged_) {
    CUBIST_ASSIGN_OR_RETURN(FileLock lock, store_.LockObject(sha));
    if (store_.Probe(sha, std::nullopt) == ObjectState::kPresent) {
      ++report_.objects_already_cached;
      continue;
    }
    CUBIST_RETURN_IF_ERROR(store_.Publish(absl::StrCat(staging_, "/", sha), sha));
    published.insert(sha);
    ++report_.objects;
  }
  // A crash before these syncs can lose a rename, never expose partial data: the
  // object is then simply missing and a second import adds it.
  std::set<std::string> synced;
  for (const std::string& sha : published) {
    if (synced.insert(sha.substr(0, 2)).second) CUBIST_RETURN_IF_ERROR(store_.SyncObjectDir(sha));
  }
  return absl::OkStatus();
}

// Keeps each manifest in the cache (and writes it, with its signature, to
// options.manifests_dir when one is given).
absl::Status BundleImport::KeepManifests() {
  for (const PendingManifest& p : manifests_) {
    report_.manifests.push_back(p.member);
    if (!p.manifest.name.empty()) {
      CUBIST_RETURN_IF_ERROR(store_.KeepManifest(p.manifest, p.bytes));
    }
    if (!options_.manifests_dir.empty()) {
      const std::string file = p.member.substr(kManifestsDir.size());
      CUBIST_RETURN_IF_ERROR(MakeDirs(options_.manifests_dir));
      const std::string out = absl::StrCat(options_.manifests_dir, "/", file);
      CUBIST_RETURN_IF_ERROR(WriteFileAtomically(out, p.bytes, 0644));
      if (p.signature.has_value()) {
        CUBIST_RETURN_IF_ERROR(WriteFileAtomically(out + ".sig", *p.signature, 0644));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BundleReport> CreateBundle(const Store& store,
                                          const std::vector<BundleInput>& inputs,
                                          const std::string& output) {
  CUBIST_ASSIGN_OR_RETURN(auto objects, CollectBundleObjects(store, inputs));
  std::string temp_path = absl::StrCat(output, ".tmp-XXXXXX");
  UniqueFd fd(::mkstemp(temp_path.data()));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("bundle: create ", temp_path));
  RemoveOnExit temp(temp_path);
  std::string buffer;  // small writes gathered into large ones
  auto flush = [&]() -> absl::Status {
    CUBIST_RETURN_IF_ERROR(WriteAll(fd.get(), buffer, "", temp_path));
    buffer.clear();
    return absl::OkStatus();
  };
  TarWriter tar([&](std::string_view bytes) -> absl::Status {
    buffer.append(bytes.data(), bytes.size());
    if (buffer.size() >= kCopyBuffer) return flush();
    return absl::OkStatus();
  });

  BundleReport report;
  CUBIST_RETURN_IF_ERROR(AppendMember(tar, kMarkerMember, kBundleMarker));
  for (const BundleInput& in : inputs) {
    const std::string name = absl::StrCat(Sv(kManifestsDir), MemberFile(in.manifest, in.bytes));
    CUBIST_RETURN_IF_ERROR(AppendMember(tar, name, in.bytes));
    report.manifests.push_back(name);
    if (in.signature.has_value()) {
      CUBIST_RETURN_IF_ERROR(AppendMember(tar, name + ".sig", *in.signature));
    }
  }
  std::vector<char> chunk(kCopyBuffer);
  for (const auto& [sha, size] : objects) {
    CUBIST_RETURN_IF_ERROR(AppendObject(store, sha, size, tar, chunk));
    ++report.objects;
    report.bytes += size;
  }
  CUBIST_RETURN_IF_ERROR(tar.Finish());
  CUBIST_RETURN_IF_ERROR(flush());
  CUBIST_RETURN_IF_ERROR(CommitBundle(fd.get(), temp, output));
  return report;
}

absl::StatusOr<BundleReport> ImportBundle(const Store& store, const std::string& bundle,
                                          const ImportBundleOptions& options) {
  UniqueFd fd(::open(bundle.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, absl::StrCat("bundle import: open ", bundle));
  return ImportBundleFrom(store, FdSource(fd.get(), absl::StrCat("bundle import: read ", bundle)),
                          bundle, options);
}

absl::StatusOr<BundleReport> ImportBundleFrom(const Store& store, ByteSource source,
                                              const std::string& name,
                                              const ImportBundleOptions& options) {
  BundleImport import(store, std::move(source), name, options);
  CUBIST_RETURN_IF_ERROR(import.ReadMarker());
  CUBIST_RETURN_IF_ERROR(import.ReadManifests());
  CUBIST_RETURN_IF_ERROR(import.CheckManifests());
  CUBIST_RETURN_IF_ERROR(import.GuardAndLease());
  CUBIST_RETURN_IF_ERROR(import.CreateStaging());
  CUBIST_RETURN_IF_ERROR(import.StageObjects());
  CUBIST_RETURN_IF_ERROR(import.CheckComplete());
  CUBIST_RETURN_IF_ERROR(import.Publish());
  CUBIST_RETURN_IF_ERROR(import.KeepManifests());
  return import.report();
}

}  // namespace cubist
