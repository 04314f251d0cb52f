#include "tests/support/server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "common/child_process.h"
#include "common/unique_fd.h"
#include "tests/support/shell_command.h"

namespace llmctl::testing {
namespace {

// Generous: it only bounds a hang when the script is broken; a healthy start takes well under 1 s.
constexpr int kStartTimeoutMs = 20000;

}  // namespace

StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::StartPython(
    const std::string& script, const std::vector<std::string>& args) {
  const std::string path = (SourceDir() / script).string();
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return InternalError("pipe failed");
  UniqueFd out_write(pipe_fds[1]);
  // -I -S: no site packages or user environment, so a test server starts the same everywhere
  // (and without the site-packages' .pth imports, noticeably faster).
  ChildSpec spec;
  spec.program = kTestPython;
  spec.argv = {kTestPython, "-I", "-S", "-u", path};
  spec.argv.insert(spec.argv.end(), args.begin(), args.end());
  spec.stdout_fd = out_write.get();
  // A python3 that cannot be executed exits 127, why on its stderr, and prints no port.
  spec.exec_failure = ExecFailureReport::kStderrAndExitCode;
  spec.exec_failure_message = std::string(kTestPython) + ": ";
  const StatusOr<pid_t> started = StartChild(spec);
  if (!started.ok()) {
    close(pipe_fds[0]);
    return InternalError("cannot start " + path + ": " + started.status().message());
  }
  const pid_t pid = *started;
  out_write.reset();  // the child's end: closed here, a child that dies is end of file below
  std::string line;
  while (line.find('\n') == std::string::npos) {
    pollfd fd{pipe_fds[0], POLLIN, 0};
    char buffer[256];
    ssize_t n = poll(&fd, 1, kStartTimeoutMs) == 1 ? read(pipe_fds[0], buffer, sizeof buffer) : -1;
    if (n <= 0) {
      close(pipe_fds[0]);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return UnavailableError(path + " did not print its port");
    }
    line.append(buffer, static_cast<size_t>(n));
  }
  // The child keeps writing to a pipe nobody reads only if it prints more than a pipe buffer;
  // the servers print nothing after the port.
  close(pipe_fds[0]);
  if (!line.starts_with("PORT ")) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return InternalError(path + " printed '" + line + "' instead of 'PORT <n>'");
  }
  int port = std::atoi(line.c_str() + 5);
  return std::unique_ptr<ServerProcess>(new ServerProcess(pid, port));
}

ServerProcess::~ServerProcess() {
  kill(pid_, SIGTERM);
  waitpid(pid_, nullptr, 0);
}

}  // namespace llmctl::testing
