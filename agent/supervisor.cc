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

#include "agent/process.h"
#include "common/atomic_file.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/text.h"

namespace llmctl::agent {
namespace {

constexpr char kGraceFlag[] = "--grace-ms";

Status WriteJsonAtomically(const std::string& path, const nlohmann::json& json) {
  const std::string text = json.dump() + "\n";
  return WriteFileAtomically(path, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
}

// In the forked child, before exec: only async-signal-safe calls.
[[noreturn]] void ExecWorker(const SupervisorCommand& command, char* const* argv,
                             const char* stdout_path, const char* stderr_path) {
  ::setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int signal : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) ::signal(signal, SIG_DFL);
  const int in = ::open("/dev/null", O_RDONLY);
  const int out = ::open(stdout_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  const int err = ::open(stderr_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (in < 0 || out < 0 || err < 0) ::_exit(127);
  ::dup2(in, 0);
  ::dup2(out, 1);
  ::dup2(err, 2);
  if (::chdir(command.run_dir.c_str()) != 0) ::_exit(127);
  ::execv(argv[0], argv);
  static constexpr char kMessage[] = "llm-agent supervisor: cannot execute the worker: ";
  (void)!::write(2, kMessage, sizeof(kMessage) - 1);
  const char* reason = ::strerror(errno);
  (void)!::write(2, reason, ::strlen(reason));
  (void)!::write(2, "\n", 1);
  ::_exit(127);
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

  std::vector<char*> argv;
  for (const std::string& arg : command.worker_argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  const std::string stdout_path = command.run_dir + "/" + kStdoutFile;
  const std::string stderr_path = command.run_dir + "/" + kStderrFile;
  const pid_t worker = ::fork();
  if (worker < 0) {
    std::cerr << "llm-agent supervisor: fork: " << std::strerror(errno) << std::endl;
    return 1;
  }
  if (worker == 0) ExecWorker(command, argv.data(), stdout_path.c_str(), stderr_path.c_str());
  ::setpgid(worker, worker);  // also here, so the group exists before anyone signals it

  const Status recorded = WriteJsonAtomically(
      command.run_dir + "/" + kWorkerFile,
      {{"pid", worker}, {"pgid", worker}, {"start_time", ProcessStartTime(worker).value_or(0)}});
  if (!recorded.ok()) std::cerr << "llm-agent supervisor: " << recorded.message() << std::endl;

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
  const Status written = WriteJsonAtomically(command.run_dir + "/" + kExitFile, exit);
  if (!written.ok()) {
    std::cerr << "llm-agent supervisor: " << written.message() << std::endl;
    return 1;
  }
  return 0;
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
