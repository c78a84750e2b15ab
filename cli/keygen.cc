// `cubist keygen`: makes an Ed25519 signing key pair for `cubist sign`.
//   cubist keygen [-o KEY.pem] [--force]   writes KEY.pem (private, 0600) and KEY.pub
//   cubist keygen --public-of KEY.pem      prints the public key of an existing key
// The public key line ("ed25519:<base64>") is what users put in --trusted-key, a
// trusted keys file or CUBIST_TRUSTED_KEYS; it is printed last on stdout.
#include <openssl/crypto.h>
#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "cli/command.h"
#include "cli/exit_codes.h"
#include "manifest/signature.h"

namespace cubist::cli {
namespace {

struct KeygenOptions {
  std::string out = "cubist-signing-key.pem";
  std::string public_of;
  bool force = false;
};

// KEY.pem -> KEY.pub; anything else gets ".pub" appended.
std::string PublicPathFor(const std::string& private_path) {
  std::string stem = private_path;
  if (absl::EndsWith(stem, ".pem")) stem.resize(stem.size() - 4);
  return stem + ".pub";
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

absl::StatusOr<PrivateKey> ReadPrivateKey(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFileToString(path, 64 * 1024);
  if (!pem.ok()) return Annotate(pem.status(), "signing key");
  absl::StatusOr<PrivateKey> key = PrivateKey::FromPem(*pem);
  OPENSSL_cleanse(pem->data(), pem->size());
  if (!key.ok()) return Annotate(key.status(), path);
  return key;
}

void PrintPublic(const PublicKey& pub, const Globals& g) {
  if (!g.quiet) std::printf("key id:      %s\n", pub.Id().c_str());
  std::printf("%s\n", pub.ToString().c_str());
}

absl::Status RunKeygen(const KeygenOptions& o, const Globals& g) {
  if (!o.public_of.empty()) {
    CUBIST_ASSIGN_OR_RETURN(PrivateKey key, ReadPrivateKey(o.public_of));
    PrintPublic(key.public_key(), g);
    return absl::OkStatus();
  }
  std::string pub_path = PublicPathFor(o.out);
  for (const std::string& p : {o.out, pub_path}) {
    if (!o.force && Exists(p)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "keygen: ", p, " already exists; choose another name with -o, or pass --force "
                         "to replace it (a replaced private key is gone for good)"));
    }
  }
  CUBIST_ASSIGN_OR_RETURN(PrivateKey key, PrivateKey::Generate());
  CUBIST_ASSIGN_OR_RETURN(std::string pem, key.ToPem());
  // Written 0600 from the first byte: the temporary file is created with that mode.
  absl::Status s = WriteFileAtomically(o.out, pem, 0600);
  OPENSSL_cleanse(pem.data(), pem.size());
  CUBIST_RETURN_IF_ERROR(Annotate(s, "keygen: private key"));
  PublicKey pub = key.public_key();
  CUBIST_RETURN_IF_ERROR(Annotate(
      WriteFileAtomically(pub_path,
                          absl::StrCat(pub.ToString(), "  # cubist key ", pub.Id(), "\n"),
                          0644),
      "keygen: public key"));
  if (!g.quiet) {
    std::printf("private key: %s (mode 0600; keep it secret, it signs manifests)\n",
                o.out.c_str());
    std::printf("public key:  %s (give it to users: --trusted-key %s)\n",
                pub_path.c_str(), pub_path.c_str());
  }
  PrintPublic(pub, g);
  return absl::OkStatus();
}

}  // namespace

void RegisterKeygen(CLI::App& app, Globals& g) {
  auto opts = std::make_shared<KeygenOptions>();
  CLI::App* cmd = app.add_subcommand(
      "keygen", "Make an Ed25519 key pair for signing manifests ('cubist sign')");
  cmd->add_option("-o,--out", opts->out,
                  "Private key file to write (PEM, mode 0600); the public key goes to "
                  "the same name with .pub instead of .pem")
      ->capture_default_str();
  cmd->add_flag("--force", opts->force, "Replace existing key files");
  cmd->add_option("--public-of", opts->public_of,
                  "Print the public key of this existing private key and exit")
      ->type_name("KEY.pem");
  cmd->add_flag("-q,--quiet", g.quiet, "Print only the public key");
  cmd->callback([opts, &g] {
    absl::Status s = RunKeygen(*opts, g);
    if (!s.ok()) g.exit_code = PrintError(s);
  });
}

}  // namespace cubist::cli
