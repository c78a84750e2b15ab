// Runs the `cubist` command as a child process the test can watch, signal and measure
// (RunCommand in test_util.h runs it to completion through a shell, without a pid).
#ifndef CUBIST_TESTS_TESTLIB_CHILD_PROCESS_H_
#define CUBIST_TESTS_TESTLIB_CHILD_PROCESS_H_

#include <sys/resource.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace cubist::testing {

// Starts CliPath() with `args` (no shell), stdout and stderr both to the file `log`.
// Returns the child's pid.
pid_t SpawnCli(const std::vector<std::string>& args, const std::string& log);

// Waits for `pid`; returns its exit code, or 128 + signal when it was killed (as
// RunCommand does). `usage`, when given, receives the child's resource usage (peak RSS
// in ru_maxrss, kilobytes).
int WaitChild(pid_t pid, rusage* usage = nullptr);

}  // namespace cubist::testing

#endif  // CUBIST_TESTS_TESTLIB_CHILD_PROCESS_H_
