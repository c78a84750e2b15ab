#include "artifacts/credential_helper.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "base/strings.h"
#include "base/unique_fd.h"

extern char** environ;

namespace cubist {
namespace {

constexpr size_t kMaxOutput = 1 << 20;

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

absl::StatusOr<Pipe> MakePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoToStatus(errno, "pipe");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// The helper's own words for a message: its first line, bounded.
std::string FirstLine(std::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(Sv(text));
  t = t.substr(0, t.find('\n'));
  if (t.size() > 200) return absl::StrCat(t.substr(0, 200), "...");
  return std::string(t);
}

// Owns the child: killed and reaped on every path out of RunCredentialHelper.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  // True when the child has exited (its status in *status).
  bool TryWait(int* status) {
    pid_t r;
    while ((r = ::waitpid(pid_, status, WNOHANG)) < 0 && errno == EINTR) {
    }
    if (r != pid_) return false;
    pid_ = -1;
    return true;
  }
  int Wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_;
};

// The name becomes part of a program name searched on PATH: a word, never a path.
absl::Status CheckHelperName(std::string_view helper) {
  if (helper.empty() || helper.find_first_of("/\\ \t\n") != std::string_view::npos ||
      helper.front() == '.') {
    return absl::InvalidArgumentError(absl::StrCat(
        "credential helper name '", Sv(helper), "' is not a plain name (docker runs "
        "docker-credential-NAME from PATH); fix credHelpers/credsStore in the docker config"));
  }
  return absl::OkStatus();
}

// The helper's stdin, stdout and stderr.
struct HelperPipes {
  Pipe in;
  Pipe out;
  Pipe err;
};

// The pipes, with the server name already in stdin's and its write end closed: the name
// fits in the pipe's buffer, so a helper that never reads its stdin cannot block us or
// SIGPIPE us.
absl::StatusOr<HelperPipes> MakeHelperPipes(std::string_view server, const std::string& where) {
  auto in = MakePipe();
  if (!in.ok()) return in.status();
  auto out = MakePipe();
  if (!out.ok()) return out.status();
  auto err = MakePipe();
  if (!err.ok()) return err.status();
  if (server.size() > 4096 || ::write(in->write.get(), server.data(), server.size()) !=
                                  static_cast<ssize_t>(server.size())) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": cannot pass the server name"));
  }
  in->write.Reset();
  return HelperPipes{*std::move(in), *std::move(out), *std::move(err)};
}

// Runs `program get` from PATH on the pipes; its pid.
absl::StatusOr<pid_t> SpawnHelper(const std::string& program, std::string_view server,
                                  const std::string& where, const HelperPipes& pipes) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipes.in.read.get(), 0);
  posix_spawn_file_actions_adddup2(&actions, pipes.out.write.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, pipes.err.write.get(), 2);
  std::string arg0 = program;
  std::string arg1 = "get";
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc == ENOENT) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the docker config asks ", program, " for the credentials of ", Sv(server),
        ", but it is not on PATH; install it (or put it on PATH), or remove the entry from "
        "credHelpers/credsStore, or set CUBIST_REGISTRY_USERNAME and "
        "CUBIST_REGISTRY_PASSWORD"));
  }
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": cannot run it: ", std::strerror(rc)));
  }
  return pid;
}

absl::Status HungError(const std::string& where, absl::Duration timeout) {
  return absl::FailedPreconditionError(absl::StrCat(
      where, ": no answer within ", absl::FormatDuration(timeout),
      " (killed); a helper that asks for a password or a keychain unlock cannot run "
      "here; set CUBIST_REGISTRY_USERNAME and CUBIST_REGISTRY_PASSWORD instead"));
}

// What the helper wrote.
struct HelperOutput {
  std::string stdout_text;
  std::string stderr_text;
};

// Reads both outputs until they close, by `deadline` (now + `timeout`).
absl::StatusOr<HelperOutput> ReadUntilClosed(UniqueFd& out, UniqueFd& err, absl::Time deadline,
                                             absl::Duration timeout, const std::string& where) {
  HelperOutput text;
  while (out.valid() || err.valid()) {
    std::vector<pollfd> fds;
    if (out.valid()) fds.push_back({out.get(), POLLIN, 0});
    if (err.valid()) fds.push_back({err.get(), POLLIN, 0});
    absl::Duration left = deadline - Clock::Real().Now();
    if (left <= absl::ZeroDuration()) return HungError(where, timeout);
    int n = ::poll(fds.data(), fds.size(),
                   static_cast<int>(std::max<int64_t>(1, absl::ToInt64Milliseconds(left))));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, absl::StrCat(where, ": poll"));
    }
    for (const pollfd& p : fds) {
      if (p.revents == 0) continue;
      UniqueFd& fd = p.fd == out.get() ? out : err;
      std::string& into = p.fd == out.get() ? text.stdout_text : text.stderr_text;
      char buf[4096];
      ssize_t r = ::read(p.fd, buf, sizeof(buf));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        fd.Reset();
        continue;
      }
      if (into.size() + static_cast<size_t>(r) > kMaxOutput) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": answered more than ", kMaxOutput, " bytes"));
      }
      into.append(buf, static_cast<size_t>(r));
    }
  }
  return text;
}

// The helper's answer when it exited with `status` other than 0: "nothing stored" or the
// error it reported.
absl::StatusOr<std::optional<HelperCredentials>> FailedAnswer(int status,
                                                              const HelperOutput& text,
                                                              const std::string& where) {
  // docker-credential-helpers' answer for "nothing stored for this server".
  if (absl::StrContains(absl::AsciiStrToLower(text.stdout_text), "credentials not found") ||
      absl::StrContains(absl::AsciiStrToLower(text.stderr_text), "credentials not found")) {
    return std::nullopt;
  }
  std::string said = FirstLine(text.stderr_text.empty() ? text.stdout_text : text.stderr_text);
  return absl::FailedPreconditionError(absl::StrCat(
      where, ": ",
      WIFEXITED(status) ? absl::StrCat("exited with status ", WEXITSTATUS(status))
                        : absl::StrCat("killed by signal ", WTERMSIG(status)),
      said.empty() ? "" : ": ", said,
      "; log in again with the tool that manages it (docker login), or set "
      "CUBIST_REGISTRY_USERNAME and CUBIST_REGISTRY_PASSWORD"));
}

// The protocol's JSON answer ({"Username": ..., "Secret": ...}) of a helper that exited 0.
absl::StatusOr<std::optional<HelperCredentials>> ParseAnswer(const std::string& stdout_text,
                                                             const std::string& program,
                                                             const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(stdout_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("Secret") || !j["Secret"].is_string() ||
      (j.contains("Username") && !j["Username"].is_string())) {
    // Never quote the answer: it may hold the secret.
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the answer is not the helper protocol's JSON ({\"Username\": ..., "
        "\"Secret\": ...}); check that ", program, " is a docker credential helper"));
  }
  HelperCredentials c;
  c.username = j.value("Username", "");
  c.secret = j["Secret"].get<std::string>();
  if (c.username == "<token>") {
    // An identity token (OAuth2 refresh token) wants the registry's OAuth2 token
    // exchange, which cubist does not speak.
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the helper holds an identity token, not a user name and password; "
        "cubist logs in with user names and passwords (basic or the registry token "
        "flow); set CUBIST_REGISTRY_USERNAME and CUBIST_REGISTRY_PASSWORD"));
  }
  if (c.username.empty() && c.secret.empty()) return std::nullopt;
  return c;
}

}  // namespace

absl::StatusOr<std::optional<HelperCredentials>> RunCredentialHelper(
    std::string_view helper, std::string_view server, absl::Duration timeout) {
  CUBIST_RETURN_IF_ERROR(CheckHelperName(helper));
  const std::string program = absl::StrCat("docker-credential-", Sv(helper));
  const std::string where = absl::StrCat("credential helper ", program, " (for ", Sv(server), ")");
  CUBIST_ASSIGN_OR_RETURN(HelperPipes pipes, MakeHelperPipes(server, where));
  CUBIST_ASSIGN_OR_RETURN(pid_t pid, SpawnHelper(program, server, where, pipes));
  Child child(pid);  // killed and reaped on every path out of here
  pipes.in.read.Reset();
  pipes.out.write.Reset();
  pipes.err.write.Reset();

  // Read both outputs until they close and the helper exits, within the deadline.
  const absl::Time deadline = Clock::Real().Now() + timeout;
  CUBIST_ASSIGN_OR_RETURN(
      HelperOutput text,
      ReadUntilClosed(pipes.out.read, pipes.err.read, deadline, timeout, where));
  int status = 0;
  while (!child.TryWait(&status)) {  // closed its outputs, but may not have exited yet
    if (Clock::Real().Now() >= deadline) return HungError(where, timeout);
    Clock::Real().SleepFor(absl::Milliseconds(2));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return FailedAnswer(status, text, where);
  return ParseAnswer(text.stdout_text, program, where);
}

}  // namespace cubist
