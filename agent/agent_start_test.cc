// llm-agent's start: what the real binary refuses and how it exits (common/daemon_exit.h's codes),
// its unix socket the owner's alone from its bind, one agent to a data directory.
#include <gtest/gtest.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/agent_test_support.h"
#include "agent/server.h"
#include "common/run_command.h"
#include "common/status.h"
#include "rpc/certificates.h"
#include "tests/support/shell_command.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
using test_support::FreshTestDir;

// A CA in DIR/ca and node "local"'s credentials from it: the CA's certificate, the node's
// certificate and key (a failure is the test's, and nullopt).
std::optional<rpc::TlsIdentity> LocalAgentIdentity(const fs::path& dir) {
  StatusOr<std::unique_ptr<rpc::CertificateAuthority>> ca =
      rpc::CertificateAuthority::LoadOrCreate((dir / "ca").string());
  EXPECT_TRUE(ca.ok()) << ca.status().ToString();
  if (!ca.ok()) return std::nullopt;
  StatusOr<rpc::IssuedCertificate> issued = (*ca)->Issue(rpc::AgentCertificateName("local"), 1);
  EXPECT_TRUE(issued.ok()) << issued.status().ToString();
  if (!issued.ok()) return std::nullopt;
  return rpc::TlsIdentity{(*ca)->ca_certificate_pem(), issued->certificate_pem,
                          issued->private_key_pem};
}

// The flags llm-agent needs, naming files in `dir`: a CA's certificate, a certificate and key for
// node "local" and a token (0600), its data directory and an llm-train that runs.
std::vector<std::string> AgentFlags(const fs::path& dir) {
  const std::optional<rpc::TlsIdentity> identity = LocalAgentIdentity(dir);
  if (!identity.has_value()) return {};
  const std::pair<const char*, std::string> files[] = {{"ca.crt", identity->ca_pem},
                                                       {"agent.crt", identity->certificate_pem},
                                                       {"agent.key", identity->private_key_pem},
                                                       {"token", "a-token-for-this-test"}};
  for (const auto& [name, text] : files) {
    std::ofstream(dir / name) << text;
    fs::permissions(dir / name, fs::perms::owner_read | fs::perms::owner_write);
  }
  return {"--data-dir",   (dir / "data").string(),
          "--node",       "local",
          "--ca",         (dir / "ca.crt").string(),
          "--cert",       (dir / "agent.crt").string(),
          "--key",        (dir / "agent.key").string(),
          "--token-file", (dir / "token").string(),
          "--llm-train",  "/bin/true"};
}

// The real llm-agent with `flags`, its rate probe off: its exit code and what it wrote.
StatusOr<CommandOutput> RunAgent(const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {"env", "LLMCTL_RATE_PROBE=off",
                                   (llmctl::testing::BuildDir() / "agent" / "llm-agent").string()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return RunCommand(argv, std::chrono::seconds(60));
}

// A --listen path that is not a socket is the agent's configuration, refused as its flags and files
// are (common/daemon_exit.h's 2, which llmctl reports as the user's to fix): it exited 1, as when
// it could not serve.
TEST(AgentMainTest, AListenPathThatIsNotASocketIsARefusedConfiguration) {
  const fs::path dir = FreshTestDir("listen_not_socket");
  std::vector<std::string> flags = AgentFlags(dir);
  ASSERT_FALSE(flags.empty());
  std::ofstream(dir / "agent.sock") << "a file";
  flags.insert(flags.end(), {"--listen", "unix:" + (dir / "agent.sock").string()});
  const StatusOr<CommandOutput> refused = RunAgent(flags);
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->exit_code, 2) << refused->stderr_tail;
  EXPECT_NE(
      refused->stderr_tail.find((dir / "agent.sock").string() + " exists and is not a socket"),
      std::string::npos)
      << refused->stderr_tail;
  EXPECT_TRUE(fs::is_regular_file(dir / "agent.sock"));
  fs::remove_all(dir);
}

// A certificate renewal a crash interrupted that cannot be finished (its <key>.next cannot be
// removed: here a directory with a file in it) is this machine's failure (1), not a refused flag:
// it exited 2, CLI11's code for bad flags.
TEST(AgentMainTest, ARenewalThatCannotBeFinishedIsThisMachinesFailure) {
  const fs::path dir = FreshTestDir("renewal_not_finished");
  std::vector<std::string> flags = AgentFlags(dir);
  ASSERT_FALSE(flags.empty());
  fs::create_directories(dir / "agent.key.next");
  std::ofstream(dir / "agent.key.next" / "in-the-way") << "x";
  flags.insert(flags.end(), {"--listen", "unix:" + (dir / "agent.sock").string()});
  const StatusOr<CommandOutput> failed = RunAgent(flags);
  ASSERT_TRUE(failed.ok()) << failed.status().ToString();
  EXPECT_EQ(failed->exit_code, 1) << failed->stderr_tail;
  EXPECT_NE(failed->stderr_tail.find("cannot remove " + (dir / "agent.key.next").string()),
            std::string::npos)
      << failed->stderr_tail;
  EXPECT_FALSE(fs::exists(dir / "agent.sock"));
  fs::remove_all(dir);
}

// An agent of node "local" listening on DIR/sockets/`socket` with its data in DIR/`data`, its
// credentials from a CA in DIR/ca, and no trainer to run.
AgentOptions LocalAgentOptions(const fs::path& dir, const std::string& socket = "agent.sock",
                               const std::string& data = "data") {
  std::optional<rpc::TlsIdentity> identity = LocalAgentIdentity(dir);
  if (!identity.has_value()) return {};
  fs::create_directories(dir / "sockets");
  AgentOptions options;
  options.listen = "unix:" + (dir / "sockets" / socket).string();
  options.data_dir = (dir / data).string();
  options.node = "local";
  options.identity = *std::move(identity);
  options.token = "a-token-for-this-test";
  options.llm_train = "/bin/true";
  options.supervisor_program = "/bin/true";
  return options;
}

// The agent's unix socket is the owner's alone from its bind, whatever the umask: it was made 0777
// less the umask (0777 under umask 000) and made private after, a moment in which others could
// connect and llmctl's start took the agent for ready, though the agent could still fail to make it
// private. inotify sees each change to the socket's mode: none may follow its creation.
TEST(AgentServerTest, AUnixSocketIsTheOwnersAloneFromItsBind) {
  const fs::path dir = FreshTestDir("private_socket");
  const AgentOptions options = LocalAgentOptions(dir);
  ASSERT_FALSE(options.listen.empty());
  const int watch = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(watch, 0);
  ASSERT_GE(::inotify_add_watch(watch, (dir / "sockets").c_str(), IN_CREATE | IN_ATTRIB), 0);
  const mode_t umask_before = ::umask(0);
  StatusOr<std::unique_ptr<AgentServer>> server = AgentServer::Start(options);
  ::umask(umask_before);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<std::string> events;
  alignas(inotify_event) char buffer[4096];
  for (ssize_t got; (got = ::read(watch, buffer, sizeof buffer)) > 0;) {
    for (ssize_t at = 0; at < got;) {
      const auto* event = reinterpret_cast<const inotify_event*>(buffer + at);
      events.push_back(std::string(event->mask & IN_CREATE ? "create " : "attrib ") +
                       (event->len > 0 ? event->name : ""));
      at += static_cast<ssize_t>(sizeof(inotify_event) + event->len);
    }
  }
  ::close(watch);
  EXPECT_EQ(events, std::vector<std::string>{"create agent.sock"});
  EXPECT_EQ(fs::status(dir / "sockets" / "agent.sock").permissions() &
                (fs::perms::group_all | fs::perms::others_all),
            fs::perms::none);
  server->reset();
  fs::remove_all(dir);
}

// One agent to a data directory: a second one there, even on another socket, would take the
// first's socket (an agent removes the one at its listen path) and recover and supervise the same
// runs. It is refused, naming the first's pid, and the first keeps serving; once the first has
// ended, an agent starts there again.
TEST(AgentServerTest, ASecondAgentOnTheSameDataDirectoryIsRefused) {
  const fs::path dir = FreshTestDir("second_agent");
  const AgentOptions first_options = LocalAgentOptions(dir);
  ASSERT_FALSE(first_options.listen.empty());
  StatusOr<std::unique_ptr<AgentServer>> first = AgentServer::Start(first_options);
  ASSERT_TRUE(first.ok()) << first.status().ToString();

  StatusOr<std::unique_ptr<AgentServer>> second =
      AgentServer::Start(LocalAgentOptions(dir, "second.sock"));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(), "another llm-agent (pid " + std::to_string(::getpid()) +
                                           ") is using the data directory " +
                                           first_options.data_dir +
                                           "; stop it, or give this one another --data-dir");
  EXPECT_TRUE(fs::is_socket(dir / "sockets" / "agent.sock"));
  EXPECT_FALSE(fs::exists(dir / "sockets" / "second.sock"));

  first->reset();
  StatusOr<std::unique_ptr<AgentServer>> again = AgentServer::Start(first_options);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  again->reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmctl::agent
