#include "controller/cli/daemon_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <string_view>
#include <thread>

#include "common/atomic_file.h"
#include "common/files.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// A pid and a newline; anything longer is not a pid file of ours.
constexpr size_t kMaxPidFileBytes = 64;
// What LogTail reads from the end of a log: ample for the lines it shows when a daemon dies.
constexpr off_t kMaxLogTailBytes = 64 * 1024;

std::string Errno(int error) { return std::strerror(error); }

// The daemon's parent until StartedDaemon::Release: passes the daemon's wait status on over `watch`
// should it end first, and exits once `watch` is readable, which it only is at its end of file
// (released, or the starting process ended), leaving the daemon to init. Async-signal-safe calls
// only: it is a fork of a process that may run threads.
[[noreturn]] void WatchDaemon(pid_t daemon, int watch) {
  while (true) {
    int status = 0;
    const pid_t ended = ::waitpid(daemon, &status, WNOHANG);
    if (ended == daemon) {
      (void)!::send(watch, &status, sizeof status, MSG_NOSIGNAL);
      ::_exit(0);
    }
    // ECHILD: the daemon was reaped unseen (SIGCHLD ignored); nothing is left to pass on.
    if (ended < 0 && errno != EINTR) ::_exit(0);
    pollfd released{.fd = watch, .events = POLLIN, .revents = 0};
    if (::poll(&released, 1, static_cast<int>(kDaemonPollInterval.count())) > 0) ::_exit(0);
  }
}

// StartDetached's three processes (the starter, the child between, the daemon) and the descriptors
// between them, each closed on exec. The daemon reports its pid on `report`, waits for a byte on
// `go`, sent once its pid file is written, then either execs (`report` closes empty) or writes the
// exec error there. Without that byte (llmctl ended first: Ctrl-C, kill -9; or the pid file could
// not be written) it ends without running its program, which would run where nothing found it
// again (daemon stop, the next start failing on its lock). The child between, its parent, watches
// it over `watch` (WatchDaemon) until released.
struct StartChannels {
  int report[2];
  int go[2];     // a socket pair: a send to a daemon that is gone raises no SIGPIPE
  int watch[2];  // likewise, for the parent's send to a starter that is gone

  void CloseAll() const {
    for (int fd : {report[0], report[1], go[0], go[1], watch[0], watch[1]}) ::close(fd);
  }
};

// The pipe and socket pairs; none is left open when one cannot be made.
StatusOr<StartChannels> OpenStartChannels() {
  StartChannels channels{};
  if (::pipe2(channels.report, O_CLOEXEC) != 0) return InternalError("pipe: " + Errno(errno));
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, channels.go) != 0) {
    const std::string error = Errno(errno);
    for (int fd : channels.report) ::close(fd);
    return InternalError("socketpair: " + error);
  }
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, channels.watch) != 0) {
    const std::string error = Errno(errno);
    for (int fd : {channels.report[0], channels.report[1], channels.go[0], channels.go[1]}) {
      ::close(fd);
    }
    return InternalError("socketpair: " + error);
  }
  return channels;
}

// The daemon, before its program: reports its pid, waits for `go`, then execs `argv` with stdin
// from /dev/null and stdout and stderr appended to `log`. Async-signal-safe calls only: it is a
// fork of a process that may run threads.
[[noreturn]] void RunDaemon(const StartChannels& channels, int log, char* const argv[]) {
  ::close(channels.go[1]);  // else its own copy would keep `go` open for good
  const pid_t self = ::getpid();
  (void)!::write(channels.report[1], &self, sizeof self);
  char byte = 0;
  ssize_t got = 0;
  do {
    got = ::read(channels.go[0], &byte, 1);
  } while (got < 0 && errno == EINTR);
  if (got != 1) ::_exit(0);
  const int null = ::open("/dev/null", O_RDONLY);
  ::dup2(null, STDIN_FILENO);
  ::dup2(log, STDOUT_FILENO);
  ::dup2(log, STDERR_FILENO);
  ::execv(argv[0], argv);
  const int error = errno;
  (void)!::write(channels.report[1], &error, sizeof error);
  ::_exit(127);
}

// The child between: the leader of a session of its own, it forks the daemon and stays its parent
// (WatchDaemon). Async-signal-safe calls only, as RunDaemon.
[[noreturn]] void RunBetween(const StartChannels& channels, int log, char* const argv[]) {
  ::setsid();
  const pid_t daemon = ::fork();
  if (daemon < 0) ::_exit(1);
  if (daemon == 0) RunDaemon(channels, log, argv);
  // Its copies would hold them open: `report` past the daemon's exec, whose end of file says the
  // exec succeeded; `go` past the starter's end, which must stop the daemon; `watch` past the
  // starter's end, which must release the daemon.
  for (int fd : {channels.report[1], channels.go[1], channels.watch[1]}) ::close(fd);
  WatchDaemon(daemon, channels.watch[0]);
}

// The starter's side once `child`, the child between, is forked: learns the daemon's pid, writes
// its pid file, and only then lets it exec, whose outcome it learns on `report`.
StatusOr<StartedDaemon> ReleaseToExec(const DaemonSpec& spec, pid_t child,
                                      const StartChannels& channels, off_t log_start) {
  for (int fd : {channels.report[1], channels.go[0], channels.watch[0]}) ::close(fd);
  UniqueFd watched(channels.watch[1]);
  pid_t daemon = 0;
  const ssize_t got_pid = ::read(channels.report[0], &daemon, sizeof daemon);
  if (got_pid != sizeof daemon) {
    for (int fd : {channels.report[0], channels.go[1]}) ::close(fd);
    StartedDaemon(0, child, std::move(watched), log_start).Release();  // its parent, reaped
    return InternalError("could not start " + spec.name);
  }
  StartedDaemon started(daemon, child, std::move(watched), log_start);
  const Status written = WriteTextFile(spec.pid_file, std::to_string(daemon) + "\n", 0644);
  if (written.ok()) (void)!::send(channels.go[1], "g", 1, MSG_NOSIGNAL);
  ::close(channels.go[1]);
  int exec_error = 0;
  const ssize_t got_error = ::read(channels.report[0], &exec_error, sizeof exec_error);
  ::close(channels.report[0]);
  if (!written.ok()) {
    return FailedPreconditionError(
        std::string(spec.name).append(" not started: ").append(written.message()));
  }
  if (got_error == sizeof exec_error) {
    std::error_code error;
    fs::remove(spec.pid_file, error);
    return FailedPreconditionError("cannot run " + spec.binary.string() + ": " + Errno(exec_error));
  }
  return started;
}

}  // namespace

bool ProcessAlive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

Status WriteTextFile(const fs::path& path, const std::string& text, mode_t mode) {
  const Status written = WriteFileAtomically(path.string(), [&](int fd) -> Status {
    if (::fchmod(fd, mode) != 0) return InternalError(path.string() + ": chmod: " + Errno(errno));
    return WriteAll(fd, text.data(), text.size());
  });
  if (written.code() == StatusCode::kUnavailable) return FailedPreconditionError(written.message());
  return written;
}

std::optional<int> StartedDaemon::WaitStatus(milliseconds wait) {
  if (!watch_.valid()) return std::nullopt;
  pollfd ended{.fd = watch_.get(), .events = POLLIN, .revents = 0};
  if (::poll(&ended, 1, static_cast<int>(wait.count())) <= 0) return std::nullopt;
  int status = 0;
  // End of file instead: its parent was killed.
  if (::recv(watch_.get(), &status, sizeof status, MSG_WAITALL) != sizeof status) {
    return std::nullopt;
  }
  return status;
}

void StartedDaemon::Release() {
  if (!watch_.valid()) return;
  watch_.reset();
  while (::waitpid(watcher_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

StatusOr<StartedDaemon> StartDetached(const DaemonSpec& spec) {
  UniqueFd log(::open(spec.log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!log.valid()) return FailedPreconditionError(spec.log_file.string() + ": " + Errno(errno));
  struct stat log_info {};
  const off_t log_start = ::fstat(log.get(), &log_info) == 0 ? log_info.st_size : 0;
  ASSIGN_OR_RETURN(const StartChannels channels, OpenStartChannels());
  // Made before the fork: the forked processes allocate nothing (async-signal-safe calls only).
  std::vector<std::string> argv_text = {spec.binary.string()};
  argv_text.insert(argv_text.end(), spec.args.begin(), spec.args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_text) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t child = ::fork();
  if (child < 0) {
    const int error = errno;
    channels.CloseAll();
    return InternalError("fork: " + Errno(error));
  }
  if (child == 0) RunBetween(channels, log.get(), argv.data());
  log.reset();
  return ReleaseToExec(spec, child, channels, log_start);
}

std::optional<RunningDaemon> FindDaemon(const fs::path& pid_file, const fs::path& binary) {
  // Through the bounded reader: a FIFO or a device in the pid file's place is refused at once
  // rather than waited on or read for ever (llmctl once hung on one).
  StatusOr<std::string> text = ReadFileToString(pid_file.string(), kMaxPidFileBytes);
  if (!text.ok()) return std::nullopt;
  const size_t begin = text->find_first_not_of(" \t\n");
  if (begin == std::string::npos) return std::nullopt;
  long pid = 0;
  const char* const end = text->data() + text->size();
  const auto [rest, parse_error] = std::from_chars(text->data() + begin, end, pid);
  if (parse_error != std::errc() || pid <= 1 || pid > std::numeric_limits<pid_t>::max()) {
    return std::nullopt;
  }
  if (std::string_view(rest, end).find_first_not_of(" \t\n") != std::string_view::npos) {
    return std::nullopt;
  }
  if (!ProcessAlive(static_cast<pid_t>(pid))) return std::nullopt;
  std::error_code error;
  std::string exe = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", error).string();
  if (error) return std::nullopt;
  // A binary rebuilt while its daemon runs shows as "<path> (deleted)".
  const std::string deleted = " (deleted)";
  const bool replaced = exe.ends_with(deleted);
  if (replaced) exe.resize(exe.size() - deleted.size());
  const fs::path canonical = fs::weakly_canonical(binary, error);
  // A reused pid runs some other program.
  if (fs::path(exe).filename() != canonical.filename()) return std::nullopt;
  return RunningDaemon{.pid = static_cast<pid_t>(pid),
                       .runs = exe,
                       .another_binary = exe != canonical.string(),
                       .replaced = replaced};
}

std::optional<pid_t> RunningPid(const fs::path& pid_file, const fs::path& binary) {
  const std::optional<RunningDaemon> daemon = FindDaemon(pid_file, binary);
  if (!daemon || daemon->another_binary) return std::nullopt;
  return daemon->pid;
}

bool StopProcess(pid_t pid, milliseconds grace) {
  ::kill(pid, SIGTERM);
  for (milliseconds waited{0}; waited < grace; waited += kDaemonPollInterval) {
    if (!ProcessAlive(pid)) return false;
    std::this_thread::sleep_for(kDaemonPollInterval);
  }
  if (!ProcessAlive(pid)) return false;
  ::kill(pid, SIGKILL);
  for (int i = 0; i < 100 && ProcessAlive(pid); ++i)
    std::this_thread::sleep_for(kDaemonPollInterval);
  return true;
}

std::string LogTail(const fs::path& log_file, size_t max_lines, off_t from) {
  // Only the log's last kMaxLogTailBytes are read, opened without blocking and only when a regular
  // file: a FIFO in its place is not waited on, and a long log, or one without newlines, is not
  // read whole into memory.
  struct stat info {};
  StatusOr<UniqueFd> fd = OpenRegularFile(log_file.string(), info);
  if (!fd.ok()) return "";
  const off_t size = info.st_size;
  if (from >= size) return "";
  const off_t start = std::max(from, size > kMaxLogTailBytes ? size - kMaxLogTailBytes : 0);
  std::string text(static_cast<size_t>(size - start), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n =
        ::pread(fd->get(), text.data() + got, text.size() - got, start + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  // Begun inside the file (not at `from`): the first line is likely cut, so it is left out when
  // others follow.
  if (const size_t newline = text.find('\n'); start > from && newline != std::string::npos) {
    text.erase(0, newline + 1);
  }
  std::deque<std::string> lines;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    lines.emplace_back(text, begin, end - begin);
    if (lines.size() > max_lines) lines.pop_front();
    begin = end + 1;
  }
  std::string tail;
  for (const std::string& line : lines) tail += "  " + line + "\n";
  return tail;
}

}  // namespace llmctl::cli
