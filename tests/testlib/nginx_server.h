// A real nginx on a free loopback port, for integration tests and benchmarks. The test
// command installs nginx (scripts/install-deps); tests GTEST_SKIP when it is absent.
#ifndef CUBIST_TESTS_TESTLIB_NGINX_SERVER_H_
#define CUBIST_TESTS_TESTLIB_NGINX_SERVER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/testlib/child_process.h"

namespace cubist::testing {

class NginxServer {
 public:
  struct Options {
    std::string root;          // directory served at /
    std::string workdir;       // config, logs, pid; created
    std::string limit_rate;    // e.g. "200k": slows every response (for kill tests)
    int workers = 1;
    // Raw configuration added to the http block and to the server block (a
    // proxy_cache_path / locations that proxy to an origin, for site-cache tests).
    std::string http_extra;
    std::string server_extra;
    // HTTPS instead of HTTP: the server's certificate and key (PEM), as MakeTestTls
    // writes them. BaseUrl is then "https://localhost:<port>/".
    std::string tls_cert;
    std::string tls_key;
  };

  // The nginx binary, or "" when none is installed.
  static std::string BinaryPath();
  // Starts nginx and waits until it accepts connections.
  static absl::StatusOr<std::unique_ptr<NginxServer>> Start(const Options& options);
  ~NginxServer();

  int port() const { return port_; }
  std::string BaseUrl() const;  // "http://127.0.0.1:<port>/" (https://localhost with TLS)
  // Stops it (SIGTERM, then SIGKILL after 5 s) and waits. Idempotent.
  void Stop();
  // Starts it again on the same port (after Stop).
  absl::Status Restart();

  // Lines of the access log: "<method> <uri> <status> <bytes> <range>".
  std::vector<std::string> AccessLog() const;
  // How many times each URI was answered with a 2xx status.
  std::map<std::string, int> SuccessfulRequests() const;

 private:
  NginxServer() = default;
  absl::Status Launch();
  Options options_;
  std::string config_;
  int port_ = 0;
  ServerProcess process_;
};

// A private CA and a server certificate it signed for `host` (a DNS name), made with
// the openssl command in `dir`: ca.pem (what a client adds to trust the server),
// server.pem and server.key (for NginxServer::Options).
struct TestTls {
  std::string ca;
  std::string cert;
  std::string key;
};
absl::StatusOr<TestTls> MakeTestTls(const std::string& dir, const std::string& host = "localhost");

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_NGINX_SERVER_H_
