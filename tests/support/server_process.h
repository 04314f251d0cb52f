// A test's own server in a child process: a Python script (stdlib only) that listens on
// 127.0.0.1 port 0 and prints "PORT <n>" as its first stdout line. Started through StartChild
// (common/child_process.h), as the product starts its children: killed when the thread that started
// it ends. Ended with SIGTERM when the owner goes away, so a failing test leaves no server behind.
#ifndef LLMCTL_TESTS_SUPPORT_SERVER_PROCESS_H_
#define LLMCTL_TESTS_SUPPORT_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::testing {

// The python3 the tests' scripts run in: Debian's, whose dist-packages hold Keystone's modules,
// where a version manager's python3 shim would add processes (and a second of start) in front of
// it. Scripts that need other modules run them in a virtual environment of their own
// (blazar_local.py).
inline constexpr char kTestPython[] = "/usr/bin/python3";

class ServerProcess {
 public:
  // Runs `python3 <script> <args...>`; `script` is relative to the source tree (SourceDir()).
  static StatusOr<std::unique_ptr<ServerProcess>> StartPython(const std::string& script,
                                                              const std::vector<std::string>& args);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  ServerProcess(pid_t pid, int port) : pid_(pid), port_(port) {}
  pid_t pid_;
  int port_;
};

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_SUPPORT_SERVER_PROCESS_H_
