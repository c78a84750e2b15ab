// Child processes of the tests: a shell command run to completion (RunCommand), the
// `cubist` command started as a child the test can watch, signal and measure
// (SpawnCli), and servers the tests start and stop (ServerProcess).
#ifndef CUBIST_TESTS_TESTLIB_CHILD_PROCESS_H_
#define CUBIST_TESTS_TESTLIB_CHILD_PROCESS_H_

#include <sys/resource.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace cubist::testing {

// Runs a shell command; returns its exit status (0-255, or 128+signal) and captures
// stdout and stderr together into *output when given.
int RunCommand(const std::string& command, std::string* output = nullptr);

// Starts CliPath() with `args` (no shell), stdout and stderr both to the file `log`.
// Returns the child's pid.
pid_t SpawnCli(const std::vector<std::string>& args, const std::string& log);

// Waits for `pid`; returns its exit code, or 128 + signal when it was killed (as
// RunCommand does). `usage`, when given, receives the child's resource usage (peak RSS
// in ru_maxrss, kilobytes).
int WaitChild(pid_t pid, rusage* usage = nullptr);

// A loopback TCP port that was free a moment ago (the kernel's pick), for a server
// about to be started; and whether something accepts connections on a loopback port.
int FreeLoopbackPort();
bool LoopbackPortAccepts(int port);

// A server the tests start and stop (nginx, docker-registry): `argv` runs in a process
// group of its own, stdout and stderr to the file `log` when it is not empty. Start
// polls `ready` every 10 ms, up to `polls` times; Unavailable names `name` when the
// server exits first or never gets ready (then it is stopped).
class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { Stop(); }

  absl::Status Start(const std::vector<std::string>& argv, const std::string& log,
                     const std::function<bool()>& ready, int polls, std::string_view name);
  // Start again (a port just freed may still be busy for a moment): up to 100 tries,
  // 50 ms apart. OK at once when the server runs.
  absl::Status Restart(const std::function<absl::Status()>& launch, std::string_view name);
  // SIGTERM to the group, up to 5 s for the leader to exit, then SIGKILL to the group
  // (an nginx master's workers included).
  void Stop();
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_CHILD_PROCESS_H_
