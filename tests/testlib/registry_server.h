// A real OCI registry (Debian's docker-registry: distribution 2.8) on a free loopback
// port, for integration tests and benchmarks. scripts/install-deps installs it; tests
// GTEST_SKIP when it is absent. The binary is run directly with a config file of its
// own (never the system service).
#ifndef CUBIST_TESTS_TESTLIB_REGISTRY_SERVER_H_
#define CUBIST_TESTS_TESTLIB_REGISTRY_SERVER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/testlib/child_process.h"

namespace cubist::testing {

class RegistryServer {
 public:
  struct Options {
    std::string workdir;  // config, storage, log; created
    // With a user: htpasswd (basic) authentication; the bcrypt hash is made with
    // apache2-utils' htpasswd.
    std::string user;
    std::string password;
    // Raw top-level YAML appended to the config (a `middleware:` section, say).
    std::string extra_config;
  };

  // The registry binary, or "" when none is installed.
  static std::string BinaryPath();
  // The htpasswd tool (apache2-utils), or "".
  static std::string HtpasswdPath();
  static absl::StatusOr<std::unique_ptr<RegistryServer>> Start(const Options& options);
  ~RegistryServer();

  int port() const { return port_; }
  std::string HostPort() const;       // "127.0.0.1:<port>"
  std::string StorageRoot() const;    // the filesystem driver's root
  // The path of a blob's data file in the storage ("sha256:<hex>" or "<hex>").
  std::string BlobDataPath(const std::string& digest) const;
  void Stop();                // SIGTERM, then SIGKILL after 5 s; idempotent
  absl::Status Restart();     // on the same port, after Stop

  // Access-log lines: "<METHOD> <path> <status>".
  std::vector<std::string> AccessLog() const;
  // How many GETs of each blob digest were answered 200 or 206.
  std::map<std::string, int> BlobGets() const;

 private:
  RegistryServer() = default;
  absl::Status Launch();
  Options options_;
  int port_ = 0;
  ServerProcess process_;
};

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_REGISTRY_SERVER_H_
