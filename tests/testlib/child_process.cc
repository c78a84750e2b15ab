#include "tests/testlib/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/strings.h"
#include "tests/testlib/build_paths.h"

namespace cubist::testing {

namespace {

// fork + execv of `args`, stdout and stderr to `log` (opened with `log_flags`) when it
// is not empty, in a process group of its own when `own_group`. Everything the child
// needs is built before fork(): only async-signal-safe calls may follow it in a
// multithreaded parent (the fault server runs threads).
pid_t ForkExec(std::vector<std::string> args, const std::string& log, int log_flags,
               bool own_group) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (own_group) ::setpgid(0, 0);
  if (!log.empty()) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | log_flags, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
  }
  ::execv(argv[0], argv.data());
  ::_exit(127);
}

}  // namespace

pid_t SpawnCli(const std::vector<std::string>& args, const std::string& log) {
  std::vector<std::string> all = {CliPath()};
  all.insert(all.end(), args.begin(), args.end());
  return ForkExec(std::move(all), log, O_TRUNC, /*own_group=*/false);
}

int WaitChild(pid_t pid, rusage* usage) {
  int status = 0;
  rusage ru{};
  while (::wait4(pid, &status, 0, &ru) < 0) {
    if (errno != EINTR) return -1;
  }
  if (usage != nullptr) *usage = ru;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

}  // namespace

int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(0);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

bool LoopbackPortAccepts(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = Loopback(port);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

absl::Status ServerProcess::Start(const std::vector<std::string>& args,
                                  const std::string& log, const std::function<bool()>& ready,
                                  int polls, std::string_view name) {
  Stop();
  pid_ = ForkExec(args, log, O_APPEND, /*own_group=*/true);
  for (int i = 0; i < polls; ++i) {
    if (ready()) return absl::OkStatus();
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat(Sv(name), " exited at start"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Stop();
  return absl::UnavailableError(absl::StrCat(Sv(name), " did not accept connections"));
}

absl::Status ServerProcess::Restart(const std::function<absl::Status()>& launch,
                                    std::string_view name) {
  if (running()) return absl::OkStatus();
  for (int i = 0; i < 100; ++i) {
    if (launch().ok()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::UnavailableError(absl::StrCat(Sv(name), " did not restart"));
}

void ServerProcess::Stop() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGTERM);
  for (int i = 0; i < 500; ++i) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      ::kill(-pid_, SIGKILL);  // what the leader left behind (nginx's workers)
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(-pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

int RunCommand(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  int status = ::pclose(p);
  if (output != nullptr) *output = std::move(out);
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace cubist::testing
