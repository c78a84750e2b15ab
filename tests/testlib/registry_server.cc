#include "tests/testlib/registry_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/testlib/child_process.h"

namespace cubist::testing {
std::string RegistryServer::BinaryPath() {
  for (const char* p : {"/usr/bin/docker-registry", "/usr/local/bin/registry", "/usr/bin/registry"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

std::string RegistryServer::HtpasswdPath() {
  for (const char* p : {"/usr/bin/htpasswd", "/usr/local/bin/htpasswd"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<RegistryServer>> RegistryServer::Start(const Options& options) {
  if (BinaryPath().empty()) {
    return absl::FailedPreconditionError(
        "docker-registry is not installed (apt-get install docker-registry)");
  }
  std::unique_ptr<RegistryServer> s(new RegistryServer());
  s->options_ = options;
  std::filesystem::create_directories(options.workdir + "/storage");
  if (!options.user.empty()) {
    if (HtpasswdPath().empty()) {
      return absl::FailedPreconditionError(
          "htpasswd is not installed (apt-get install apache2-utils)");
    }
    std::string out;
    int rc = RunCommand(absl::StrCat(HtpasswdPath(), " -Bbc '", options.workdir, "/htpasswd' '",
                                     options.user, "' '", options.password, "'"),
                        &out);
    if (rc != 0) return absl::InternalError("htpasswd failed: " + out);
  }
  for (int attempt = 0; attempt < 5; ++attempt) {
    s->port_ = FreeLoopbackPort();
    if (s->Launch().ok()) return s;
  }
  return absl::UnavailableError(
      absl::StrCat("docker-registry did not start; see ", options.workdir, "/registry.log"));
}

absl::Status RegistryServer::Launch() {
  const std::string& w = options_.workdir;
  std::ostringstream c;
  c << "version: 0.1\n"
    << "log:\n  level: warn\n  formatter: text\n"
    << "storage:\n  filesystem:\n    rootdirectory: " << w << "/storage\n"
    << "  delete:\n    enabled: true\n"
    << "  maintenance:\n    uploadpurging:\n      enabled: false\n"
    << "http:\n  addr: 127.0.0.1:" << port_ << "\n  secret: cubist-test-secret\n";
  if (!options_.user.empty()) {
    c << "auth:\n  htpasswd:\n    realm: cubist-test\n    path: " << w << "/htpasswd\n";
  }
  c << options_.extra_config;
  std::string config = w + "/config.yml";
  {
    std::ofstream f(config);
    f << c.str();
  }
  std::string log = w + "/registry.log";
  return process_.Start({BinaryPath(), "serve", config}, log,
                        [this] { return LoopbackPortAccepts(port_); }, 1000, "docker-registry");
}

absl::Status RegistryServer::Restart() {
  return process_.Restart([this] { return Launch(); }, "docker-registry");
}

RegistryServer::~RegistryServer() { Stop(); }

void RegistryServer::Stop() { process_.Stop(); }

std::string RegistryServer::HostPort() const { return absl::StrCat("127.0.0.1:", port_); }

std::string RegistryServer::StorageRoot() const { return options_.workdir + "/storage"; }

std::string RegistryServer::BlobDataPath(const std::string& digest) const {
  std::string hex = absl::StartsWith(digest, "sha256:") ? digest.substr(7) : digest;
  return absl::StrCat(StorageRoot(), "/docker/registry/v2/blobs/sha256/", hex.substr(0, 2), "/",
                      hex, "/data");
}

std::vector<std::string> RegistryServer::AccessLog() const {
  // Combined log format: 127.0.0.1 - - [date] "GET /v2/... HTTP/1.1" 200 123 "" "ua"
  std::ifstream f(options_.workdir + "/registry.log");
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) {
    size_t q = line.find('"');
    if (q == std::string::npos) continue;
    size_t q2 = line.find('"', q + 1);
    if (q2 == std::string::npos) continue;
    std::vector<std::string> req = absl::StrSplit(line.substr(q + 1, q2 - q - 1), ' ');
    std::vector<std::string> after =
        absl::StrSplit(line.substr(q2 + 1), ' ', absl::SkipEmpty());
    if (req.size() < 2 || after.empty()) continue;
    std::string path = req[1].substr(0, req[1].find('?'));
    out.push_back(absl::StrCat(req[0], " ", path, " ", after[0]));
  }
  return out;
}

std::map<std::string, int> RegistryServer::BlobGets() const {
  std::map<std::string, int> out;
  for (const std::string& line : AccessLog()) {
    std::vector<std::string> p = absl::StrSplit(line, ' ');
    if (p.size() != 3 || p[0] != "GET" || (p[2] != "200" && p[2] != "206")) continue;
    size_t b = p[1].find("/blobs/sha256:");
    if (b == std::string::npos) continue;
    out[p[1].substr(b + 7)]++;
  }
  return out;
}

}  // namespace cubist::testing
