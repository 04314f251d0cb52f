#include "common/run_command.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include "common/text.h"
#include "common/unique_fd.h"

namespace llmctl {

namespace {

// How often RunCommand looks at its stop token while it waits.
constexpr std::chrono::milliseconds kStopCheck{50};
// The most of a command's standard output RunCommand keeps (its first bytes), and of its standard
// error (its last: a program's reason for failing comes at the end).
constexpr size_t kMaxStdoutBytes = 1 << 20;
constexpr size_t kMaxStderrBytes = 64 << 10;

// Waits for child `pid` to exit until `deadline` or a stop request, polling; whether it did (its
// wait status in `status`, -1 when it could not be waited for).
bool ReapBy(pid_t pid, std::chrono::steady_clock::time_point deadline, const std::stop_token& stop,
            int& status) {
  while (true) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid) return true;
    if (done < 0 && errno != EINTR) {
      status = -1;
      return true;  // not ours to wait for: nothing left to reap
    }
    if (std::chrono::steady_clock::now() >= deadline || stop.stop_requested()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// The signals a command starts with at their default actions, whatever the agent does with them.
constexpr int kSignalsStartedAtDefault[] = {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD};

// `name` as exec would find it: itself when it holds a '/', otherwise the first executable file of
// that name in PATH. Looked up before fork, where the child may only make async-signal-safe calls.
std::optional<std::string> FindProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::istringstream directories(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string directory;
  while (std::getline(directories, directory, ':')) {
    const std::string candidate = (directory.empty() ? std::string(".") : directory) + "/" + name;
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return std::nullopt;
}

// A pipe's two ends, close-on-exec.
struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

StatusOr<Pipe> OpenPipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return UnavailableError(std::string("pipe: ") + std::strerror(errno));
  }
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Waits for child `pid` to exit, however long: its wait status.
int WaitFor(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// A command running in a child of this process: its pid, and the read ends of its standard output
// and error (in that order).
struct StartedCommand {
  pid_t pid = -1;
  std::array<UniqueFd, 2> outputs;
};

// Starts `program` with `argv` in a child tied to this process (StartChild): a group of its own
// (its pid), so that killing the group ends what it started too (a probe's helper processes) and a
// terminal's Ctrl-C reaches this process, which decides, not the command; stdin on /dev/null; the
// signals kSignalsStartedAtDefault at their defaults and none blocked. It is killed with this
// process (SIGKILL, a crash) rather than left running: a probe that outlived a killed agent would
// run beside the restarted agent's own and both would measure half a machine.
// The signal comes when the thread that started it ends, not the process: this one is RunCommand's
// caller, which waits for the command before it returns. NotFound when exec fails (the child
// reaped), Unavailable when there is no /dev/null, pipe or fork. Its environment is `env`, or this
// process's when nullopt.
StatusOr<StartedCommand> StartCommand(const std::string& program,
                                      const std::vector<std::string>& argv,
                                      std::optional<std::vector<std::string>> env) {
  UniqueFd null_device(::open("/dev/null", O_RDWR | O_CLOEXEC));
  if (!null_device.valid()) {
    return UnavailableError(std::string("/dev/null: ") + std::strerror(errno));
  }
  ASSIGN_OR_RETURN(Pipe stdout_pipe, OpenPipe());
  ASSIGN_OR_RETURN(Pipe stderr_pipe, OpenPipe());
  ChildSpec spec;
  spec.program = program;
  spec.argv = argv;
  spec.envp = std::move(env);
  spec.stdin_fd = null_device.get();
  spec.stdout_fd = stdout_pipe.write.get();
  spec.stderr_fd = stderr_pipe.write.get();
  spec.own_process_group = true;
  StartWithDefaultSignals(spec);
  StatusOr<pid_t> pid = StartChild(spec);
  stdout_pipe.write.reset();
  stderr_pipe.write.reset();
  if (!pid.ok() && pid.status().code() == StatusCode::kNotFound) {
    return pid.status().WithContext("cannot run " + argv[0]);
  }
  if (!pid.ok()) return pid.status();
  return StartedCommand{*pid, {std::move(stdout_pipe.read), std::move(stderr_pipe.read)}};
}

// Adds `bytes`, read next from a command's standard output, to `stdout_text` while it holds fewer
// than kMaxStdoutBytes.
void KeepStdout(std::string_view bytes, std::string& stdout_text) {
  if (stdout_text.size() < kMaxStdoutBytes) stdout_text.append(bytes);
}

// Reads a command's standard output and error (`outputs`, in that order) into `output` until both
// end; false when `deadline` came or `stop` was requested first. Both are closed when it returns.
bool ReadOutputsUntil(std::array<UniqueFd, 2> outputs,
                      std::chrono::steady_clock::time_point deadline, const std::stop_token& stop,
                      CommandOutput& output) {
  char buffer[4096];
  // poll passes over a closed one (fd -1).
  pollfd polled[2] = {{outputs[0].get(), POLLIN, 0}, {outputs[1].get(), POLLIN, 0}};
  while (polled[0].fd >= 0 || polled[1].fd >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || stop.stop_requested()) return false;
    // In slices, so that a stop request is seen within one.
    const int ready = ::poll(polled, 2, static_cast<int>(std::min(left, kStopCheck).count()));
    if (ready <= 0) continue;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (polled[i].fd < 0 || polled[i].revents == 0) continue;
      const ssize_t n = ::read(polled[i].fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        outputs[i].reset();
        polled[i].fd = -1;
      } else if (i == 0) {
        KeepStdout(std::string_view(buffer, static_cast<size_t>(n)), output.stdout_text);
      } else {
        AppendKeepingTail(output.stderr_tail, std::string_view(buffer, static_cast<size_t>(n)),
                          kMaxStderrBytes);
      }
    }
  }
  return true;
}

// Kills child `pid`'s process group and the child itself (SIGKILL), and reaps it. Not yet reaped,
// so the group's id is still this child's and cannot name another's.
void KillAndReap(pid_t pid) {
  ::kill(-pid, SIGKILL);
  ::kill(pid, SIGKILL);
  WaitFor(pid);
}

}  // namespace

void StartWithDefaultSignals(posix_spawnattr_t& attributes) {
  short flags = 0;
  posix_spawnattr_getflags(&attributes, &flags);
  posix_spawnattr_setflags(&attributes, flags | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attributes, &none);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int signal : kSignalsStartedAtDefault) sigaddset(&defaults, signal);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
}

void StartWithDefaultSignals(ChildSpec& spec) {
  spec.default_signals.assign(std::begin(kSignalsStartedAtDefault),
                              std::end(kSignalsStartedAtDefault));
  spec.clear_signal_mask = true;
}

StatusOr<CommandOutput> RunCommand(const std::vector<std::string>& argv,
                                   std::chrono::milliseconds timeout, std::stop_token stop,
                                   std::optional<std::vector<std::string>> env) {
  const std::optional<std::string> program = FindProgram(argv[0]);
  if (!program.has_value()) {
    return NotFoundError("cannot run " + argv[0] + ": " + std::strerror(ENOENT));
  }
  ASSIGN_OR_RETURN(StartedCommand command, StartCommand(*program, argv, std::move(env)));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  CommandOutput output;
  bool timed_out = !ReadOutputsUntil(std::move(command.outputs), deadline, stop, output);
  // Its standard output and error closed are not its end: a program that closes them and hangs is
  // still held to the deadline.
  int status = 0;
  if (!timed_out) timed_out = !ReapBy(command.pid, deadline, stop, status);
  if (timed_out) {
    KillAndReap(command.pid);
    if (stop.stop_requested()) return CancelledError(argv[0] + " was stopped");
  }
  output.exit_code = (!timed_out && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  return output;
}

}  // namespace llmctl
