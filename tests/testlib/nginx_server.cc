#include "tests/testlib/nginx_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/testlib/child_process.h"

namespace cubist::testing {
std::string NginxServer::BinaryPath() {
  for (const char* p : {"/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<NginxServer>> NginxServer::Start(const Options& options) {
  if (BinaryPath().empty()) {
    return absl::FailedPreconditionError("nginx is not installed (apt-get install nginx-light)");
  }
  std::unique_ptr<NginxServer> s(new NginxServer());
  s->options_ = options;
  std::filesystem::create_directories(options.workdir + "/tmp");
  for (int attempt = 0; attempt < 5; ++attempt) {
    s->port_ = FreeLoopbackPort();
    absl::Status st = s->Launch();
    if (st.ok()) return s;
  }
  return absl::UnavailableError(absl::StrCat("nginx did not start; see ", options.workdir,
                                             "/error.log"));
}

absl::Status NginxServer::Launch() {
  const Options& o = options_;
  std::string w = o.workdir;
  std::ostringstream c;
  if (::geteuid() == 0) c << "user root;\n";
  c << "daemon off;\n"
    << "worker_processes " << o.workers << ";\n"
    << "pid " << w << "/nginx.pid;\n"
    << "error_log " << w << "/error.log warn;\n"
    << "events { worker_connections 1024; }\n"
    << "http {\n"
    << "  log_format cubist '$request_method $uri $status $body_bytes_sent \"$http_range\"';\n"
    << "  access_log " << w << "/access.log cubist;\n"
    << "  client_body_temp_path " << w << "/tmp/body;\n"
    << "  proxy_temp_path " << w << "/tmp/proxy;\n"
    << "  fastcgi_temp_path " << w << "/tmp/fastcgi;\n"
    << "  uwsgi_temp_path " << w << "/tmp/uwsgi;\n"
    << "  scgi_temp_path " << w << "/tmp/scgi;\n"
    << "  default_type application/octet-stream;\n"
    << "  sendfile on; tcp_nopush on; tcp_nodelay on;\n"
    << "  keepalive_requests 100000; keepalive_timeout 60s;\n"
    << o.http_extra
    << "  server {\n"
    << "    listen 127.0.0.1:" << port_ << " reuseport" << (o.tls_cert.empty() ? "" : " ssl")
    << ";\n"
    << "    root " << o.root << ";\n";
  if (!o.tls_cert.empty()) {
    c << "    ssl_certificate " << o.tls_cert << ";\n"
      << "    ssl_certificate_key " << o.tls_key << ";\n";
  }
  if (!o.limit_rate.empty()) c << "    limit_rate " << o.limit_rate << ";\n";
  c << o.server_extra;
  c << "  }\n}\n";
  config_ = w + "/nginx.conf";
  {
    std::ofstream f(config_);
    f << c.str();
  }
  return process_.Start({BinaryPath(), "-q", "-p", w, "-c", config_}, "",
                        [this] { return LoopbackPortAccepts(port_); }, 500, "nginx");
}

absl::Status NginxServer::Restart() {
  return process_.Restart([this] { return Launch(); }, "nginx");
}

NginxServer::~NginxServer() { Stop(); }

void NginxServer::Stop() { process_.Stop(); }

std::string NginxServer::BaseUrl() const {
  return options_.tls_cert.empty() ? absl::StrCat("http://127.0.0.1:", port_, "/")
                                   : absl::StrCat("https://localhost:", port_, "/");
}

absl::StatusOr<TestTls> MakeTestTls(const std::string& dir, const std::string& host) {
  TestTls t{dir + "/ca.pem", dir + "/server.pem", dir + "/server.key"};
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string script = absl::StrCat(
      "set -e; mkdir -p '", dir, "'; cd '", dir, "'; ",
      "openssl req -x509 ", ec, " -keyout ca.key -out ca.pem -days 2 -subj /CN=cubist-test-ca; ",
      "openssl req ", ec, " -keyout server.key -out server.csr -subj /CN=", host, "; ",
      "printf 'subjectAltName=DNS:", host, "\\n' > ext.cnf; ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial ",
      "-out server.pem -days 2 -extfile ext.cnf");
  std::string out;
  if (RunCommand(absl::StrCat("(", script, ") 2>&1"), &out) != 0) {
    return absl::UnavailableError(absl::StrCat("openssl could not make a test CA: ", out));
  }
  return t;
}

std::vector<std::string> NginxServer::AccessLog() const {
  std::ifstream f(options_.workdir + "/access.log");
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);) out.push_back(line);
  return out;
}

std::map<std::string, int> NginxServer::SuccessfulRequests() const {
  std::map<std::string, int> out;
  for (const std::string& line : AccessLog()) {
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() >= 3 && !parts[2].empty() && parts[2][0] == '2') out[parts[1]]++;
  }
  return out;
}

}  // namespace cubist::testing
