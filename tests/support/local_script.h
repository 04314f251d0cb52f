// A local service for tests, started by a Python script (tests/keystone/keystone_local.py,
// tests/blazar/blazar_local.py) in a child process that prints one JSON line once the service
// serves. The script runs in a session of its own, so that every process it starts can be found
// and checked to be gone after a stop.
#ifndef LLMCTL_TESTS_SUPPORT_LOCAL_SCRIPT_H_
#define LLMCTL_TESTS_SUPPORT_LOCAL_SCRIPT_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::testing {

class LocalScript {
 public:
  // Starts Debian's python3 on `script` (relative to the source tree) with --dir <dir>/<subdir>
  // and `args`; `dir` exists, and the script's stderr goes to <dir>/<script name>.stderr.
  // Returns once the script runs; WaitLine() tells whether its service came up.
  static StatusOr<std::unique_ptr<LocalScript>> Spawn(const std::string& script,
                                                      const std::string& dir,
                                                      const std::string& subdir,
                                                      const std::vector<std::string>& args);
  // Stops the script if it still runs.
  ~LocalScript();
  LocalScript(const LocalScript&) = delete;
  LocalScript& operator=(const LocalScript&) = delete;

  // Blocks until the script prints its line. FailedPrecondition when it exits 3 (what it needs
  // is not installed), Unavailable when it ended otherwise or `timeout` passed (both with the
  // script's own message).
  StatusOr<std::string> WaitLine(std::chrono::seconds timeout);

  // SIGINT to the script, which stops its service, and waits for it (SIGKILL after 30 s).
  // Internal when the script did not exit 0 or any process of its session is left (those are then
  // killed).
  Status Stop();

  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }

 private:
  LocalScript(pid_t pid, int stdout_fd, std::string dir, std::string name, std::string logs_dir)
      : pid_(pid),
        stdout_fd_(stdout_fd),
        dir_(std::move(dir)),
        name_(std::move(name)),
        logs_dir_(std::move(logs_dir)) {}
  std::string StderrTail() const;

  pid_t pid_;      // also the id of the script's session
  int stdout_fd_;  // the script's stdout; -1 once closed
  std::string dir_;
  std::string name_;      // the script's file name, for messages
  std::string logs_dir_;  // <dir>/<subdir>
  bool running_ = true;
};

// The processes of session `session_id` (from /proc), for checking that a stopped server left
// nothing.
std::vector<pid_t> ProcessesInSession(pid_t session_id);

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_SUPPORT_LOCAL_SCRIPT_H_
