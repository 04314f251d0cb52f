#include "controller/cli/daemons.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
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
#include "common/daemon_exit.h"
#include "common/file_lock.h"
#include "common/files.h"
#include "common/process_end.h"
#include "controller/cli/client.h"
#include "controller/cli/local_rates.h"
#include "rpc/grpc_status.h"
#include "rpc/version_check.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{50};
constexpr char kLocalNode[] = "local";
// In the data directory: held while the daemons start or stop, so that two commands at once start
// one pair, and a stop neither ends a start's daemons halfway nor loses their pid files.
constexpr char kStartLockFile[] = "daemons.lock";
// A pid and a newline; anything longer is not a pid file of ours.
constexpr size_t kMaxPidFileBytes = 64;
// What LogTail reads from the end of a log: ample for the lines it shows when a daemon dies.
constexpr off_t kMaxLogTailBytes = 64 * 1024;
// How long a daemon found ended may take to have its status passed on by its parent, which looks
// every kPollInterval: reached only when that parent is stuck, never when it is gone.
constexpr milliseconds kEndStatusWait{5000};

std::string Errno(int error) { return std::strerror(error); }

// True while `pid` exists and is not a zombie waiting for its parent.
bool Alive(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() || line[paren + 2] != 'Z';
}

Status WriteText(const fs::path& path, const std::string& text, mode_t mode) {
  const Status written = WriteFileAtomically(path.string(), [&](int fd) -> Status {
    if (::fchmod(fd, mode) != 0) return InternalError(path.string() + ": chmod: " + Errno(errno));
    return WriteAll(fd, text.data(), text.size());
  });
  // The file's error is this machine's (a full disk), never the controller's: its Unavailable
  // would have llmctl ask whether the controller is running.
  if (written.code() == StatusCode::kUnavailable) return FailedPreconditionError(written.message());
  return written;
}

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
    if (::poll(&released, 1, static_cast<int>(kPollInterval.count())) > 0) ::_exit(0);
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
  const Status written = WriteText(spec.pid_file, std::to_string(daemon) + "\n", 0644);
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

// EnsureRunning's error for a daemon (llmctld, llm-agent) that ended while it waited for it to be
// up: how it ended (when `started`, here) and what it wrote to its log, which says why. A refused
// configuration is the user's input here too, where any daemon that ended was FailedPrecondition
// (llmctl exited 1).
Status DaemonExitedAtStart(const DaemonSpec& daemon, StartedDaemon* started) {
  const std::optional<int> status =
      started != nullptr ? started->WaitStatus(kEndStatusWait) : std::nullopt;
  StatusCode code = StatusCode::kFailedPrecondition;
  std::string message = daemon.name;
  if (status && WIFEXITED(*status) && WEXITSTATUS(*status) == daemon_exit::kConfigRefused) {
    code = StatusCode::kInvalidArgument;
    message.append(" refused its configuration (exit code ")
        .append(std::to_string(daemon_exit::kConfigRefused))
        .append(")");
  } else if (status && WIFEXITED(*status)) {
    message.append(" exited at start with code ").append(std::to_string(WEXITSTATUS(*status)));
  } else if (status && WIFSIGNALED(*status)) {
    message.append(" was killed at start by ").append(SignalName(WTERMSIG(*status)));
  } else {
    message.append(" exited at start");
  }
  // Only what this start wrote: the log is appended to at every start.
  std::string tail = LogTail(daemon.log_file, 15, started != nullptr ? started->log_start() : 0);
  if (!tail.empty()) tail.pop_back();  // its last newline: the message's end is its printer's
  if (tail.empty()) {
    message.append("; nothing in ").append(daemon.log_file.string());
  } else {
    message.append(started != nullptr ? "; what it wrote to " : "; the end of ")
        .append(daemon.log_file.string())
        .append(":\n")
        .append(tail);
  }
  return Status(code, message);
}

// EnsureRunning's error for an llmctld that this start started and that is another llmctl
// version's (`refusal`, rpc/version_check.h's, or llmctld's own): it is stopped here, and its pid
// file removed. It was left running, and the refusal said to stop it with `llmctl daemon stop`, a
// step of the user's that the start could take itself: the refusal comes without that step
// (rpc::EmbeddedHint::kLeaveOut), and is passed on whole.
Status StopRefusedController(const DaemonSpec& controller, pid_t pid, std::string refusal) {
  const bool killed = StopProcess(pid, kDaemonStopGrace);
  std::error_code error;
  fs::remove(controller.pid_file, error);
  return FailedPreconditionError(
      refusal.append("; llmctl ")
          .append(killed ? "killed" : "stopped")
          .append(" the llmctld it had started (pid ")
          .append(std::to_string(pid))
          .append("), ")
          .append(controller.binary.string())
          .append(", which LLMCTL_LLMCTLD_BIN names or llmctl found beside it"));
}

std::optional<fs::path> FirstExisting(const std::vector<fs::path>& candidates) {
  for (const fs::path& candidate : candidates) {
    std::error_code error;
    if (fs::is_regular_file(candidate, error) && ::access(candidate.c_str(), X_OK) == 0) {
      return fs::canonical(candidate, error);
    }
  }
  return std::nullopt;
}

}  // namespace

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
  if (!Alive(static_cast<pid_t>(pid))) return std::nullopt;
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
  for (milliseconds waited{0}; waited < grace; waited += kPollInterval) {
    if (!Alive(pid)) return false;
    std::this_thread::sleep_for(kPollInterval);
  }
  if (!Alive(pid)) return false;
  ::kill(pid, SIGKILL);
  for (int i = 0; i < 100 && Alive(pid); ++i) std::this_thread::sleep_for(kPollInterval);
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

StatusOr<DaemonBinaries> LocateDaemonBinaries(const fs::path& self, const EnvLookup& env) {
  const fs::path dir = self.parent_path();
  const fs::path build_root = dir.parent_path().parent_path();  // build/controller/cli/llmctl
  auto locate = [&](const std::string& name, const std::string& variable,
                    const std::string& build_dir) -> StatusOr<fs::path> {
    if (std::optional<std::string> path = env(variable)) {
      if (std::optional<fs::path> found = FirstExisting({*path})) return *found;
      return NotFoundError(variable + "=" + *path + " is not an executable file");
    }
    if (std::optional<fs::path> found =
            FirstExisting({dir / name, build_root / build_dir / name})) {
      return *found;
    }
    return NotFoundError("cannot find " + name + " beside " + self.string() +
                         " or in the build tree; build it, or set " + variable);
  };
  DaemonBinaries binaries;
  ASSIGN_OR_RETURN(binaries.llmctld, locate("llmctld", "LLMCTL_LLMCTLD_BIN", "controller"));
  ASSIGN_OR_RETURN(binaries.llm_agent, locate("llm-agent", "LLMCTL_AGENT_BIN", "agent"));
  ASSIGN_OR_RETURN(binaries.llm_train, locate("llm-train", "LLMCTL_TRAIN_BIN", "trainer"));
  return binaries;
}

Status WriteAgentCredentials(const v1::NodeCredentials& credentials, const fs::path& tls_dir) {
  if (credentials.certificate_pem().empty() || credentials.private_key_pem().empty() ||
      credentials.ca_certificate_pem().empty() || credentials.token().empty()) {
    return InvalidArgumentError("RegisterNode answered without a certificate, key, CA or token");
  }
  RETURN_IF_ERROR(EnsureOwnDirectory(tls_dir.string(), 0700, OthersMay::kAnything));
  RETURN_IF_ERROR(WriteText(tls_dir / "ca.crt", credentials.ca_certificate_pem(), 0600));
  RETURN_IF_ERROR(WriteText(tls_dir / "agent.crt", credentials.certificate_pem(), 0600));
  RETURN_IF_ERROR(WriteText(tls_dir / "agent.key", credentials.private_key_pem(), 0600));
  // The token last: its presence says the set is complete.
  return WriteText(tls_dir / "token", credentials.token(), 0600);
}

EmbeddedDaemons::EmbeddedDaemons(fs::path data_dir, DaemonBinaries binaries)
    : data_dir_(std::move(data_dir)), binaries_(std::move(binaries)) {}

std::string EmbeddedDaemons::controller_target() const {
  return "unix:" + (data_dir_ / "controller.sock").string();
}

std::string EmbeddedDaemons::agent_target() const {
  return "unix:" + (data_dir_ / "agent.sock").string();
}

DaemonSpec EmbeddedDaemons::ControllerSpec() const {
  return {"llmctld",
          binaries_.llmctld,
          {"--data-dir", data_dir_.string(), "--listen", controller_target()},
          data_dir_ / "llmctld.pid",
          data_dir_ / "logs" / "llmctld.log"};
}

DaemonSpec EmbeddedDaemons::AgentSpec() const {
  const fs::path agent_dir = data_dir_ / "agent";
  const fs::path tls = agent_dir / "tls";
  return {"llm-agent",
          binaries_.llm_agent,
          {"--data-dir", agent_dir.string(), "--listen", agent_target(), "--node", kLocalNode,
           "--llm-train", binaries_.llm_train.string(), "--ca", (tls / "ca.crt").string(), "--cert",
           (tls / "agent.crt").string(), "--key", (tls / "agent.key").string(), "--token-file",
           (tls / "token").string(), "--rate-probe-file", (data_dir_ / kLocalProbeFile).string()},
          data_dir_ / "llm-agent.pid",
          data_dir_ / "logs" / "llm-agent.log"};
}

Status EmbeddedDaemons::WaitForController(pid_t pid, StartedDaemon* started,
                                          std::chrono::steady_clock::time_point give_up) const {
  constexpr milliseconds kRetry{100};
  // One that this start started it stops itself, should it be another version's
  // (StopRefusedController): the refusal leaves out the user's step to stop it.
  const std::shared_ptr<grpc::Channel> channel = OpenStartingControllerChannel(
      controller_target(), kRetry,
      started != nullptr ? rpc::EmbeddedHint::kLeaveOut : rpc::EmbeddedHint::kInclude);
  const std::unique_ptr<v1::Controller::Stub> stub = v1::Controller::NewStub(channel);
  while (true) {
    // Its own refusal (its configuration, a data directory open to others, another llmctld on
    // it), which its log says, where Unavailable would have llmctl ask whether the controller is
    // running and exit 3.
    if (!Alive(pid)) return DaemonExitedAtStart(ControllerSpec(), started);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    // The call waits while the channel connects: with the sync API only a thread inside a call
    // reads the socket, so a connection attempted between calls never sees the server's SETTINGS
    // and times out (that cost 5 s at every start).
    context.set_wait_for_ready(true);
    v1::ListNodesResponse nodes;
    const grpc::Status answer = stub->ListNodes(&context, v1::ListNodesRequest(), &nodes);
    if (answer.ok()) return Status::Ok();
    // It answers, of another llmctl version (rpc/version_check.h: FAILED_PRECONDITION naming both
    // versions, or saying it names none), which no retry changes: the waiting ended in "did not
    // answer", where this says which llmctld to run.
    if (answer.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      if (started == nullptr) return rpc::FromGrpcStatus(answer);
      return StopRefusedController(ControllerSpec(), pid, answer.error_message());
    }
    if (std::chrono::steady_clock::now() > give_up) {
      return UnavailableError("llmctld (pid " + std::to_string(pid) + ") did not answer on " +
                              controller_target() + "; see " + ControllerSpec().log_file.string());
    }
    std::this_thread::sleep_for(kRetry);
  }
}

Status EmbeddedDaemons::WaitForAgent(StartedDaemon& started,
                                     std::chrono::steady_clock::time_point give_up) const {
  const DaemonSpec agent = AgentSpec();
  const fs::path socket = data_dir_ / "agent.sock";
  while (true) {
    // Its socket is made (EnsureRunning removed any earlier one) once its flags, credentials and
    // token were taken and it serves: its refusals all come before.
    std::error_code error;
    if (fs::is_socket(socket, error)) return Status::Ok();
    if (!Alive(started.pid())) return DaemonExitedAtStart(agent, &started);
    if (std::chrono::steady_clock::now() > give_up) {
      return UnavailableError("llm-agent (pid " + std::to_string(started.pid()) +
                              ") did not listen on " + agent_target() + "; see " +
                              agent.log_file.string());
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

Status EmbeddedDaemons::RegisterLocalAgent() const {
  const fs::path tls = data_dir_ / "agent" / "tls";
  std::error_code error;
  if (fs::exists(tls / "token", error)) return Status::Ok();
  const std::unique_ptr<v1::Controller::Stub> stub =
      v1::Controller::NewStub(OpenControllerChannel(controller_target()));
  v1::RegisterNodeRequest request;
  request.set_name(kLocalNode);
  request.set_address(agent_target());
  v1::NodeCredentials credentials;
  Status status =
      rpc::FromGrpcStatus(stub->RegisterNode(UnaryContext().get(), request, &credentials));
  if (status.code() == StatusCode::kPermissionDenied) {
    // The controller knows "local" but its credentials are gone from D/agent/tls (removed by
    // hand, or lost in a crash before they were written), so its token cannot be shown. This
    // user owns the controller's socket: removing the node frees the name.
    v1::DeregisterNodeRequest removal;
    removal.set_name(kLocalNode);
    v1::DeregisterNodeResponse removed;
    RETURN_IF_ERROR(
        rpc::FromGrpcStatus(stub->DeregisterNode(UnaryContext().get(), removal, &removed))
            .WithContext("removing the local agent whose credentials are lost"));
    status = rpc::FromGrpcStatus(stub->RegisterNode(UnaryContext().get(), request, &credentials));
  }
  if (!status.ok()) return status.WithContext("registering the local agent");
  return WriteAgentCredentials(credentials, tls);
}

Status EmbeddedDaemons::CheckSocketPathsFit() const {
  // sun_path holds the path and its terminating NUL.
  constexpr size_t kMaxSocketPathBytes = sizeof(sockaddr_un::sun_path) - 1;
  for (const std::string& target : {controller_target(), agent_target()}) {
    const std::string_view socket =
        std::string_view(target).substr(std::string_view("unix:").size());
    if (socket.size() <= kMaxSocketPathBytes) continue;
    const size_t name_bytes = socket.size() - data_dir_.string().size();
    return InvalidArgumentError(
        std::string("the embedded daemons' socket ")
            .append(socket)
            .append(" is ")
            .append(std::to_string(socket.size()))
            .append(" bytes, over the system's ")
            .append(std::to_string(kMaxSocketPathBytes))
            .append("-byte limit for a unix socket's path: set LLMCTL_HOME to a directory whose "
                    "path is at most ")
            .append(std::to_string(kMaxSocketPathBytes - name_bytes))
            .append(" bytes (this one's is ")
            .append(std::to_string(data_dir_.string().size()))
            .append("), or LLMCTL_CONTROLLER to a running controller"));
  }
  return Status::Ok();
}

Status EmbeddedDaemons::EnsureRunning(milliseconds ready_timeout) {
  // One bound for the whole start, as the user gave it: the agent waited its own full timeout
  // after the controller's, up to twice what was asked.
  const auto give_up = std::chrono::steady_clock::now() + ready_timeout;
  // Before anything is made or started: llmctld would fail at its listen, with gRPC's "cannot
  // listen" naming no limit.
  RETURN_IF_ERROR(CheckSocketPathsFit());
  // One that is there is used as it is, mode and all (LLMCTL_HOME may name a directory shared
  // with others, /tmp as root), when it is a directory of this user's: not a link to one
  // elsewhere, where the daemons' logs and credentials would go.
  for (const fs::path& dir : {data_dir_, data_dir_ / "logs", data_dir_ / "agent"}) {
    RETURN_IF_ERROR(EnsureOwnDirectory(dir.string(), 0700, OthersMay::kAnything));
  }
  ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(data_dir_ / kStartLockFile));
  for (const DaemonSpec& spec : {ControllerSpec(), AgentSpec()}) {
    RETURN_IF_ERROR(RefuseAnotherInstall(spec));
  }

  const DaemonSpec controller = ControllerSpec();
  std::optional<pid_t> controller_pid = RunningPid(controller.pid_file, controller.binary);
  std::optional<StartedDaemon> started;
  if (!controller_pid) {
    // A socket left by a controller that died would make the new one fail to bind.
    std::error_code error;
    fs::remove(data_dir_ / "controller.sock", error);
    StatusOr<StartedDaemon> start = StartDetached(controller);
    if (!start.ok()) return start.status();
    started.emplace(std::move(*start));
    controller_pid = started->pid();
  }
  RETURN_IF_ERROR(WaitForController(*controller_pid, started ? &*started : nullptr, give_up));
  // It answers: past its start, it is let go.
  if (started) started->Release();
  RETURN_IF_ERROR(RegisterLocalAgent());

  const DaemonSpec agent = AgentSpec();
  if (!RunningPid(agent.pid_file, agent.binary)) {
    std::error_code error;
    fs::remove(data_dir_ / "agent.sock", error);
    StatusOr<StartedDaemon> start = StartDetached(agent);
    if (!start.ok()) return start.status();
    // Held until it listens, to report its exit should it refuse its flags or credentials: let go
    // at once, it ended unseen, and the node never came up.
    RETURN_IF_ERROR(WaitForAgent(*start, give_up));
  }
  return Status::Ok();
}

Status EmbeddedDaemons::RefuseAnotherInstall(const DaemonSpec& spec) {
  const std::optional<RunningDaemon> running = FindDaemon(spec.pid_file, spec.binary);
  if (!running || !running->another_binary) return Status::Ok();
  return FailedPreconditionError(
      std::string(spec.name)
          .append(" (pid ")
          .append(std::to_string(running->pid))
          .append(") runs ")
          .append(running->runs.string())
          .append(", not this llmctl's ")
          .append(spec.binary.string())
          .append(" (llmctl was upgraded or moved while its daemons ran): run llmctl daemon stop "
                  "(trials already running go on), then this command again"));
}

std::vector<std::string> EmbeddedDaemons::ReplacedBinaryNotes() const {
  std::vector<std::string> notes;
  for (const DaemonSpec& spec : {ControllerSpec(), AgentSpec()}) {
    const std::optional<RunningDaemon> running = FindDaemon(spec.pid_file, spec.binary);
    if (!running || running->another_binary || !running->replaced) continue;
    notes.push_back(spec.name + " (pid " + std::to_string(running->pid) + ") runs " +
                    running->runs.string() +
                    " as it was before it was rebuilt or replaced, not this llmctl's: llmctl "
                    "daemon stop, and the next command starts the new one (trials already "
                    "running go on)");
  }
  return notes;
}

StatusOr<std::vector<std::string>> EmbeddedDaemons::Stop(milliseconds grace) {
  std::vector<std::string> lines;
  const DaemonSpec agent = AgentSpec();
  const DaemonSpec controller = ControllerSpec();
  std::error_code error;
  if (!fs::is_directory(data_dir_, error)) {
    // Nothing ever started here, and no lock file is made where there is no data directory.
    return std::vector<std::string>{agent.name + ": not running",
                                    controller.name + ": not running"};
  }
  // A start holds this lock until both daemons run: one under way ends first, and its daemons are
  // stopped here, where a stop in its middle removed the pid file it was writing (a daemon nothing
  // found again) or ended the controller it waited for.
  ASSIGN_OR_RETURN(FileLock lock, FileLock::Acquire(data_dir_ / kStartLockFile));
  const bool agent_was_running = FindDaemon(agent.pid_file, agent.binary).has_value();
  for (const DaemonSpec& spec : {agent, controller}) {
    const std::optional<RunningDaemon> running = FindDaemon(spec.pid_file, spec.binary);
    if (!running) {
      lines.push_back(spec.name + ": not running");
    } else {
      const bool killed = StopProcess(running->pid, grace);
      lines.push_back(spec.name + " (pid " + std::to_string(running->pid) +
                      "): " + (killed ? "did not end on SIGTERM; killed" : "stopped"));
    }
    fs::remove(spec.pid_file, error);
  }
  // Each trial runs under its own supervisor, which outlives the agent; the agent adopts it again
  // when it starts. Said here because stopping the daemons reads like stopping the work.
  if (agent_was_running) {
    lines.push_back("trials already running go on, and are picked up when the daemons start again");
  }
  return lines;
}

std::vector<std::string> EmbeddedDaemons::Describe() const {
  std::vector<std::string> lines = {"data directory: " + data_dir_.string()};
  const std::pair<DaemonSpec, std::string> daemons[] = {{ControllerSpec(), controller_target()},
                                                        {AgentSpec(), agent_target()}};
  for (const auto& [spec, target] : daemons) {
    const std::optional<RunningDaemon> running = FindDaemon(spec.pid_file, spec.binary);
    std::string state = "stopped";
    if (running) {
      state = "running (pid " + std::to_string(running->pid);
      if (running->another_binary) {
        state.append(", another llmctl's ").append(running->runs.string());
      }
      state += ")";
    }
    lines.push_back(spec.name + ": " + state + ", " + target + ", log " + spec.log_file.string());
  }
  return lines;
}

}  // namespace llmctl::cli
