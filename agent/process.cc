#include "agent/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace llmctl::agent {

std::optional<uint64_t> ProcessStartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return std::nullopt;
  // "pid (comm) state ...": comm may hold spaces and parentheses, so fields count from the last
  // ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(close + 1));
  std::string state;
  fields >> state;
  if (state == "Z" || state == "X") return std::nullopt;
  std::string skip;
  for (int field = 4; field < 22; ++field) fields >> skip;  // fields 4..21
  uint64_t start_time = 0;
  if (!(fields >> start_time)) return std::nullopt;
  return start_time;
}

bool IsSameProcessAlive(pid_t pid, uint64_t start_time) {
  const std::optional<uint64_t> actual = ProcessStartTime(pid);
  return actual.has_value() && *actual == start_time;
}

UniqueFd OpenExitWatch(pid_t pid, uint64_t start_time) {
  // Through syscall(): Debian 12's <sys/pidfd.h> declares pidfd_open without C linkage. Every
  // pidfd is close-on-exec.
  UniqueFd watch(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  // Checked after opening: the descriptor then names the process that was alive at the check, not
  // a later one the kernel gave the same pid.
  if (!watch.valid() || !IsSameProcessAlive(pid, start_time)) return UniqueFd();
  return watch;
}

namespace {

// How often RunCommand looks at its stop token while it waits.
constexpr std::chrono::milliseconds kStopCheck{50};

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
  for (int signal : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) {
    sigaddset(&defaults, signal);
  }
  posix_spawnattr_setsigdefault(&attributes, &defaults);
}

StatusOr<CommandOutput> RunCommand(const std::vector<std::string>& argv,
                                   std::chrono::milliseconds timeout, std::stop_token stop) {
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
    return UnavailableError(std::string("pipe: ") + std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  // A group of its own (its pid): killing the group ends what it started too (a probe's helper
  // processes), and a terminal's Ctrl-C reaches the agent, which decides, not the command.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  StartWithDefaultSignals(attributes);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(pipe_fds[1]);
  if (spawned != 0) {
    ::close(pipe_fds[0]);
    return NotFoundError("cannot run " + argv[0] + ": " + std::strerror(spawned));
  }
  CommandOutput output;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  char buffer[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 || stop.stop_requested()) {
      timed_out = true;
      break;
    }
    pollfd fd{pipe_fds[0], POLLIN, 0};
    // In slices, so that a stop request is seen within one.
    const int ready = ::poll(&fd, 1, static_cast<int>(std::min(left, kStopCheck).count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output.stdout_text.size() < (1 << 20))
      output.stdout_text.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  // Its standard output closed is not its end: a program that closes it and hangs is still held
  // to the deadline.
  int status = 0;
  if (!timed_out) timed_out = !ReapBy(pid, deadline, stop, status);
  if (timed_out) {
    // Not yet reaped, so the group's id is still this child's and cannot name another's.
    ::kill(-pid, SIGKILL);
    ::kill(pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (stop.stop_requested()) return CancelledError(argv[0] + " was stopped");
  }
  output.exit_code = (!timed_out && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
  return output;
}

}  // namespace llmctl::agent
