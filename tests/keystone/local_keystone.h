// A real Keystone on 127.0.0.1 for tests: tests/keystone/keystone_local.py as a LocalScript, whose
// session holds every process it starts (uwsgi's master and worker, keystone-manage).
#ifndef LLMCTL_TESTS_KEYSTONE_LOCAL_KEYSTONE_H_
#define LLMCTL_TESTS_KEYSTONE_LOCAL_KEYSTONE_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "tests/support/local_script.h"

namespace llmctl::testing {

// What keystone_local.py prints once Keystone serves: the demo user (member of the demo project)
// and its unrestricted application credential.
struct KeystoneInfo {
  std::string auth_url;  // http://127.0.0.1:<port>/v3
  int port = 0;
  std::string region;
  std::string username, password, project, project_id, user_domain;
  std::string app_cred_id, app_cred_secret;
  std::string admin_password;  // user "admin", admin of project "admin"
  pid_t uwsgi_pid = 0;

  // OS_* variables as an openrc file sets them, for the demo user's password or its application
  // credential.
  std::map<std::string, std::string> PasswordEnvironment() const;
  std::map<std::string, std::string> ApplicationCredentialEnvironment() const;
};

class LocalKeystone {
 public:
  // Starts keystone_local.py with `args` (--token-expiration, --services-url, ...) in `dir`
  // (existing and empty; its logs stay there). Returns once the script runs; Wait() tells whether
  // Keystone came up.
  static StatusOr<std::unique_ptr<LocalKeystone>> Spawn(const std::string& dir,
                                                        const std::vector<std::string>& args);
  // Blocks until the script prints its JSON line. FailedPrecondition when the Keystone packages are
  // missing, Unavailable when Keystone could not start or `timeout` passed (both with the script's
  // own message).
  StatusOr<KeystoneInfo> Wait(std::chrono::seconds timeout);

  // SIGINT to the script, which stops uwsgi the same way; see LocalScript::Stop.
  Status Stop() { return script_->Stop(); }

  pid_t pid() const { return script_->pid(); }
  const std::string& dir() const { return script_->dir(); }

 private:
  explicit LocalKeystone(std::unique_ptr<LocalScript> script) : script_(std::move(script)) {}
  std::unique_ptr<LocalScript> script_;
};

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_KEYSTONE_LOCAL_KEYSTONE_H_
