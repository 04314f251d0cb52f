#include "trainer/dist/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <thread>

#include "trainer/dist/rank_env.h"

extern char** environ;

namespace llmctl::dist {
namespace {

// Exit code of a rank whose program could not be executed (as a shell reports it).
constexpr int kCannotExecute = 127;
constexpr auto kPollInterval = std::chrono::milliseconds(20);

// This process's environment without the variables a rank gets its own value of.
std::vector<std::string> InheritedEnvironment(const std::vector<std::string>& rank_variables) {
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    bool replaced = false;
    for (const std::string& variable : rank_variables) {
      const std::string_view name(variable.data(), variable.find('=') + 1);
      if (text.starts_with(name)) replaced = true;
    }
    if (!replaced) environment.emplace_back(text);
  }
  return environment;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings) pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// In the forked child: only async-signal-safe calls until execve.
[[noreturn]] void ExecRank(pid_t launcher, char* const* argv, char* const* envp) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(kCannotExecute);  // the launcher died before prctl
  ::execve(argv[0], argv, envp);
  static constexpr char kMessage[] = "cannot execute the rank's program: ";
  (void)!::write(2, kMessage, sizeof(kMessage) - 1);
  const char* reason = ::strerror(errno);
  (void)!::write(2, reason, ::strlen(reason));
  (void)!::write(2, "\n", 1);
  ::_exit(kCannotExecute);
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return std::string("was killed by signal ") + std::to_string(signal) + " (" +
           ::strsignal(signal) + ")";
  }
  const int code = WEXITSTATUS(status);
  if (code == kCannotExecute) return "could not execute its program (exit code 127)";
  return "exited with code " + std::to_string(code);
}

}  // namespace

Status LaunchRanks(const LaunchSpec& spec) {
  if (spec.argv.empty()) return InvalidArgumentError("no program to launch");
  if (spec.world_size < 1) {
    return InvalidArgumentError("world size " + std::to_string(spec.world_size) +
                                " must be at least 1");
  }
  std::vector<std::string> argv = spec.argv;
  std::vector<char*> argv_c = CStrings(argv);
  // Built before forking: the child may not allocate.
  std::vector<std::vector<std::string>> environments;
  for (int rank = 0; rank < spec.world_size; ++rank) {
    RankEnv env;
    env.rank = rank;
    env.local_rank = rank;
    env.world_size = spec.world_size;
    env.local_world_size = spec.world_size;
    env.master_addr = spec.master_addr;
    env.master_port = spec.master_port;
    const std::vector<std::string> variables = RankEnvVariables(env);
    std::vector<std::string> environment = InheritedEnvironment(variables);
    environment.insert(environment.end(), variables.begin(), variables.end());
    environments.push_back(std::move(environment));
  }

  const pid_t launcher = ::getpid();
  std::vector<pid_t> pids(spec.world_size, -1);  // -1: not started, or reaped
  std::optional<Status> failure;
  for (int rank = 0; rank < spec.world_size && !failure; ++rank) {
    std::vector<char*> envp = CStrings(environments[rank]);
    const pid_t pid = ::fork();
    if (pid == 0) ExecRank(launcher, argv_c.data(), envp.data());
    if (pid < 0) {
      failure = UnavailableError("cannot start rank " + std::to_string(rank) +
                                 ": fork: " + std::strerror(errno));
    } else {
      pids[rank] = pid;
    }
  }

  // Poll every rank: the first to end otherwise than with 0 fails the job.
  auto kill_at = std::chrono::steady_clock::time_point::max();
  const auto stop_others = [&] {
    for (pid_t pid : pids) {
      if (pid > 0) ::kill(pid, SIGTERM);
    }
    kill_at = std::chrono::steady_clock::now() + spec.stop_grace;
  };
  if (failure) stop_others();
  int running = 0;
  for (pid_t pid : pids) running += pid > 0 ? 1 : 0;
  while (running > 0) {
    for (int rank = 0; rank < spec.world_size; ++rank) {
      if (pids[rank] <= 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids[rank], &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) continue;
      pids[rank] = -1;
      --running;
      const bool ok = done > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && !failure) {
        failure = Status(StatusCode::kAborted,
                         "rank " + std::to_string(rank) + " of " + std::to_string(spec.world_size) +
                             " " + (done > 0 ? DescribeExit(status) : "could not be waited for") +
                             "; the other ranks were stopped");
        stop_others();
      }
    }
    if (running == 0) break;
    if (std::chrono::steady_clock::now() >= kill_at) {
      for (pid_t pid : pids) {
        if (pid > 0) ::kill(pid, SIGKILL);
      }
      kill_at = std::chrono::steady_clock::time_point::max();
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  return failure.value_or(Status::Ok());
}

}  // namespace llmctl::dist
