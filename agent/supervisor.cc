#include "agent/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <utility>

#include "agent/process.h"
#include "common/atomic_file.h"
#include "common/child_process.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/logging.h"
#include "common/run_command.h"
#include "common/text.h"
#include "common/unique_fd.h"

namespace llmctl::agent {
namespace {

constexpr char kGraceFlag[] = "--grace-ms";

Status WriteJsonAtomically(const std::string& path, const nlohmann::json& json) {
  const std::string text = json.dump() + "\n";
  return WriteFileAtomically(path, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
}

// The worker's standard input, output and error: /dev/null, and RUN_DIR's stdout.log and
// stderr.log appended to.
struct WorkerStdio {
  UniqueFd in;
  UniqueFd out;
  UniqueFd err;
};

// `path` opened close-on-exec with `flags` (created 0644 when O_CREAT); Unavailable naming it.
StatusOr<UniqueFd> OpenForWorker(const std::string& path, int flags) {
  UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return UnavailableError(std::string(path).append(": ").append(std::strerror(errno)));
  }
  return fd;
}

StatusOr<WorkerStdio> OpenWorkerStdio(const std::string& run_dir) {
  WorkerStdio stdio;
  ASSIGN_OR_RETURN(stdio.in, OpenForWorker("/dev/null", O_RDONLY));
  constexpr int kAppend = O_WRONLY | O_CREAT | O_APPEND;
  ASSIGN_OR_RETURN(stdio.out, OpenForWorker(run_dir + "/" + kStdoutFile, kAppend));
  ASSIGN_OR_RETURN(stdio.err, OpenForWorker(run_dir + "/" + kStderrFile, kAppend));
  return stdio;
}

// Starts the worker in RUN_DIR, in a process group of its own (its pid), the signals a terminal or
// the agent send at their defaults and none blocked. Untied to the supervisor (no parent-death
// signal): when the supervisor is gone, the agent kills the worker's whole group from worker.json
// (RunManager::CheckRun). An exec failure is the worker's exit code 127 with its reason on
// stderr.log, which the supervisor learns of as of any other exit, from waitpid. Unavailable when
// there is no fork. `stdio` closes here, once the worker has its own.
StatusOr<pid_t> StartWorker(const SupervisorCommand& command, WorkerStdio stdio) {
  ChildSpec spec;
  spec.argv = command.worker_argv;
  spec.stdin_fd = stdio.in.get();
  spec.stdout_fd = stdio.out.get();
  spec.stderr_fd = stdio.err.get();
  spec.own_process_group = true;
  StartWithDefaultSignals(spec);
  spec.tie_to_parent = false;
  spec.working_dir = command.run_dir;
  spec.exec_failure = ExecFailureReport::kStderrAndExitCode;
  spec.exec_failure_message = "llm-agent supervisor: cannot execute the worker: ";
  return StartChild(spec);
}

// Writes exit.json; the supervisor's exit code: 0, or 1 when it could not.
int RecordExit(const std::string& run_dir, const nlohmann::json& exit) {
  const Status written = WriteJsonAtomically(run_dir + "/" + kExitFile, exit);
  if (!written.ok()) {
    std::cerr << LogLinePrefix(LogLevel::kError) << "llm-agent supervisor: " << written.message()
              << std::endl;
    return 1;
  }
  return 0;
}

// How long a stop that SIGUSR1 asked for may take: the milliseconds the signal's value carries
// when the agent sent it with sigqueue, else `grace`.
std::chrono::milliseconds CheckpointGrace(const siginfo_t& info, std::chrono::milliseconds grace) {
  if (info.si_code != SI_QUEUE || info.si_value.sival_int <= 0) return grace;
  return std::chrono::milliseconds(info.si_value.sival_int);
}

}  // namespace

std::vector<std::string> SupervisorArgv(const std::string& program,
                                        const SupervisorCommand& command) {
  std::vector<std::string> argv = {
      program, kSuperviseFlag, command.run_dir, kGraceFlag, std::to_string(command.grace.count()),
      "--"};
  argv.insert(argv.end(), command.worker_argv.begin(), command.worker_argv.end());
  return argv;
}

StatusOr<SupervisorCommand> ParseSupervisorArgs(const std::vector<std::string>& args) {
  const Status usage = InvalidArgumentError(
      "usage: llm-agent --supervise RUN_DIR --grace-ms N -- PROGRAM [ARGS...] (the agent starts "
      "this itself)");
  if (args.size() < 7 || args[1] != kSuperviseFlag || args[3] != kGraceFlag || args[5] != "--") {
    return usage;
  }
  SupervisorCommand command;
  command.run_dir = args[2];
  try {
    size_t used = 0;
    const long long grace = std::stoll(args[4], &used);
    if (used != args[4].size() || grace < 0) return usage;
    if (grace > kMaxSupervisorGrace.count()) {
      return InvalidArgumentError("--grace-ms " + args[4] + ": at most " +
                                  std::to_string(kMaxSupervisorGrace.count()) + " ms");
    }
    command.grace = std::chrono::milliseconds(grace);
  } catch (const std::exception&) {
    return usage;
  }
  command.worker_argv.assign(args.begin() + 6, args.end());
  return command;
}

int RunSupervisor(const SupervisorCommand& command) {
  // Signals are taken synchronously with sigtimedwait: no handlers, no races with waitpid.
  sigset_t watched;
  sigemptyset(&watched);
  for (int signal : {SIGTERM, SIGINT, SIGUSR1, SIGCHLD}) sigaddset(&watched, signal);
  ::sigprocmask(SIG_BLOCK, &watched, nullptr);
  ::signal(SIGHUP, SIG_IGN);

  StatusOr<WorkerStdio> stdio = OpenWorkerStdio(command.run_dir);
  if (!stdio.ok()) {
    // As a worker that cannot run ends: the exit code of a program that could not be executed.
    std::cerr << LogLinePrefix(LogLevel::kError)
              << "llm-agent supervisor: " << stdio.status().message() << std::endl;
    return RecordExit(command.run_dir, {{"exit_code", kCannotExecuteExitCode}});
  }
  const StatusOr<pid_t> started = StartWorker(command, *std::move(stdio));
  if (!started.ok()) {
    std::cerr << LogLinePrefix(LogLevel::kError)
              << "llm-agent supervisor: " << started.status().message() << std::endl;
    return 1;
  }
  const pid_t worker = *started;
  ::setpgid(worker, worker);  // also here, so the group exists before anyone signals it

  const Status recorded = WriteJsonAtomically(
      command.run_dir + "/" + kWorkerFile,
      {{"pid", worker}, {"pgid", worker}, {"start_time", ProcessStartTime(worker).value_or(0)}});
  if (!recorded.ok())
    std::cerr << LogLinePrefix(LogLevel::kWarning) << "llm-agent supervisor: " << recorded.message()
              << std::endl;

  // A checkpointing cancel (SIGUSR1) gives the worker its own grace; a plain cancel (SIGTERM)
  // after it still stops the worker within the plain grace, so that a worker stuck writing its
  // checkpoint does not hold the node's devices for the rest of a long grace.
  bool checkpointing = false;
  bool terminating = false;
  auto kill_at = std::chrono::steady_clock::time_point::max();
  int status = 0;
  while (true) {
    const pid_t done = ::waitpid(worker, &status, WNOHANG);
    if (done == worker) break;
    timespec wait{0, 200 * 1000 * 1000};
    siginfo_t info{};
    const int signal = ::sigtimedwait(&watched, &info, &wait);
    const auto now = std::chrono::steady_clock::now();
    if ((signal == SIGTERM || signal == SIGINT) && !terminating) {
      terminating = true;
      ::kill(-worker, SIGTERM);
      kill_at = std::min(kill_at, now + command.grace);
    }
    if (signal == SIGUSR1 && !checkpointing && !terminating) {
      checkpointing = true;
      ::kill(-worker, SIGUSR1);
      kill_at = now + CheckpointGrace(info, command.grace);
    }
    if (std::chrono::steady_clock::now() >= kill_at) {
      ::kill(-worker, SIGKILL);
      kill_at = std::chrono::steady_clock::time_point::max();
    }
  }
  ::kill(-worker, SIGKILL);  // anything the worker left behind in its group

  nlohmann::json exit;
  if (WIFSIGNALED(status)) {
    exit["signal"] = WTERMSIG(status);
  } else {
    exit["exit_code"] = WEXITSTATUS(status);
  }
  return RecordExit(command.run_dir, exit);
}

StatusOr<WorkerExit> ParseWorkerExit(std::string_view text, const std::string& path) {
  const nlohmann::json json = ParseForeignJson(text);
  const auto bad = [&] {
    return DataLossError(path + " does not say how the worker ended: " + OnOneLine(text, 200));
  };
  if (!json.is_object()) return bad();
  // The field within [low, high]; none when it is not an integer or outside them: get<int>() of
  // 2^32 + 9 would be 9, and a signal of 0 no signal at all.
  const auto field = [&](nlohmann::json::const_iterator it, int64_t low,
                         int64_t high) -> std::optional<int> {
    if (!it->is_number_integer()) return std::nullopt;
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(high)) {
      return std::nullopt;
    }
    const int64_t value = it->get<int64_t>();
    if (value < low || value > high) return std::nullopt;
    return static_cast<int>(value);
  };
  WorkerExit exit;
  if (const auto signal = json.find("signal"); signal != json.end()) {
    const std::optional<int> value = field(signal, 1, 64);  // SIGRTMAX is 64
    if (!value) return bad();
    exit.signal = *value;
  } else if (const auto code = json.find("exit_code"); code != json.end()) {
    const std::optional<int> value = field(code, 0, 255);  // WEXITSTATUS's range
    if (!value) return bad();
    exit.exit_code = *value;
  } else {
    return bad();
  }
  return exit;
}

StatusOr<std::optional<WorkerExit>> ReadWorkerExit(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kExitFile;
  auto text = ReadFileToString(path, 4096);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::optional<WorkerExit>();
    return text.status();
  }
  ASSIGN_OR_RETURN(const WorkerExit exit, ParseWorkerExit(*text, path));
  return std::optional<WorkerExit>(exit);
}

}  // namespace llmctl::agent
