// How an embedded daemon's end at start is reported: a binary that cannot run, a daemon killed or
// refusing its configuration at start, an llmctld of another version, the one start timeout, the
// real llmctld's and llm-agent's refusals and exit codes as llmctl passes them on.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <future>
#include <iterator>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "common/file_lock.h"
#include "common/version.h"
#include "controller/cli/commands.h"
#include "controller/cli/daemons.h"
#include "controller/cli/daemons_test_support.h"
#include "controller/cli/offline_cli_test.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/certificates.h"
#include "rpc/version_check.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli {
namespace {

TEST_F(DaemonsTest, ABinaryThatCannotRunIsReported) {
  DaemonSpec spec = Sleeper(dir_);
  spec.binary = dir_ / "not-executable";
  std::ofstream(spec.binary) << "data";
  Status status = StartDetached(spec).status();
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("cannot run " + spec.binary.string() + ": Permission denied"),
            std::string::npos)
      << status.message();
  EXPECT_FALSE(fs::exists(spec.pid_file));
}

// A started daemon's parent, the leader of its session, passes on how it ended (a detached daemon's
// exit code was lost: llmctl could only say that it had died) until it is let go; then it exits,
// and the daemon runs on as init's.
TEST_F(DaemonsTest, AStartedDaemonsEndIsPassedOnUntilItIsLetGo) {
  DaemonSpec spec = Sleeper(dir_);
  spec.binary = fs::canonical("/bin/sh");
  spec.args = {"-c", "exit 3"};
  StatusOr<StartedDaemon> ended = StartDetached(spec);
  ASSERT_TRUE(ended.ok()) << ended.status().message();
  const std::optional<int> status = ended->WaitStatus(std::chrono::seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << *status;

  StatusOr<StartedDaemon> running = StartDetached(Sleeper(dir_));
  ASSERT_TRUE(running.ok()) << running.status().message();
  const pid_t parent = ParentOf(running->pid());
  EXPECT_NE(parent, ::getpid());
  EXPECT_EQ(::getsid(running->pid()), parent);  // the daemon is no session's leader
  EXPECT_EQ(running->WaitStatus(std::chrono::milliseconds(0)), std::nullopt);
  running->Release();
  EXPECT_FALSE(Running(parent));
  EXPECT_NE(ParentOf(running->pid()), parent);
  EXPECT_TRUE(Running(running->pid()));
  EXPECT_EQ(running->WaitStatus(std::chrono::milliseconds(0)), std::nullopt);
  EXPECT_FALSE(StopProcess(running->pid(), std::chrono::seconds(10)));
}

// llmctl ended (Ctrl-C, kill -9) while it waited for a daemon it started: the daemon's parent,
// which watched it for llmctl, exits, and the daemon runs on where its pid file finds it, as it
// did when that parent exited at once. Here the starter ends without letting it go.
TEST_F(DaemonsTest, ADaemonWhoseStarterEndsWhileItIsWatchedRunsOnFoundByItsPidFile) {
  const DaemonSpec spec = Sleeper(dir_);
  int pids[2];
  ASSERT_EQ(::pipe(pids), 0);
  const pid_t starter = ::fork();
  ASSERT_GE(starter, 0);
  if (starter == 0) {
    ::close(pids[0]);
    StatusOr<StartedDaemon> started = StartDetached(spec);
    const pid_t sent[2] = {started.ok() ? started->pid() : 0,
                           started.ok() ? ParentOf(started->pid()) : 0};
    (void)!::write(pids[1], sent, sizeof sent);
    ::_exit(0);  // as a kill would: `started` is never released
  }
  ::close(pids[1]);
  pid_t got[2] = {0, 0};
  const ssize_t read = ::read(pids[0], got, sizeof got);
  ::close(pids[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(starter, &status, 0), starter);
  ASSERT_EQ(read, static_cast<ssize_t>(sizeof got));
  const auto [daemon, parent] = got;
  ASSERT_GT(daemon, 0);
  ASSERT_GT(parent, 0);
  // Bounded wait for the parent to see its starter's end.
  for (int i = 0; i < 400 && Running(parent); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_FALSE(Running(parent)) << "the daemon's parent outlived its starter";
  EXPECT_EQ(RunningPid(spec.pid_file, "/bin/sleep"), daemon);
  EXPECT_FALSE(StopProcess(daemon, std::chrono::seconds(10)));
}

// llmctld killed at start is reported with the signal, and its empty log as such.
TEST_F(DaemonsTest, AControllerKilledAtStartIsReportedWithItsSignal) {
  const fs::path home = dir_ / "home";
  const fs::path llmctld = dir_ / "llmctld";
  MakeExecutable(llmctld, "kill -s KILL $$\n");
  EmbeddedDaemons daemons(
      home,
      {.llmctld = fs::canonical(llmctld), .llm_agent = "/bin/false", .llm_train = "/bin/false"});
  const Status started = daemons.EnsureRunning(std::chrono::seconds(10));
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition) << started.ToString();
  EXPECT_EQ(started.message(), "llmctld was killed at start by SIGKILL (Killed); nothing in " +
                                   (home / "logs" / "llmctld.log").string());
}

// A controller that answers as another llmctl version: what an llmctld of another release says.
class AnotherVersionsController final : public v1::Controller::Service {
  grpc::Status ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest*,
                         v1::ListNodesResponse*) override {
    rpc::AnnounceVersion(*context, "0.0.1-another");
    return grpc::Status::OK;
  }
};

// An llmctld of another version (LLMCTL_LLMCTLD_BIN naming an older one) is refused at its first
// answer, naming both versions: the wait retried the refusal until its timeout and then said that
// llmctld did not answer. The start that started it stops it, and says so: it was left running,
// and the refusal told the user to stop it (the embedded one: llmctl daemon stop).
TEST_F(DaemonsTest, AControllerOfAnotherVersionIsRefusedAtItsFirstAnswerAndStopped) {
  const fs::path home = dir_ / "home";
  // It stays up; the test answers on its socket in its stead.
  const fs::path llmctld = dir_ / "llmctld";
  MakeExecutable(llmctld, "exec sleep 300\n");
  EmbeddedDaemons daemons(
      home,
      {.llmctld = fs::canonical(llmctld), .llm_agent = "/bin/false", .llm_train = "/bin/false"});
  std::future<Status> started = std::async(
      std::launch::async, [&daemons] { return daemons.EnsureRunning(std::chrono::seconds(10)); });
  // Its pid file is written after the old socket is removed and before it runs.
  const fs::path pid_file = home / "llmctld.pid";
  while (!fs::exists(pid_file) &&
         started.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
  }
  pid_t pid = 0;
  std::ifstream(pid_file) >> pid;
  AnotherVersionsController service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(daemons.controller_target(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const Status status = started.get();
  if (server != nullptr) server->Shutdown();
  const bool running = pid > 0 && Running(pid);
  if (running) StopProcess(pid, std::chrono::seconds(5));
  ASSERT_NE(server, nullptr);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  EXPECT_EQ(status.message(),
            "the controller is llmctl 0.0.1-another and this llmctl " + std::string(kVersion) +
                "; they must be the same version: install llmctl 0.0.1-another here, or run "
                "llmctl " +
                std::string(kVersion) +
                "'s llmctld; llmctl stopped the llmctld it had started (pid " +
                std::to_string(pid) + "), " + fs::canonical(llmctld).string() +
                ", which LLMCTL_LLMCTLD_BIN names or llmctl found beside it");
  EXPECT_FALSE(running) << "the llmctld it started runs on";
  EXPECT_FALSE(fs::exists(pid_file));
}

// An llmctld of another version that refuses this llmctl itself, in its own words: here a reason
// that ends in ')' and says " (the embedded one: " as the refusal's step for an embedded llmctld
// begins.
class RefusingController final : public v1::Controller::Service {
 public:
  static constexpr char kReason[] =
      "this llmctl is not the controller's llmctl 0.0.2 (the embedded one: its own words)";

 private:
  grpc::Status ListNodes(grpc::ServerContext*, const v1::ListNodesRequest*,
                         v1::ListNodesResponse*) override {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, kReason);
  }
};

// What llmctl prints when the llmctld it started refuses it: llmctld's reason whole, then that
// llmctl stopped it, and the step for an embedded llmctld at most once (here only where the reason
// says it). llmctl cut the refusal's text at the last " (the embedded one: " of a refusal that
// ended in ')', which cut llmctld's own reason short.
TEST_F(DaemonsTest, TheRefusalOfAStartedControllerIsPrintedWholeWithoutTheStepLlmctlTook) {
  const fs::path home = dir_ / "home";
  // It stays up; the test answers on its socket in its stead.
  const fs::path llmctld = dir_ / "bin" / "llmctld";
  fs::create_directories(llmctld.parent_path());
  MakeExecutable(llmctld, "exec sleep 300\n");
  const EnvLookup env = ControllerOnlyEnv(home, llmctld);
  std::ostringstream out;
  std::ostringstream err;
  CliContext context = testing::TestCliContext(env, out, err, dir_ / "bin");
  context.daemon_ready_timeout = std::chrono::seconds(30);  // it refuses at its first answer
  std::future<int> code = std::async(std::launch::async, [&context] {
    return RunLlmctl({"llmctl", "daemon", "start"}, context);
  });
  const fs::path pid_file = home / "llmctld.pid";
  while (!fs::exists(pid_file) &&
         code.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
  }
  pid_t pid = 0;
  std::ifstream(pid_file) >> pid;
  RefusingController service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + (home / "controller.sock").string(),
                           grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_EQ(code.get(), 1) << err.str();
  if (server != nullptr) server->Shutdown();
  const bool running = pid > 0 && Running(pid);
  if (running) StopProcess(pid, std::chrono::seconds(5));
  ASSERT_NE(server, nullptr);
  ASSERT_GT(pid, 0);
  const std::string said = err.str();
  EXPECT_EQ(said, std::string("llmctl: ") + RefusingController::kReason +
                      "; llmctl stopped the llmctld it had started (pid " + std::to_string(pid) +
                      "), " + fs::canonical(llmctld).string() +
                      ", which LLMCTL_LLMCTLD_BIN names or llmctl found beside it\n");
  size_t hints = 0;
  for (size_t at = said.find(rpc::kEmbeddedControllerHint); at != std::string::npos;
       at = said.find(rpc::kEmbeddedControllerHint, at + 1)) {
    ++hints;
  }
  EXPECT_EQ(hints, 1u) << said;  // the reason's own
  EXPECT_FALSE(running) << "the llmctld it started runs on";
  EXPECT_FALSE(fs::exists(pid_file));
  EXPECT_EQ(out.str(), "");
}

// An llmctld of another version that ran before the start (left by an earlier llmctl) is refused
// as one the start started is, and left running: only `llmctl daemon stop` stops it.
TEST_F(DaemonsTest, ARunningControllerOfAnotherVersionIsRefusedAndLeftRunning) {
  const fs::path home = dir_ / "home";
  fs::create_directories(home / "logs");
  const fs::path binary = SleepAsLlmctld();
  EmbeddedDaemons daemons(home, {binary, fs::canonical("/bin/false"), fs::canonical("/bin/false")});
  DaemonSpec controller = daemons.ControllerSpec();
  controller.args = {"300"};
  const StatusOr<pid_t> pid = StartReleased(controller);
  ASSERT_TRUE(pid.ok()) << pid.status().message();
  AnotherVersionsController service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(daemons.controller_target(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  const Status status = daemons.EnsureRunning(std::chrono::seconds(10));
  if (server != nullptr) server->Shutdown();
  const std::optional<pid_t> running = RunningPid(home / "llmctld.pid", binary);
  StopProcess(*pid, std::chrono::seconds(5));
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
  EXPECT_EQ(status.message(),
            "the controller is llmctl 0.0.1-another and this llmctl " + std::string(kVersion) +
                "; they must be the same version: install llmctl 0.0.1-another here, or run "
                "llmctl " +
                std::string(kVersion) + "'s llmctld (the embedded one: llmctl daemon stop)");
  EXPECT_EQ(running, *pid);
}

// A controller of this llmctl's version that answers at `answer_at`: an llmctld slow to come up.
// llmctl's calls wait 1 s each for its answer: one that would end less than half a second after
// `answer_at` is refused at once, as by an llmctld not serving yet, and llmctl asks again; the
// next is answered at `answer_at`, half a second or more before llmctl would give up on it.
class LateController final : public v1::Controller::Service {
 public:
  explicit LateController(std::chrono::steady_clock::time_point answer_at)
      : answer_at_(answer_at) {}

 private:
  grpc::Status ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest*,
                         v1::ListNodesResponse*) override {
    const auto waits_until =
        std::chrono::steady_clock::now() + (context->deadline() - std::chrono::system_clock::now());
    if (waits_until < answer_at_ + std::chrono::milliseconds(500)) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "not serving yet");
    }
    std::this_thread::sleep_until(answer_at_);
    rpc::AnnounceVersion(*context, kVersion);
    return grpc::Status::OK;
  }

  const std::chrono::steady_clock::time_point answer_at_;
};

// The user's one timeout bounds the whole start: the agent started once llmctld answered is given
// what is left of it. It was given a full timeout of its own after llmctld's, up to twice what was
// asked. Here llmctld answers after the timeout has passed, and the agent, which listens half a
// timeout after its start, is given none.
//
// No step depends on how fast this machine runs it within margins of half a second, where they
// were 150 and 250 ms. llmctld answers a timeout after the test sees its pid file, which the start
// writes after it fixed its timeout's end: past that end, whatever the delays; the call it answers
// waits half a second longer, and those it refuses come back half a second before that end, less
// the time from the start's beginning to its pid file (LateController). The agent's socket is made
// half a timeout (1 s) after the test sees the agent's pid file, unless the start ended first: an
// agent given a timeout of its own finds it with half a timeout to spare, and one given none gave
// up at its first look, made as soon as it runs, half a timeout before.
TEST_F(DaemonsTest, TheAgentIsGivenWhatIsLeftOfTheStartsTimeout) {
  const fs::path home = dir_ / "home";
  // Its credentials are there: the start registers no agent.
  ASSERT_NO_FATAL_FAILURE(WriteLocalAgentCredentials(home));
  // Both stay up; the test answers on llmctld's socket and makes the agent's in their stead.
  for (const char* name : {"llmctld", "llm-agent"}) {
    std::ofstream(dir_ / name) << "#!/bin/sh\nexec sleep 300\n";
    fs::permissions(dir_ / name, fs::perms::owner_all);
  }
  EmbeddedDaemons daemons(home, {.llmctld = fs::canonical(dir_ / "llmctld"),
                                 .llm_agent = fs::canonical(dir_ / "llm-agent"),
                                 .llm_train = "/bin/false"});
  constexpr std::chrono::milliseconds kTimeout{2000};
  std::future<Status> started = std::async(
      std::launch::async, [&daemons, kTimeout] { return daemons.EnsureRunning(kTimeout); });
  const auto written = [&](const fs::path& pid_file) {
    while (!fs::exists(pid_file) &&
           started.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready) {
    }
  };
  written(home / "llmctld.pid");
  LateController service(std::chrono::steady_clock::now() + kTimeout);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(daemons.controller_target(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  written(home / "llm-agent.pid");
  const int agent_socket = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (started.wait_for(kTimeout / 2) != std::future_status::ready) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    const std::string path = (home / "agent.sock").string();
    path.copy(address.sun_path, sizeof(address.sun_path) - 1);
    EXPECT_EQ(::bind(agent_socket, reinterpret_cast<const sockaddr*>(&address), sizeof address), 0);
  }
  const Status status = started.get();
  ::close(agent_socket);
  if (server != nullptr) server->Shutdown();
  pid_t pids[2] = {0, 0};
  std::ifstream(home / "llmctld.pid") >> pids[0];
  std::ifstream(home / "llm-agent.pid") >> pids[1];
  for (const pid_t pid : pids) {
    if (pid > 0) StopProcess(pid, std::chrono::seconds(5));
  }
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable) << status.ToString();
  EXPECT_EQ(status.message(), "llm-agent (pid " + std::to_string(pids[1]) + ") did not listen on " +
                                  daemons.agent_target() + "; see " +
                                  (home / "logs" / "llm-agent.log").string());
}

// The real llmctld refusing its configuration (here a config file with an unknown setting) makes
// `llmctl daemon start` exit 2 as llmctld did, with llmctld's message naming the file, and none of
// an earlier start's lines in its log. llmctl could not learn a detached daemon's exit code: it
// exited 1 with the log's last lines, whichever start wrote them. llmctld's line begins with its
// time in UTC, as its other log lines do (common/logging.h): it began with "llmctld: ".
TEST_F(DaemonsTest, AControllerThatRefusesItsConfigurationMakesDaemonStartExitWithItsCode) {
  const fs::path real = llmctl::testing::BuildDir() / "controller" / "llmctld";
  ASSERT_TRUE(fs::exists(real)) << real;
  const fs::path config = dir_ / "controller.yaml";
  std::ofstream(config) << "requeue_aftr: 5m\n";
  // Under llmctld's name: the real one, with the config file after what llmctl passes it.
  const fs::path llmctld = dir_ / "bin" / "llmctld";
  fs::create_directories(llmctld.parent_path());
  std::ofstream(llmctld) << "#!/bin/sh\nexec '" << fs::canonical(real).string()
                         << "' \"$@\" --config '" << config.string() << "'\n";
  fs::permissions(llmctld, fs::perms::owner_all);
  const fs::path home = dir_ / "home";
  fs::create_directories(home / "logs");
  fs::permissions(home, fs::perms::owner_all);
  const fs::path log = home / "logs" / "llmctld.log";
  std::ofstream(log) << "llmctld: an earlier start's line\n";
  const EnvLookup env = ControllerOnlyEnv(home, llmctld);
  std::ostringstream out;
  std::ostringstream err;
  CliContext context = testing::TestCliContext(env, out, err, dir_ / "bin");
  context.daemon_ready_timeout =
      std::chrono::seconds(30);  // ample for it to exit, whatever the load
  EXPECT_EQ(RunLlmctl({"llmctl", "daemon", "start"}, context), 2) << err.str();
  const std::string head =
      "llmctl: llmctld refused its configuration (exit code 2); what it wrote to " + log.string() +
      ":\n  ";
  const std::string line = "llmctld: " + config.string() +
                           ":1:1: unknown setting 'requeue_aftr' (known: data_dir, listen, "
                           "allow_remote_listen, token_file, requeue_after, agent_call_deadline, "
                           "min_transfer_rate, health_interval)\n";
  const std::string said = err.str();
  ASSERT_GE(said.size(), head.size() + line.size()) << said;
  EXPECT_EQ(said.substr(0, head.size()), head) << said;
  EXPECT_EQ(said.substr(said.size() - line.size()), line) << said;
  // Between them, the time: "[2026-12-02T04:05:06.789Z] [error] ".
  EXPECT_TRUE(
      std::regex_match(said.substr(head.size(), said.size() - head.size() - line.size()),
                       std::regex(R"(\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] \[error\] )")))
      << said;
  EXPECT_EQ(out.str(), "");
}

// The real llm-agent refusing its configuration (here a flag it does not know, after what llmctl
// passes it) makes `llmctl daemon start` exit 2 as llm-agent did, with what it wrote to its log.
// The agent was let go at once: the start succeeded, and the node never came up.
TEST_F(DaemonsTest, AnAgentThatRefusesItsConfigurationMakesDaemonStartExitWithItsCode) {
  const fs::path llmctld = llmctl::testing::BuildDir() / "controller" / "llmctld";
  ASSERT_TRUE(fs::exists(llmctld)) << llmctld;
  ASSERT_TRUE(fs::exists(AgentBinary())) << AgentBinary();
  // Under llm-agent's name: the real one, with the flag after what llmctl passes it.
  const fs::path agent = dir_ / "bin" / "llm-agent";
  fs::create_directories(agent.parent_path());
  std::ofstream(agent) << "#!/bin/sh\nexec '" << fs::canonical(AgentBinary()).string()
                       << "' \"$@\" --no-such-flag\n";
  fs::permissions(agent, fs::perms::owner_all);
  const fs::path home = dir_ / "home";
  fs::create_directories(home / "logs");
  fs::permissions(home, fs::perms::owner_all);
  const fs::path log = home / "logs" / "llm-agent.log";
  std::ofstream(log) << "llm-agent: an earlier start's line\n";
  const EnvLookup env = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "LLMCTL_HOME") return home.string();
    if (name == "LLMCTL_LLMCTLD_BIN") return fs::canonical(llmctld).string();
    if (name == "LLMCTL_AGENT_BIN") return agent.string();
    if (name == "LLMCTL_TRAIN_BIN") return "/bin/true";
    return std::nullopt;
  };
  std::ostringstream out;
  std::ostringstream err;
  CliContext context = testing::TestCliContext(env, out, err, dir_ / "bin");
  context.daemon_ready_timeout =
      std::chrono::seconds(30);  // ample for it to exit, whatever the load
  const int code = RunLlmctl({"llmctl", "daemon", "start"}, context);
  std::ostringstream stop_out;
  std::ostringstream stop_err;
  CliContext stop = testing::TestCliContext(env, stop_out, stop_err, dir_ / "bin");
  RunLlmctl({"llmctl", "daemon", "stop"}, stop);  // llmctld, which started and answered
  EXPECT_EQ(code, 2) << err.str();
  const std::string head =
      "llmctl: llm-agent refused its configuration (exit code 2); what it "
      "wrote to " +
      log.string() + ":\n";
  EXPECT_EQ(err.str().substr(0, head.size()), head) << err.str();
  EXPECT_NE(err.str().find("--no-such-flag"), std::string::npos) << err.str();
  EXPECT_EQ(err.str().find("an earlier start's line"), std::string::npos) << err.str();
  EXPECT_EQ(out.str(), "");
}

// llmctld refusing its data directory at start (one open to other users) is reported with its own
// reason and as this machine's to fix: it was Unavailable, and llmctl exited 3 asking whether the
// controller was running.
TEST_F(DaemonsTest, AControllerThatRefusesToStartIsReportedWithItsReason) {
  const fs::path home = dir_ / "home";
  const fs::path llmctld = dir_ / "llmctld";
  std::ofstream(llmctld) << "#!/bin/sh\necho '[2026-12-02T04:05:06.789Z] [error] llmctld: "
                            "FAILED_PRECONDITION: "
                         << home.string() << ": open to other users (mode 0755)' >&2\nexit 1\n";
  fs::permissions(llmctld, fs::perms::owner_all);
  EmbeddedDaemons daemons(
      home,
      {.llmctld = fs::canonical(llmctld), .llm_agent = "/bin/false", .llm_train = "/bin/false"});
  const Status started = daemons.EnsureRunning(std::chrono::seconds(10));
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition) << started.ToString();
  EXPECT_EQ(started.message().find("llmctld exited at start with code 1; what it wrote to " +
                                   (home / "logs" / "llmctld.log").string() + ":\n"),
            0u)
      << started.message();
  EXPECT_NE(started.message().find("llmctld: FAILED_PRECONDITION: " + home.string() +
                                   ": open to other users (mode 0755)"),
            std::string::npos)
      << started.message();
}

// The real llmctld says in its log that a signal stopped it: it ended without a word before.
TEST_F(DaemonsTest, TheRealControllerLogsItsStopOnSigterm) {
  const fs::path llmctld = llmctl::testing::BuildDir() / "controller" / "llmctld";
  ASSERT_TRUE(fs::exists(llmctld)) << llmctld;
  const fs::path data = dir_ / "data";
  fs::create_directories(data / "logs");
  fs::permissions(data, fs::perms::owner_all);
  EmbeddedDaemons daemons(
      data,
      {.llmctld = fs::canonical(llmctld), .llm_agent = "/bin/false", .llm_train = "/bin/false"});
  const fs::path log = data / "logs" / "llmctld.log";
  StatusOr<pid_t> pid = StartReleased(daemons.ControllerSpec());
  ASSERT_TRUE(pid.ok()) << pid.status().message();
  // Bounded wait for the socket; llmctld exiting instead is a failure the log explains.
  for (int i = 0; i < 400 && !fs::exists(data / "controller.sock") &&
                  RunningPid(data / "llmctld.pid", llmctld);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_TRUE(fs::exists(data / "controller.sock")) << LogTail(log, 20);

  EXPECT_FALSE(StopProcess(*pid, std::chrono::seconds(10))) << "it had to be killed";
  EXPECT_NE(LogTail(log, 20).find("llmctld: stopping (signal 15)"), std::string::npos)
      << LogTail(log, 20);
}

}  // namespace
}  // namespace llmctl::cli
