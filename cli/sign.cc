// `cubist sign`: detached Ed25519 signatures over a manifest's exact bytes.
//   cubist sign MANIFEST --key KEY.pem [-o SIG] [--append]
//       writes MANIFEST.sig (or SIG) atomically; --append keeps the lines of other keys
//       already there (signing with an old and a new key during a key rotation)
//   cubist sign --check MANIFEST [--trusted-key K]...
//       verifies MANIFEST.sig against the trusted keys, as `fetch` would
// Formats: manifest/signature.h and docs/reliability.md.
#include <openssl/crypto.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "cli/trust_flags.h"
#include "manifest/signature.h"
#include "manifest/trust.h"

namespace cubist::cli {
namespace {

// A manifest of a million kernels is about 400 MB; anything larger is not a manifest.
constexpr uint64_t kMaxManifestBytes = uint64_t{1} << 30;

struct SignOptions {
  std::string manifest;
  std::string key;
  std::string out;
  bool append = false;
  bool check = false;
  report::TrustSpec trust;
};

absl::Status Check(const SignOptions& o, const std::string& sig_path, const Globals& g) {
  CUBIST_ASSIGN_OR_RETURN(TrustPolicy policy, o.trust.Policy());
  if (policy.trusted_keys.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sign --check: no trusted keys; pass --trusted-key KEY|FILE or set ",
        kTrustedKeysEnv));
  }
  CUBIST_ASSIGN_OR_RETURN(std::string bytes,
                          ReadFileToString(o.manifest, kMaxManifestBytes));
  absl::StatusOr<std::string> sig = ReadFileToString(sig_path, kMaxSignatureFileSize);
  std::optional<std::string> sig_opt;
  if (sig.ok()) {
    sig_opt = *std::move(sig);
  } else if (sig.status().code() != absl::StatusCode::kNotFound) {
    return sig.status();
  }
  if (!sig_opt.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat(
        o.manifest, ": unsigned manifest: ", sig_path,
        " does not exist; sign it with 'cubist sign ", o.manifest, " --key KEY.pem'"));
  }
  CUBIST_RETURN_IF_ERROR(
      VerifyDetachedSignature(bytes, *sig_opt, policy.trusted_keys, sig_path));
  if (!g.quiet) std::printf("%s: good signature (%s)\n", o.manifest.c_str(), sig_path.c_str());
  return absl::OkStatus();
}

absl::Status Sign(const SignOptions& o, const std::string& sig_path, const Globals& g) {
  if (o.key.empty()) {
    return absl::InvalidArgumentError(
        "sign: no signing key; pass --key KEY.pem (make one with 'cubist keygen')");
  }
  CUBIST_ASSIGN_OR_RETURN(std::string bytes,
                          ReadFileToString(o.manifest, kMaxManifestBytes));
  absl::StatusOr<std::string> pem = ReadFileToString(o.key, 64 * 1024);
  if (!pem.ok()) return Annotate(pem.status(), "sign: signing key");
  absl::StatusOr<PrivateKey> key = PrivateKey::FromPem(*pem);
  OPENSSL_cleanse(pem->data(), pem->size());
  if (!key.ok()) return Annotate(key.status(), o.key);
  CUBIST_ASSIGN_OR_RETURN(Ed25519Signature sig, key->Sign(bytes));
  PublicKey pub = key->public_key();
  // Check what was just made: a key damaged in memory or on disk must not produce a
  // signature file that every user then refuses.
  if (!pub.Verify(bytes, sig)) {
    return absl::InternalError("sign: the new signature does not verify; key damaged?");
  }

  std::string text = "# cubist signature (Ed25519) of the exact bytes of the manifest\n";
  if (o.append) {
    absl::StatusOr<std::string> old = ReadFileToString(sig_path, kMaxSignatureFileSize);
    if (old.ok()) {
      absl::StatusOr<std::vector<SignatureLine>> lines = ParseSignatureFile(*old, sig_path);
      if (!lines.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sign --append: ", lines.status().message(),
            "; or sign without --append to replace the file"));
      }
      for (const SignatureLine& line : *lines) {
        if (line.key_id != pub.Id()) text += FormatSignatureLine(line);
      }
    } else if (old.status().code() != absl::StatusCode::kNotFound) {
      return old.status();
    }
  }
  text += FormatSignatureLine(pub, sig);
  CUBIST_RETURN_IF_ERROR(Annotate(WriteFileAtomically(sig_path, text, 0644), "sign"));
  if (!g.quiet) {
    std::printf("%s: signed by key %s -> %s\n", o.manifest.c_str(), pub.Id().c_str(),
                sig_path.c_str());
  }
  return absl::OkStatus();
}

}  // namespace

void RegisterSign(CLI::App& app, Globals& g) {
  auto opts = std::make_shared<SignOptions>();
  CLI::App* cmd = app.add_subcommand(
      "sign", "Write a detached Ed25519 signature of a manifest (MANIFEST.sig), or check one");
  cmd->add_option("manifest", opts->manifest, "The manifest file to sign or check")
      ->required()
      ->type_name("MANIFEST");
  cmd->add_option("-k,--key", opts->key, "Private signing key (from 'cubist keygen')")
      ->type_name("KEY.pem");
  cmd->add_option("-o,--out", opts->out, "Signature file; default MANIFEST.sig")
      ->type_name("SIG");
  cmd->add_flag("--append", opts->append,
                "Keep the signatures of other keys already in the file (key rotation)");
  cmd->add_flag("--check", opts->check,
                "Verify the signature against the trusted keys instead of signing");
  AddTrustFlags(cmd, &opts->trust, /*overrides=*/false);
  cmd->add_flag("-q,--quiet", g.quiet, "Print nothing on success");
  cmd->callback([opts, &g] {
    std::string sig_path = opts->out.empty() ? SignatureLocation(opts->manifest) : opts->out;
    absl::Status s = opts->check ? Check(*opts, sig_path, g) : Sign(*opts, sig_path, g);
    if (!s.ok()) g.exit_code = PrintError(s);
  });
}

}  // namespace cubist::cli
