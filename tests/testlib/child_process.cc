#include "tests/testlib/child_process.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "tests/test_util.h"

namespace cubist::testing {

pid_t SpawnCli(const std::vector<std::string>& args, const std::string& log) {
  // Everything the child needs is built before fork(): only async-signal-safe calls
  // may follow it in a multithreaded parent (the fault server runs threads).
  std::vector<std::string> all = {CliPath()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
  }
  ::execv(argv[0], argv.data());
  ::_exit(127);
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

}  // namespace cubist::testing
