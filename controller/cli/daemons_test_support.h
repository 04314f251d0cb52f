// The embedded daemons' tests' fixture (a temporary directory, stand-in binaries, the local agent's
// credentials) and helpers, for daemons_test.cc (starting, finding and stopping them; pid files,
// logs, credentials, the home) and daemons_start_test.cc (how a daemon's end at start is reported).
#ifndef LLMCTL_CONTROLLER_CLI_DAEMONS_TEST_SUPPORT_H_
#define LLMCTL_CONTROLLER_CLI_DAEMONS_TEST_SUPPORT_H_

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/types.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include "common/status.h"
#include "controller/cli/commands.h"
#include "controller/cli/daemons.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/certificates.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli {

namespace fs = std::filesystem;

class DaemonsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/llmctl-daemons-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A shell script at `path`, its owner's to run: `body` after the #! line.
  void MakeExecutable(const fs::path& path, const std::string& body = "") {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << "#!/bin/sh\n" << body;
    fs::permissions(path, fs::perms::owner_all);
  }

  // /bin/sleep copied to bin/llmctld: a stand-in under llmctld's name, which its args keep
  // running.
  fs::path SleepAsLlmctld() {
    fs::create_directories(dir_ / "bin");
    fs::copy_file("/bin/sleep", dir_ / "bin" / "llmctld");
    return fs::canonical(dir_ / "bin" / "llmctld");
  }

  // What `llmctl daemon start` in `home` reads of its environment, with `llmctld` the llmctld it
  // starts and no agent or trainer that could run (/bin/false): for tests of llmctld's start.
  static EnvLookup ControllerOnlyEnv(const fs::path& home, const fs::path& llmctld) {
    return [home, llmctld](std::string_view name) -> std::optional<std::string> {
      if (name == "LLMCTL_HOME") return home.string();
      if (name == "LLMCTL_LLMCTLD_BIN") return llmctld.string();
      if (name == "LLMCTL_AGENT_BIN" || name == "LLMCTL_TRAIN_BIN") return "/bin/false";
      return std::nullopt;
    };
  }

  // The built llm-agent.
  static fs::path AgentBinary() { return llmctl::testing::BuildDir() / "agent" / "llm-agent"; }

  // Credentials for node "local" from a CA of the test's, written where EnsureRunning writes them
  // under `data`, and its logs directory.
  void WriteLocalAgentCredentials(const fs::path& data) {
    StatusOr<std::unique_ptr<rpc::CertificateAuthority>> ca =
        rpc::CertificateAuthority::LoadOrCreate((dir_ / "ca").string());
    ASSERT_TRUE(ca.ok()) << ca.status().message();
    StatusOr<rpc::IssuedCertificate> issued = (*ca)->Issue(rpc::AgentCertificateName("local"), 1);
    ASSERT_TRUE(issued.ok()) << issued.status().message();
    v1::NodeCredentials credentials;
    credentials.set_name("local");
    credentials.set_certificate_pem(issued->certificate_pem);
    credentials.set_private_key_pem(issued->private_key_pem);
    credentials.set_ca_certificate_pem((*ca)->ca_certificate_pem());
    credentials.set_token("a-token-for-this-test");
    ASSERT_TRUE(WriteAgentCredentials(credentials, data / "agent" / "tls").ok());
    fs::create_directories(data / "logs");
  }

  fs::path dir_;
};

inline DaemonSpec Sleeper(const fs::path& dir) {
  return {
      "sleeper", fs::canonical("/bin/sleep"), {"300"}, dir / "sleeper.pid", dir / "sleeper.log"};
}

// StartDetached's daemon let go at once, as EnsureRunning lets the agent go: its pid.
inline StatusOr<pid_t> StartReleased(const DaemonSpec& spec) {
  StatusOr<StartedDaemon> started = StartDetached(spec);
  if (!started.ok()) return started.status();
  return started->pid();
}

// The parent pid of `pid` (/proc/PID/stat), 0 when it is gone.
inline pid_t ParentOf(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream rest(line.substr(paren + 2));
  char state = 0;
  pid_t parent = 0;
  rest >> state >> parent;
  return parent;
}

// True while `pid` exists and has not ended (a zombie has).
inline bool Running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_DAEMONS_TEST_SUPPORT_H_
