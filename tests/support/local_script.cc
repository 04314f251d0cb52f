#include "tests/support/local_script.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/child_process.h"
#include "common/unique_fd.h"
#include "tests/support/server_process.h"
#include "tests/support/shell_command.h"

namespace llmctl::testing {
namespace {

constexpr int kMissingPackagesExitCode = 3;  // the scripts' EXIT_MISSING
constexpr auto kStopTimeout = std::chrono::seconds(30);

// Waits for `pid` up to `timeout`; its wait status, or nullopt while it still runs.
std::optional<int> WaitFor(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "wait status " + std::to_string(status);
}

}  // namespace

StatusOr<std::unique_ptr<LocalScript>> LocalScript::Spawn(const std::string& script,
                                                          const std::string& dir,
                                                          const std::string& subdir,
                                                          const std::vector<std::string>& args) {
  const std::string name = script.substr(script.rfind('/') + 1);
  std::vector<std::string> argv = {kTestPython, (SourceDir() / script).string(), "--dir",
                                   dir + "/" + subdir};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string stderr_path = dir + "/" + name + ".stderr";
  const UniqueFd err(open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  const UniqueFd in(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!err.valid() || !in.valid()) {
    return InternalError("cannot open " + stderr_path + " or /dev/null for " + name);
  }
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return InternalError("pipe2 failed for " + name);
  UniqueFd out_read(pipe_fds[0]);
  const UniqueFd out_write(pipe_fds[1]);

  ChildSpec spec;
  spec.program = kTestPython;
  spec.argv = std::move(argv);
  spec.stdin_fd = in.get();
  spec.stdout_fd = out_write.get();
  spec.stderr_fd = err.get();
  // A session of its own groups everything it starts; SIGTERM when the test process dies, however
  // it dies, stops the service with it.
  spec.own_session = true;
  spec.parent_death_signal = SIGTERM;
  // As a script that fails: exit 127, why on its stderr, which WaitLine quotes.
  spec.exec_failure = ExecFailureReport::kStderrAndExitCode;
  spec.exec_failure_message = std::string(kTestPython) + ": ";
  const StatusOr<pid_t> pid = StartChild(spec);
  if (!pid.ok()) return InternalError("cannot start " + name + ": " + pid.status().message());
  return std::unique_ptr<LocalScript>(
      new LocalScript(*pid, out_read.release(), dir, name, dir + "/" + subdir));
}

LocalScript::~LocalScript() {
  if (running_) (void)Stop();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

std::string LocalScript::StderrTail() const {
  std::ifstream file(dir_ + "/" + name_ + ".stderr");
  std::stringstream text;
  text << file.rdbuf();
  std::string all = text.str();
  constexpr size_t kTail = 2000;
  return all.size() > kTail ? all.substr(all.size() - kTail) : all;
}

StatusOr<std::string> LocalScript::WaitLine(std::chrono::seconds timeout) {
  if (stdout_fd_ < 0)
    return FailedPreconditionError(name_ + ": WaitLine() after its output was read");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  while (line.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd fd{stdout_fd_, POLLIN, 0};
    if (left.count() <= 0 || poll(&fd, 1, static_cast<int>(left.count())) == 0) {
      return UnavailableError(name_ + " did not serve within " + std::to_string(timeout.count()) +
                              " s; its logs are in " + logs_dir_);
    }
    char buffer[4096];
    ssize_t n = read(stdout_fd_, buffer, sizeof buffer);
    if (n <= 0) {
      // It exited before serving: why is on its stderr.
      close(stdout_fd_);
      stdout_fd_ = -1;
      int status = WaitFor(pid_, kStopTimeout).value_or(-1);
      running_ = false;
      if (WIFEXITED(status) && WEXITSTATUS(status) == kMissingPackagesExitCode) {
        return FailedPreconditionError(StderrTail());
      }
      return UnavailableError(name_ + " ended (" + DescribeStatus(status) +
                              ") before serving: " + StderrTail());
    }
    line.append(buffer, static_cast<size_t>(n));
  }
  close(stdout_fd_);  // it prints nothing after this line
  stdout_fd_ = -1;
  return line.substr(0, line.find('\n'));
}

Status LocalScript::Stop() {
  if (!running_) return Status::Ok();
  running_ = false;
  kill(pid_, SIGINT);
  std::optional<int> status = WaitFor(pid_, kStopTimeout);
  std::string problem;
  if (!status) {
    kill(pid_, SIGKILL);
    status = WaitFor(pid_, kStopTimeout);
    problem =
        name_ + " did not stop within " + std::to_string(kStopTimeout.count()) + " s of SIGINT";
  } else if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    problem = name_ + " stopped with " + DescribeStatus(*status) + ": " + StderrTail();
  }
  std::vector<pid_t> left = ProcessesInSession(pid_);
  if (!left.empty()) {
    std::string pids;
    for (pid_t pid : left) {
      pids += ' ';
      pids += std::to_string(pid);
      kill(pid, SIGKILL);
    }
    if (!problem.empty()) problem += "; ";
    problem += "processes left behind (now killed):" + pids;
  }
  return problem.empty() ? Status::Ok() : InternalError(problem);
}

std::vector<pid_t> ProcessesInSession(pid_t session_id) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream stat_file(std::string("/proc/") + entry->d_name + "/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    // pid (comm) state ppid pgrp session ...: comm may hold spaces and parentheses, so parse after
    // the last ')'.
    size_t close_paren = stat.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(close_paren + 1));
    std::string state;
    long ppid = 0, pgrp = 0, session = 0;
    if (fields >> state >> ppid >> pgrp >> session && session == session_id && state != "Z") {
      found.push_back(static_cast<pid_t>(pid));
    }
  }
  closedir(proc);
  return found;
}

}  // namespace llmctl::testing
