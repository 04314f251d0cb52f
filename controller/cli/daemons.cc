#include "controller/cli/daemons.h"

#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string_view>
#include <thread>

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

// In the data directory: held while the daemons start or stop, so that two commands at once start
// one pair, and a stop neither ends a start's daemons halfway nor loses their pid files.
constexpr char kStartLockFile[] = "daemons.lock";
// How long a daemon found ended may take to have its status passed on by its parent, which looks
// every kDaemonPollInterval: reached only when that parent is stuck, never when it is gone.
constexpr milliseconds kEndStatusWait{5000};

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
  RETURN_IF_ERROR(WriteTextFile(tls_dir / "ca.crt", credentials.ca_certificate_pem(), 0600));
  RETURN_IF_ERROR(WriteTextFile(tls_dir / "agent.crt", credentials.certificate_pem(), 0600));
  RETURN_IF_ERROR(WriteTextFile(tls_dir / "agent.key", credentials.private_key_pem(), 0600));
  // The token last: its presence says the set is complete.
  return WriteTextFile(tls_dir / "token", credentials.token(), 0600);
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
    if (!ProcessAlive(pid)) return DaemonExitedAtStart(ControllerSpec(), started);
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
    if (!ProcessAlive(started.pid())) return DaemonExitedAtStart(agent, &started);
    if (std::chrono::steady_clock::now() > give_up) {
      return UnavailableError("llm-agent (pid " + std::to_string(started.pid()) +
                              ") did not listen on " + agent_target() + "; see " +
                              agent.log_file.string());
    }
    std::this_thread::sleep_for(kDaemonPollInterval);
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
  bool agent_started = false;
  if (!RunningPid(agent.pid_file, agent.binary)) {
    std::error_code error;
    fs::remove(data_dir_ / "agent.sock", error);
    StatusOr<StartedDaemon> start = StartDetached(agent);
    if (!start.ok()) return start.status();
    // Held until it listens, to report its exit should it refuse its flags or credentials: let go
    // at once, it ended unseen, and the node never came up.
    RETURN_IF_ERROR(WaitForAgent(*start, give_up));
    agent_started = true;
  }
  if (started.has_value() || agent_started) WaitForLocalNode(give_up);
  return Status::Ok();
}

void EmbeddedDaemons::WaitForLocalNode(std::chrono::steady_clock::time_point give_up) const {
  const std::unique_ptr<v1::Controller::Stub> stub =
      v1::Controller::NewStub(OpenControllerChannel(controller_target()));
  for (auto left = give_up - std::chrono::steady_clock::now(); left > milliseconds(0);
       left = give_up - std::chrono::steady_clock::now()) {
    grpc::ClientContext context;
    context.set_deadline(
        std::chrono::system_clock::now() +
        std::min<std::chrono::steady_clock::duration>(left, std::chrono::seconds(1)));
    const StatusOr<v1::NodeStatus> local = ListedNode(*stub, std::string(kLocalNode), context);
    if (local.ok() && AgentAnswers(*local)) return;
    std::this_thread::sleep_for(kDaemonPollInterval);
  }
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
