// A real Keystone on 127.0.0.1 for tests: tests/keystone/keystone_local.py in a child process, in a
// session of its own so that every process it starts (uwsgi's master and worker, keystone-manage)
// can be found and checked to be gone after a stop.
#ifndef LLMCTL_TESTS_KEYSTONE_LOCAL_KEYSTONE_H_
#define LLMCTL_TESTS_KEYSTONE_LOCAL_KEYSTONE_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::testing {

// What keystone_local.py prints once Keystone serves: the demo user (member of the demo project)
// and its unrestricted application credential.
struct KeystoneInfo {
  std::string auth_url;  // http://127.0.0.1:<port>/v3
  int port = 0;
  std::string region;
  std::string username, password, project, project_id, user_domain;
  std::string app_cred_id, app_cred_secret;
  pid_t uwsgi_pid = 0;
};

class LocalKeystone {
 public:
  // Starts keystone_local.py with `args` (--token-expiration, --services-url, ...) in `dir`
  // (existing and empty; its logs stay there). Returns once the script runs; Wait() tells whether
  // Keystone came up.
  static StatusOr<std::unique_ptr<LocalKeystone>> Spawn(const std::string& dir,
                                                        const std::vector<std::string>& args);
  // Stops the script if it still runs.
  ~LocalKeystone();
  LocalKeystone(const LocalKeystone&) = delete;
  LocalKeystone& operator=(const LocalKeystone&) = delete;

  // Blocks until the script prints its JSON line. FailedPrecondition when the Keystone packages are
  // missing, Unavailable when Keystone could not start or `timeout` passed (both with the script's
  // own message).
  StatusOr<KeystoneInfo> Wait(std::chrono::seconds timeout);

  // SIGINT to the script, which stops uwsgi the same way, and waits for it (SIGKILL after 30 s).
  // Internal when the script did not exit 0 or any process of its session is left (those are then
  // killed).
  Status Stop();

  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }

 private:
  LocalKeystone(pid_t pid, int stdout_fd, std::string dir)
      : pid_(pid), stdout_fd_(stdout_fd), dir_(std::move(dir)) {}
  std::string StderrTail() const;

  pid_t pid_;      // also the id of the script's session
  int stdout_fd_;  // the script's stdout; -1 once closed
  std::string dir_;
  bool running_ = true;
};

// The processes of session `session_id` (from /proc), for checking that a stopped server left
// nothing.
std::vector<pid_t> ProcessesInSession(pid_t session_id);

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_KEYSTONE_LOCAL_KEYSTONE_H_
