#include "trainer/dist/rank_launcher.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <string_view>
#include <thread>

#include "common/atomic_file.h"
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

// OMP_NUM_THREADS for each of this host's `local_ranks` ranks when the environment does not set
// it: the CPUs this process may run on, shared out. Without it every rank would start as many
// threads as there are CPUs, and N ranks on one host would oversubscribe them N times over
// (torchrun sets 1 instead; a share keeps a CPU job's ranks using the whole machine). Ranks on
// other hosts have their own CPUs, so they do not count. Empty when the environment sets it.
std::string RankThreadsVariable(int local_ranks) {
  const char* set = std::getenv("OMP_NUM_THREADS");
  if (set != nullptr && *set != '\0') return "";
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int available = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0
                            ? CPU_COUNT(&cpus)
                            : static_cast<int>(std::thread::hardware_concurrency());
  return "OMP_NUM_THREADS=" + std::to_string(std::max(1, available / std::max(1, local_ranks)));
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

// The signal the launcher was sent last, for the wait loop to pass on to the ranks.
volatile sig_atomic_t g_forward_signal = 0;

void RecordSignal(int signal) { g_forward_signal = signal; }

// 1 when the failure is the rank's own rather than what its peers end with when a rank dies under
// them or they are stopped: killed by a signal, invalid input (2), out of memory (3), diverged (4).
int IsOwnFailure(const RankFailure& failure) {
  if (failure.signal != 0) return 1;
  return failure.exit_code >= 2 && failure.exit_code <= 4 ? 1 : 0;
}

void WriteStatusFile(const LaunchSpec& spec, uint16_t master_port, const std::vector<pid_t>& pids,
                     const std::optional<RankFailure>& failure) {
  std::string text = "{\"world_size\":" + std::to_string(spec.nnodes * spec.nproc_per_node) +
                     ",\"master_port\":" + std::to_string(master_port) +
                     ",\"nnodes\":" + std::to_string(spec.nnodes) +
                     ",\"node_rank\":" + std::to_string(spec.node_rank) +
                     ",\"nproc_per_node\":" + std::to_string(spec.nproc_per_node) + ",\"pids\":[";
  for (size_t i = 0; i < pids.size(); ++i) {
    if (i > 0) text += ',';
    text += std::to_string(pids[i]);
  }
  text += "]";
  if (failure) {
    text += ",\"first_failure\":{\"rank\":";
    text += std::to_string(failure->rank);
    text += failure->signal != 0 ? ",\"signal\":" : ",\"exit_code\":";
    text += std::to_string(failure->signal != 0 ? failure->signal : failure->exit_code);
    text += '}';
  }
  text += "}\n";
  const Status written = WriteFileAtomically(
      spec.status_file, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
  if (!written.ok()) std::cerr << "launcher: " << written.message() << std::endl;
}

Status CheckSpec(const LaunchSpec& spec) {
  if (spec.argv.empty()) return InvalidArgumentError("no program to launch");
  if (spec.nproc_per_node < 1) {
    return InvalidArgumentError("nproc_per_node " + std::to_string(spec.nproc_per_node) +
                                " must be at least 1");
  }
  if (spec.nnodes < 1 || spec.nnodes > std::numeric_limits<int>::max() / spec.nproc_per_node) {
    return InvalidArgumentError("nnodes " + std::to_string(spec.nnodes) +
                                " must be at least 1 (and nnodes x nproc_per_node an int)");
  }
  if (spec.node_rank < 0 || spec.node_rank >= spec.nnodes) {
    return InvalidArgumentError("node rank " + std::to_string(spec.node_rank) +
                                " must be 0 up to nnodes-1 (nnodes " + std::to_string(spec.nnodes) +
                                ")");
  }
  // Only the node that holds rank 0 can pick the port; the others must be told it.
  if (spec.master_port == 0 && spec.node_rank > 0) {
    return InvalidArgumentError(
        "master port 0 (a free port picked on this host) is for node rank 0 only: node rank " +
        std::to_string(spec.node_rank) + " must be given the port node rank 0's launcher chose");
  }
  return Status::Ok();
}

}  // namespace

LaunchResult Launch(const LaunchSpec& spec) {
  if (Status checked = CheckSpec(spec); !checked.ok()) return {checked, std::nullopt};
  const int local_ranks = spec.nproc_per_node;
  const int world_size = spec.nnodes * local_ranks;
  const int first_rank = spec.node_rank * local_ranks;
  // Port 0: a free port from the kernel, its listening socket handed to rank 0.
  int listen_fd = -1;
  uint16_t master_port = spec.master_port;
  if (master_port == 0) {
    auto fd = ListenOnMasterPort(0);
    if (!fd.ok()) return {fd.status(), std::nullopt};
    listen_fd = *fd;
    master_port = ListeningPort(listen_fd);
    if (master_port == 0) {
      ::close(listen_fd);
      return {UnavailableError(std::string("cannot read the rendezvous port the kernel chose: ") +
                               std::strerror(errno)),
              std::nullopt};
    }
  }
  std::vector<std::string> argv = spec.argv;
  std::vector<char*> argv_c = CStrings(argv);
  // Built before forking: the child may not allocate.
  std::vector<std::vector<std::string>> environments;
  const std::string threads = RankThreadsVariable(local_ranks);
  for (int local_rank = 0; local_rank < local_ranks; ++local_rank) {
    RankEnv env;
    env.rank = first_rank + local_rank;
    env.local_rank = local_rank;
    env.world_size = world_size;
    env.local_world_size = local_ranks;
    env.master_addr = spec.master_addr;
    env.master_port = master_port;
    // Global rank 0, the store's server: a listening socket exists only on node rank 0.
    const bool serves = env.rank == 0 && listen_fd >= 0;
    std::vector<std::string> variables = RankEnvVariables(env);
    // Filtered from every rank's inherited environment; only rank 0 gets it back, set.
    variables.push_back(std::string(kMasterListenFdVariable) + "=" +
                        (serves ? std::to_string(listen_fd) : ""));
    std::vector<std::string> environment = InheritedEnvironment(variables);
    if (serves) environment.push_back(variables.back());
    variables.pop_back();
    environment.insert(environment.end(), variables.begin(), variables.end());
    if (!threads.empty()) environment.push_back(threads);
    environments.push_back(std::move(environment));
  }

  // Signals for the ranks, passed on from the wait loop.
  g_forward_signal = 0;
  struct sigaction forward {};
  forward.sa_handler = RecordSignal;
  sigemptyset(&forward.sa_mask);
  struct sigaction previous[3];
  const int forwarded[3] = {SIGTERM, SIGINT, SIGUSR1};
  for (int i = 0; i < 3; ++i) ::sigaction(forwarded[i], &forward, &previous[i]);

  const pid_t launcher = ::getpid();
  // Indexed by local rank.
  std::vector<pid_t> pids(local_ranks, -1);  // -1: not started, or reaped
  std::vector<pid_t> started(local_ranks, -1);
  LaunchResult result;
  for (int local_rank = 0; local_rank < local_ranks && result.status.ok(); ++local_rank) {
    std::vector<char*> envp = CStrings(environments[local_rank]);
    const pid_t pid = ::fork();
    if (pid == 0) {
      // The socket is close-on-exec: rank 0 keeps it open across its exec, the others lose it.
      if (first_rank + local_rank == 0 && listen_fd >= 0) ::fcntl(listen_fd, F_SETFD, 0);
      ExecRank(launcher, argv_c.data(), envp.data());
    }
    if (pid < 0) {
      result.status =
          UnavailableError("cannot start rank " + std::to_string(first_rank + local_rank) +
                           ": fork: " + std::strerror(errno));
    } else {
      pids[local_rank] = started[local_rank] = pid;
    }
  }
  if (listen_fd >= 0) ::close(listen_fd);  // rank 0 has its own
  if (!spec.status_file.empty()) WriteStatusFile(spec, master_port, started, std::nullopt);

  // Poll every rank: the first to end otherwise than with 0 fails the job.
  auto kill_at = std::chrono::steady_clock::time_point::max();
  const auto stop_others = [&] {
    for (pid_t pid : pids) {
      if (pid > 0) ::kill(pid, SIGTERM);
    }
    kill_at = std::chrono::steady_clock::now() + spec.stop_grace;
  };
  if (!result.status.ok()) stop_others();
  int running = 0;
  for (pid_t pid : pids) running += pid > 0 ? 1 : 0;
  while (running > 0) {
    if (const int signal = g_forward_signal; signal != 0) {
      g_forward_signal = 0;
      for (pid_t pid : pids) {
        if (pid > 0) ::kill(pid, signal);
      }
    }
    // Every rank that ended since the last look; the first cause among them, by the rule above.
    std::optional<RankFailure> seen;
    int seen_status = 0;
    bool seen_unwaitable = false;
    for (int local_rank = 0; local_rank < local_ranks; ++local_rank) {
      if (pids[local_rank] <= 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids[local_rank], &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) continue;
      pids[local_rank] = -1;
      --running;
      const bool ok = done > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok || result.first_failure) continue;
      RankFailure failure;
      failure.rank = first_rank + local_rank;
      if (done > 0 && WIFSIGNALED(status)) {
        failure.signal = WTERMSIG(status);
      } else {
        failure.exit_code = done > 0 ? WEXITSTATUS(status) : 1;
      }
      if (!seen || IsOwnFailure(failure) > IsOwnFailure(*seen)) {
        seen = failure;
        seen_status = status;
        seen_unwaitable = done < 0;
      }
    }
    if (seen) {
      result.first_failure = seen;
      if (!spec.status_file.empty()) WriteStatusFile(spec, master_port, started, seen);
      if (result.status.ok()) {
        result.status = Status(
            StatusCode::kAborted,
            "rank " + std::to_string(seen->rank) + " of " + std::to_string(world_size) + " " +
                (seen_unwaitable ? "could not be waited for" : DescribeExit(seen_status)) +
                "; the other ranks were stopped");
      }
      stop_others();
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
  for (int i = 0; i < 3; ++i) ::sigaction(forwarded[i], &previous[i], nullptr);
  return result;
}

Status LaunchRanks(const LaunchSpec& spec) { return Launch(spec).status; }

}  // namespace llmctl::dist
