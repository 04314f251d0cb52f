#include "trainer/dist/rank_launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
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
#include "common/child_process.h"
#include "common/process_end.h"
#include "common/text.h"
#include "common/trainer_exit.h"
#include "common/unique_fd.h"
#include "trainer/dist/rank_env.h"

extern char** environ;

namespace llmctl::dist {
namespace {

constexpr auto kPollInterval = std::chrono::milliseconds(20);
// The most of a rank's stderr the launcher keeps, its last bytes, to find the rank's last line in
// (as the agent reads the last 64 KiB of a run's stderr); it quotes kQuotedLineBytes of that line.
constexpr size_t kKeptStderrBytes = 64 << 10;

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

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    return "was killed by " + SignalName(WTERMSIG(status));
  }
  const int code = WEXITSTATUS(status);
  if (code == kCannotExecuteExitCode) return "could not execute its program (exit code 127)";
  return "exited with code " + std::to_string(code);
}

// One rank's stderr as the launcher reads it from the rank's pipe: every byte passed on to the
// launcher's own stderr as it comes, and the last kKeptStderrBytes kept, whose last line that is
// not blank is the reason a rank that exits with an error code gives for it (llm-train's
// "llm-train: ..." line).
class RankStderr {
 public:
  explicit RankStderr(UniqueFd pipe) : pipe_(std::move(pipe)) {}

  int fd() const { return pipe_.get(); }

  // Reads what the rank wrote so far, up to a pipe's 64 KiB (the pipe does not block, and a rank
  // that writes without end does not keep the launcher from its other ranks), and passes it on;
  // closes the pipe at its end.
  void Drain() {
    char buffer[4096];
    for (int reads = 0; reads < 16 && pipe_.valid(); ++reads) {
      const ssize_t got = ::read(pipe_.get(), buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && errno == EAGAIN) return;
      if (got <= 0) {
        pipe_.reset();
        return;
      }
      // The launcher's stderr is where the rank's went before; a launcher that cannot write it
      // (EPIPE: nobody reads it any more, see IgnoredSigpipe) has nowhere else to report that.
      (void)WriteAll(2, buffer, static_cast<size_t>(got));
      AppendKeepingTail(tail_, std::string_view(buffer, static_cast<size_t>(got)),
                        kKeptStderrBytes);
    }
  }

  // After the rank has ended: what it left in the pipe, then the pipe closed (a process the rank
  // started that still holds it has no reader any more).
  void Finish() {
    Drain();
    pipe_.reset();
  }

  // The last line that is not blank, on one line and cut to kQuotedLineBytes; "" when none.
  std::string LastLine() const { return OnOneLine(LastNonBlankLine(tail_), kQuotedLineBytes); }

 private:
  UniqueFd pipe_;
  std::string tail_;  // the last kKeptStderrBytes the rank wrote
};

// The signal the launcher was sent last, for the wait loop to pass on to the ranks.
volatile sig_atomic_t g_forward_signal = 0;

void RecordSignal(int signal) { g_forward_signal = signal; }

// 1 when the failure is the rank's own rather than what its peers end with when a rank dies under
// them or they are stopped: killed by a signal, invalid input (2), out of memory (3), diverged (4),
// an input shrank under its mapping (6).
int IsOwnFailure(const RankFailure& failure) {
  if (failure.signal != 0) return 1;
  switch (failure.exit_code) {
    case trainer_exit::kInvalidInput:
    case trainer_exit::kOom:
    case trainer_exit::kDiverged:
    case trainer_exit::kInputShrank:
      return 1;
    default:
      return 0;
  }
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

// Port 0: a free port from the kernel, its listening socket (in `listen_fd`) handed to rank 0.
// Otherwise `requested` itself, and no socket (-1).
Status PickMasterPort(uint16_t requested, int* listen_fd, uint16_t* port) {
  *listen_fd = -1;
  *port = requested;
  if (requested != 0) return Status::Ok();
  ASSIGN_OR_RETURN(*listen_fd, ListenOnMasterPort(0));
  *port = ListeningPort(*listen_fd);
  if (*port != 0) return Status::Ok();
  ::close(*listen_fd);
  return UnavailableError(std::string("cannot read the rendezvous port the kernel chose: ") +
                          std::strerror(errno));
}

// Each local rank's whole environment, built before forking: the child may not allocate.
std::vector<std::vector<std::string>> RankEnvironments(const LaunchSpec& spec, uint16_t master_port,
                                                       int listen_fd) {
  const int local_ranks = spec.nproc_per_node;
  std::vector<std::vector<std::string>> environments;
  const std::string threads = RankThreadsVariable(local_ranks);
  for (int local_rank = 0; local_rank < local_ranks; ++local_rank) {
    RankEnv env;
    env.rank = spec.node_rank * local_ranks + local_rank;
    env.local_rank = local_rank;
    env.world_size = spec.nnodes * local_ranks;
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
  return environments;
}

// While alive, SIGTERM, SIGINT and SIGUSR1 are recorded for the wait loop to pass on to the ranks.
class ForwardedSignals {
 public:
  ForwardedSignals() {
    g_forward_signal = 0;
    struct sigaction forward {};
    forward.sa_handler = RecordSignal;
    sigemptyset(&forward.sa_mask);
    for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &forward, &previous_[i]);
  }
  ~ForwardedSignals() {
    for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &previous_[i], nullptr);
  }
  ForwardedSignals(const ForwardedSignals&) = delete;
  ForwardedSignals& operator=(const ForwardedSignals&) = delete;

 private:
  static constexpr int kSignals[3] = {SIGTERM, SIGINT, SIGUSR1};
  struct sigaction previous_[3];
};

// While alive, SIGPIPE is ignored: a write to a stderr nobody reads any more (`llm-train ... 2>&1 |
// head -1` once head has ended) fails with EPIPE and only the ranks' text is lost, where the
// signal killed the launcher, and with it its ranks (PR_SET_PDEATHSIG). ExecRank sets it back to
// the default for each rank.
class IgnoredSigpipe {
 public:
  IgnoredSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &previous_);
  }
  ~IgnoredSigpipe() { ::sigaction(SIGPIPE, &previous_, nullptr); }
  IgnoredSigpipe(const IgnoredSigpipe&) = delete;
  IgnoredSigpipe& operator=(const IgnoredSigpipe&) = delete;

 private:
  struct sigaction previous_;
};

// This host's rank processes, indexed by local rank, from their start to the job's end.
class RankProcesses {
 public:
  RankProcesses(const LaunchSpec& spec, uint16_t master_port)
      : spec_(spec),
        master_port_(master_port),
        first_rank_(spec.node_rank * spec.nproc_per_node),
        world_size_(spec.nnodes * spec.nproc_per_node),
        pids_(spec.nproc_per_node, -1),
        started_(spec.nproc_per_node, -1),
        stderr_(spec.nproc_per_node) {}

  // Forks and executes each rank with its environment (StartChild: each dies with the launcher);
  // stops at the first fork that fails. A rank's stderr is the write end of its pipe to the
  // launcher. It starts with SIGPIPE at its default, as the agent starts a process
  // (agent/process.h), where execve would keep the launcher's SIG_IGN (IgnoredSigpipe). A program
  // that cannot be executed is a rank that exits kCannotExecuteExitCode, its reason its stderr's
  // last line.
  Status Start(const std::vector<std::vector<std::string>>& environments, int listen_fd) {
    for (size_t local_rank = 0; local_rank < pids_.size(); ++local_rank) {
      const int rank = first_rank_ + static_cast<int>(local_rank);
      // Close-on-exec both: no rank holds another's pipe, and the rank's own write end is its fd 2.
      int pipe_fds[2];
      if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
        return UnavailableError("cannot start rank " + std::to_string(rank) +
                                ": pipe: " + std::strerror(errno));
      }
      UniqueFd read_end(pipe_fds[0]);
      const UniqueFd write_end(pipe_fds[1]);
      ::fcntl(read_end.get(), F_SETFL, O_NONBLOCK);
      ChildSpec child;
      child.argv = spec_.argv;
      child.envp = environments[local_rank];
      child.stderr_fd = write_end.get();
      // The socket is close-on-exec: rank 0 keeps it open across its exec, the others lose it.
      if (rank == 0 && listen_fd >= 0) child.inherited_fds = {listen_fd};
      child.default_signals = {SIGPIPE};
      child.exec_failure = ExecFailureReport::kStderrAndExitCode;
      child.exec_failure_message = "cannot execute the rank's program: ";
      const StatusOr<pid_t> pid = StartChild(child);
      if (!pid.ok()) {
        return UnavailableError("cannot start rank " + std::to_string(rank) + ": " +
                                pid.status().message());
      }
      pids_[local_rank] = started_[local_rank] = *pid;
      stderr_[local_rank].emplace(std::move(read_end));
    }
    return Status::Ok();
  }

  // Polls every rank until all have ended: the first to end otherwise than with 0 fails the job,
  // and the others are stopped (SIGTERM, then SIGKILL after the spec's grace). `result` arrives
  // with the start's status; a failed start stops the ranks that did start.
  void Wait(LaunchResult& result) {
    WriteStatus(std::nullopt);
    if (!result.status.ok()) StopOthers();
    while (Running() > 0) {
      if (const int signal = g_forward_signal; signal != 0) {
        g_forward_signal = 0;
        SignalAll(signal);
      }
      if (std::optional<EndedRank> ended = ReapEnded(result.first_failure.has_value())) {
        result.first_failure = ended->failure;
        WriteStatus(ended->failure);
        if (result.status.ok()) {
          std::string message = "rank " + std::to_string(ended->failure.rank) + " of " +
                                std::to_string(world_size_) + " " + ended->how;
          if (!ended->reason.empty()) message.append(": ").append(ended->reason);
          result.status =
              Status(StatusCode::kAborted, message.append("; the other ranks were stopped"));
        }
        StopOthers();
      }
      if (Running() == 0) break;
      if (std::chrono::steady_clock::now() >= kill_at_) {
        SignalAll(SIGKILL);
        kill_at_ = std::chrono::steady_clock::time_point::max();
      }
      AwaitStderr();
    }
  }

 private:
  // A rank that failed, how it ended in words, and the reason it gave (its last stderr line) when
  // it exited with an error code: a rank killed by a signal had no say, and its last line may be
  // anything it wrote before.
  struct EndedRank {
    RankFailure failure;
    std::string how;
    std::string reason;
  };

  int Running() const {
    int running = 0;
    for (pid_t pid : pids_) running += pid > 0 ? 1 : 0;
    return running;
  }
  void SignalAll(int signal) {
    for (pid_t pid : pids_) {
      if (pid > 0) ::kill(pid, signal);
    }
  }
  void StopOthers() {
    SignalAll(SIGTERM);
    kill_at_ = std::chrono::steady_clock::now() + spec_.stop_grace;
  }
  // Waits up to kPollInterval for a rank to write to its stderr, and passes on what they wrote.
  void AwaitStderr() {
    std::vector<pollfd> open;
    for (const std::optional<RankStderr>& rank_stderr : stderr_) {
      if (rank_stderr && rank_stderr->fd() >= 0) open.push_back({rank_stderr->fd(), POLLIN, 0});
    }
    if (::poll(open.data(), open.size(), static_cast<int>(kPollInterval.count())) <= 0) return;
    for (std::optional<RankStderr>& rank_stderr : stderr_) {
      if (rank_stderr) rank_stderr->Drain();
    }
  }
  void WriteStatus(const std::optional<RankFailure>& failure) {
    if (!spec_.status_file.empty()) WriteStatusFile(spec_, master_port_, started_, failure);
  }

  // Reaps every rank that ended since the last look. The first cause among the failures, by
  // IsOwnFailure, unless the job has failed already (`failed`) or none failed.
  std::optional<EndedRank> ReapEnded(bool failed) {
    std::optional<EndedRank> seen;
    for (size_t local_rank = 0; local_rank < pids_.size(); ++local_rank) {
      if (pids_[local_rank] <= 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(pids_[local_rank], &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) continue;
      pids_[local_rank] = -1;
      if (stderr_[local_rank]) stderr_[local_rank]->Finish();
      const bool ok = done > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok || failed) continue;
      RankFailure failure;
      failure.rank = first_rank_ + static_cast<int>(local_rank);
      if (done > 0 && WIFSIGNALED(status)) {
        failure.signal = WTERMSIG(status);
      } else {
        failure.exit_code = done > 0 ? WEXITSTATUS(status) : 1;
      }
      if (!seen || IsOwnFailure(failure) > IsOwnFailure(seen->failure)) {
        seen = EndedRank{
            failure, done < 0 ? "could not be waited for" : DescribeExit(status),
            failure.signal == 0 && stderr_[local_rank] ? stderr_[local_rank]->LastLine() : ""};
      }
    }
    return seen;
  }

  const LaunchSpec& spec_;
  const uint16_t master_port_;
  const int first_rank_;
  const int world_size_;
  std::vector<pid_t> pids_;     // -1: not started, or reaped
  std::vector<pid_t> started_;  // every rank's pid as started, for the status file
  std::vector<std::optional<RankStderr>> stderr_;  // none: not started
  std::chrono::steady_clock::time_point kill_at_ = std::chrono::steady_clock::time_point::max();
};

}  // namespace

LaunchResult Launch(const LaunchSpec& spec) {
  if (Status checked = CheckSpec(spec); !checked.ok()) return {checked, std::nullopt};
  int listen_fd = -1;
  uint16_t master_port = 0;
  if (Status picked = PickMasterPort(spec.master_port, &listen_fd, &master_port); !picked.ok()) {
    return {picked, std::nullopt};
  }
  std::vector<std::vector<std::string>> environments =
      RankEnvironments(spec, master_port, listen_fd);
  const ForwardedSignals signals;
  const IgnoredSigpipe ignored_sigpipe;
  RankProcesses ranks(spec, master_port);
  LaunchResult result;
  result.status = ranks.Start(environments, listen_fd);
  if (listen_fd >= 0) ::close(listen_fd);  // rank 0 has its own
  ranks.Wait(result);
  return result;
}

Status LaunchRanks(const LaunchSpec& spec) { return Launch(spec).status; }

}  // namespace llmctl::dist
