#include "tests/support/server_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

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
  if (pipe(pipe_fds) != 0) return InternalError("pipe failed");
  // -I -S: no site packages or user environment, so a test server starts the same everywhere
  // (and without the site-packages' .pth imports, noticeably faster).
  std::vector<std::string> argv_strings = {"python3", "-I", "-S", "-u", path};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return InternalError("fork failed");
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    execvp("python3", argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
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
