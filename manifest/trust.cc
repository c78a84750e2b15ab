#include "manifest/trust.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "base/strings.h"

namespace cubist {
namespace {

std::string_view Trim(std::string_view s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

bool LooksLikeKeyText(std::string_view v) {
  return v.substr(0, 8) == "ed25519:" || v.substr(0, 11) == "-----BEGIN ";
}

absl::StatusOr<std::vector<PublicKey>> LoadKeyFile(const std::string& path,
                                                   std::string_view origin) {
  absl::StatusOr<std::string> text = ReadFileToString(path, kMaxKeyFileSize);
  if (!text.ok()) {
    return Annotate(text.status(),
                    absl::StrCat(Sv(origin), ": trusted key file ", path));
  }
  return ParseKeyFile(*text, path);
}

// One VALUE: a key string or a key file path.
absl::Status AddValue(std::string_view value, std::string_view origin,
                      std::vector<PublicKey>* out) {
  value = Trim(value);
  if (value.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(origin), ": empty; give 'ed25519:<base64>' or the path of a key file"));
  }
  if (LooksLikeKeyText(value)) {
    absl::StatusOr<PublicKey> key = PublicKey::Parse(value);
    if (!key.ok()) return Annotate(key.status(), origin);
    out->push_back(*key);
    return absl::OkStatus();
  }
  CUBIST_ASSIGN_OR_RETURN(std::vector<PublicKey> keys,
                          LoadKeyFile(std::string(value), origin));
  out->insert(out->end(), keys.begin(), keys.end());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<PublicKey>> ParseKeyFile(std::string_view text,
                                                    std::string_view source) {
  std::vector<PublicKey> keys;
  std::vector<absl::string_view> lines = absl::StrSplit(Sv(text), '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = Trim(Sv(lines[i]));
    size_t line_no = i + 1;
    if (line.empty() || line[0] == '#') continue;
    if (line.substr(0, 11) == "-----BEGIN ") {
      // Collect the PEM block through its END line and let OpenSSL parse it.
      std::string block;
      size_t j = i;
      for (; j < lines.size(); ++j) {
        absl::StrAppend(&block, lines[j], "\n");
        if (Trim(Sv(lines[j])).substr(0, 9) == "-----END ") break;
      }
      if (j == lines.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Sv(source), ":", line_no, ": PEM block without an -----END line"));
      }
      absl::StatusOr<PublicKey> key = PublicKey::Parse(block);
      if (!key.ok()) {
        return Annotate(key.status(), absl::StrCat(Sv(source), ":", line_no));
      }
      keys.push_back(*key);
      i = j;
      continue;
    }
    // "ed25519:<base64>" optionally followed by whitespace and a comment.
    std::string_view token = line.substr(0, line.find_first_of(" \t"));
    std::string_view rest = Trim(line.substr(token.size()));
    if (!rest.empty() && rest[0] != '#') {
      return absl::InvalidArgumentError(absl::StrCat(
          Sv(source), ":", line_no,
          ": expected one key per line ('ed25519:<base64>', optionally followed by "
          "'# comment')"));
    }
    absl::StatusOr<PublicKey> key = PublicKey::Parse(token);
    if (!key.ok()) return Annotate(key.status(), absl::StrCat(Sv(source), ":", line_no));
    keys.push_back(*key);
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(source), ": no keys in the trusted key file; add 'ed25519:<base64>' lines "
                    "(the .pub file 'cubist keygen' writes)"));
  }
  return keys;
}

absl::StatusOr<std::vector<PublicKey>> LoadTrustedKeys(const TrustSources& sources) {
  std::vector<PublicKey> keys;
  for (const std::string& v : sources.keys) {
    CUBIST_RETURN_IF_ERROR(AddValue(v, "--trusted-key", &keys));
  }
  for (const std::string& f : sources.key_files) {
    CUBIST_ASSIGN_OR_RETURN(std::vector<PublicKey> k,
                            LoadKeyFile(f, "--trusted-keys-file"));
    keys.insert(keys.end(), k.begin(), k.end());
  }
  std::string env;
  if (sources.env.has_value()) {
    env = *sources.env;
  } else if (const char* e = std::getenv(kTrustedKeysEnv)) {
    env = e;
  }
  int entry = 0;
  for (absl::string_view v :
       absl::StrSplit(env, absl::ByAnyChar(",; \t\n"), absl::SkipEmpty())) {
    ++entry;
    CUBIST_RETURN_IF_ERROR(
        AddValue(Sv(v), absl::StrCat(kTrustedKeysEnv, " entry ", entry), &keys));
  }
  // The same key named twice (flag and environment) is one key.
  std::vector<PublicKey> unique;
  for (const PublicKey& k : keys) {
    if (std::find(unique.begin(), unique.end(), k) == unique.end()) unique.push_back(k);
  }
  return unique;
}

std::string SignatureLocation(std::string_view manifest_location) {
  return absl::StrCat(Sv(manifest_location), ".sig");
}

absl::Status CheckManifestSignature(std::string_view manifest_bytes,
                                    const std::optional<std::string>& signature_file,
                                    const TrustPolicy& policy, std::string_view source) {
  if (policy.trusted_keys.empty()) return absl::OkStatus();
  if (!signature_file.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat(
        Sv(source), ": unsigned manifest: ", SignatureLocation(source),
        " does not exist and ", policy.trusted_keys.size(),
        " trusted key(s) are configured; ask the publisher to sign it ('cubist sign'), "
        "or run without trusted keys (no --trusted-key, no ", kTrustedKeysEnv,
        ") to accept unsigned manifests"));
  }
  return VerifyDetachedSignature(manifest_bytes, *signature_file, policy.trusted_keys,
                                 SignatureLocation(source));
}

absl::Status CheckManifestExpiry(const Manifest& manifest, const TrustPolicy& policy,
                                 absl::Time now) {
  if (!manifest.expires.has_value() || *manifest.expires > now) return absl::OkStatus();
  if (policy.allow_expired) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      Sv(manifest.source.empty() ? std::string_view("manifest") : manifest.source),
      ": manifest '", manifest.name, "' version ", manifest.version, " expired at ",
      absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", *manifest.expires, absl::UTCTimeZone()),
      " (now ", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", now, absl::UTCTimeZone()),
      "); fetch a fresh manifest from the publisher, or pass --allow-expired to use it "
      "deliberately"));
}

}  // namespace cubist
