#include "artifacts/version_guard.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "artifacts/file_lock.h"
#include "base/file_util.h"
#include "base/sha256.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"
#include "manifest/manifest.h"

namespace cubist {
namespace {

constexpr char kStateHeader[] = "cubist.version-state/1";
constexpr size_t kMaxStateFile = 4096;

bool IsPlain(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-';
}

// Percent-encoding, total and reversible; also how the name is written inside the
// state file, so that a newline in a name cannot forge a line.
std::string EscapeName(std::string_view name) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (IsPlain(c) && !(i == 0 && c == '.')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    }
  }
  if (out.empty()) out = "%";  // the empty name still needs a file name
  return out;
}

// Reads the state file without following a symlink: a link planted in the cache must
// not make cubist read (or trust) a record elsewhere.
absl::StatusOr<std::optional<std::string>> ReadState(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    if (errno == ENOENT) return std::optional<std::string>();
    if (errno == ELOOP) {
      return absl::DataLossError(absl::StrCat(
          path, ": rollback state is a symlink, not a file cubist wrote; remove it (this "
                "resets rollback protection for that manifest name)"));
    }
    return ErrnoToStatus(errno, absl::StrCat("read rollback state ", path));
  }
  std::string out;
  char buf[1024];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, absl::StrCat("read rollback state ", path));
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > kMaxStateFile) break;  // Parse rejects it; memory stays bounded
  }
  return std::optional<std::string>(std::move(out));
}

absl::StatusOr<VersionRecord> ParseState(std::string_view text, const std::string& path,
                                         std::string_view want_name) {
  auto corrupt = [&](std::string_view why) {
    return absl::DataLossError(absl::StrCat(
        path, ": corrupt rollback state (", Sv(why),
        "); remove the file to reset rollback protection for '", Sv(want_name), "'"));
  };
  if (text.size() > kMaxStateFile) return corrupt("too large");
  std::vector<absl::string_view> lines =
      absl::StrSplit(Sv(text), '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kStateHeader) return corrupt("bad header");
  VersionRecord rec;
  bool have_name = false, have_version = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(lines[i], absl::MaxSplits(' ', 1));
    if (kv.first == "name") {
      rec.name = std::string(kv.second);
      have_name = true;
    } else if (kv.first == "version") {
      if (!absl::SimpleAtoi(kv.second, &rec.version) || rec.version < 0) {
        return corrupt("bad version");
      }
      have_version = true;
    } else if (kv.first == "digest") {
      rec.digest = std::string(kv.second);
    }  // unknown keys: written by a newer cubist; ignored
  }
  if (!have_name || !have_version) return corrupt("missing name or version");
  // Two names that escape to one file would share a record; refuse rather than mix.
  if (rec.name != EscapeName(want_name)) return corrupt("it records another name");
  rec.name = std::string(want_name);
  return rec;
}

}  // namespace

std::string VersionStateFileName(std::string_view name) {
  // The encoded form, not the name, is what must fit: each escaped byte takes three.
  // Names over 200 bytes were hashed before the encoded ones were; both give the same
  // file for them.
  constexpr size_t kMaxFileName = 200;
  if (name.size() > kMaxFileName) return "sha256-" + Sha256Hex(name);
  std::string escaped = EscapeName(name);
  if (escaped.size() > kMaxFileName) return "sha256-" + Sha256Hex(name);
  return escaped;
}

std::string VersionGuard::StatePath(std::string_view name) const {
  return absl::StrCat(root_, "/state/versions/", VersionStateFileName(name));
}

std::string VersionGuard::LockPath(std::string_view name) const {
  return absl::StrCat(root_, "/locks/version-", VersionStateFileName(name), ".lock");
}

absl::StatusOr<std::optional<VersionRecord>> VersionGuard::Highest(
    std::string_view name) const {
  std::string path = StatePath(name);
  CUBIST_ASSIGN_OR_RETURN(std::optional<std::string> text, ReadState(path));
  if (!text.has_value()) return std::optional<VersionRecord>();
  CUBIST_ASSIGN_OR_RETURN(VersionRecord rec, ParseState(*text, path, name));
  return std::optional<VersionRecord>(std::move(rec));
}

absl::Status VersionGuard::Compare(const Manifest& manifest,
                                   const std::optional<VersionRecord>& rec,
                                   bool allow_rollback) const {
  if (!rec.has_value() || manifest.version >= rec->version || allow_rollback) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      manifest.source.empty() ? "manifest" : manifest.source, ": manifest '",
      manifest.name, "' version ", manifest.version, " is older than version ",
      rec->version, " already verified in this cache (rollback refused: a stale mirror "
      "or an attacker may be serving an old release); use the current manifest, or pass "
      "--allow-rollback to downgrade deliberately"));
}

absl::Status VersionGuard::Check(const Manifest& manifest, bool allow_rollback) const {
  CUBIST_ASSIGN_OR_RETURN(std::optional<VersionRecord> rec, Highest(manifest.name));
  return Compare(manifest, rec, allow_rollback);
}

absl::Status VersionGuard::CheckAndRecord(const Manifest& manifest,
                                          bool allow_rollback) const {
  CUBIST_RETURN_IF_ERROR(MakeDirs(root_ + "/locks"));
  CUBIST_RETURN_IF_ERROR(MakeDirs(root_ + "/state/versions"));
  CUBIST_ASSIGN_OR_RETURN(FileLock lock,
                          FileLock::Acquire(LockPath(manifest.name), lock_timeout_));
  // Read again under the lock: another process may have recorded a newer version
  // since any unlocked look the caller made.
  CUBIST_ASSIGN_OR_RETURN(std::optional<VersionRecord> rec, Highest(manifest.name));
  CUBIST_RETURN_IF_ERROR(Compare(manifest, rec, allow_rollback));
  if (rec.has_value() && manifest.version <= rec->version) return absl::OkStatus();
  std::string text = absl::StrCat(kStateHeader, "\nname ", EscapeName(manifest.name), "\nversion ",
                                  manifest.version, "\ndigest ", manifest.digest, "\n");
  return WriteFileAtomically(StatePath(manifest.name), text, 0644);
}

}  // namespace cubist
