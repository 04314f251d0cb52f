#include "controller/cli/daemons.h"

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
#include "controller/cli/offline_cli_test.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/certificates.h"
#include "rpc/version_check.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli {
namespace {

namespace fs = std::filesystem;

class DaemonsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/llmctl-daemons-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  void MakeExecutable(const fs::path& path) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << "#!/bin/sh\n";
    fs::permissions(path, fs::perms::owner_all);
  }

  // /bin/sleep copied to bin/llmctld: a stand-in under llmctld's name, which its args keep
  // running.
  fs::path SleepAsLlmctld() {
    fs::create_directories(dir_ / "bin");
    fs::copy_file("/bin/sleep", dir_ / "bin" / "llmctld");
    return fs::canonical(dir_ / "bin" / "llmctld");
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

DaemonSpec Sleeper(const fs::path& dir) {
  return {
      "sleeper", fs::canonical("/bin/sleep"), {"300"}, dir / "sleeper.pid", dir / "sleeper.log"};
}

// StartDetached's daemon let go at once, as EnsureRunning lets the agent go: its pid.
StatusOr<pid_t> StartReleased(const DaemonSpec& spec) {
  StatusOr<StartedDaemon> started = StartDetached(spec);
  if (!started.ok()) return started.status();
  return started->pid();
}

// The parent pid of `pid` (/proc/PID/stat), 0 when it is gone.
pid_t ParentOf(pid_t pid) {
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
bool Running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

TEST_F(DaemonsTest, StartsDetachedFindsItByPidFileAndStopsIt) {
  StatusOr<pid_t> pid = StartReleased(Sleeper(dir_));
  ASSERT_TRUE(pid.ok()) << pid.status().message();
  EXPECT_EQ(RunningPid(dir_ / "sleeper.pid", "/bin/sleep"), *pid);
  EXPECT_NE(::getsid(*pid), ::getsid(0));  // its own session: it outlives our terminal
  EXPECT_FALSE(StopProcess(*pid, std::chrono::seconds(10)));  // ended on SIGTERM
  EXPECT_EQ(RunningPid(dir_ / "sleeper.pid", "/bin/sleep"), std::nullopt);
}

// Whether a process runs `binary` with exactly the argument `arg` (/proc/PID/cmdline).
bool RunsWithArgument(const fs::path& binary, const std::string& arg) {
  const std::string wanted = binary.string() + '\0' + arg + '\0';
  for (const fs::directory_entry& entry : fs::directory_iterator("/proc")) {
    std::ifstream cmdline(entry.path() / "cmdline", std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(cmdline)),
                           std::istreambuf_iterator<char>());
    if (text == wanted) return true;
  }
  return false;
}

// A daemon whose pid file cannot be written (here its directory is missing; on a full disk "No
// space left on device") is stopped, and the error is the file's: it was left running where
// nothing finds it (llmctl daemon stop, the next start failing on its lock), and the error was
// Unavailable, which llmctl shows as an unreachable controller.
TEST_F(DaemonsTest, ADaemonWhosePidFileCannotBeWrittenIsStopped) {
  DaemonSpec spec = Sleeper(dir_);
  spec.pid_file = dir_ / "missing" / "sleeper.pid";
  const std::string unique = std::to_string(300 + ::getpid() % 1000) + ".25";  // sleep's seconds
  spec.args = {unique};
  const StatusOr<pid_t> pid = StartReleased(spec);
  EXPECT_EQ(pid.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(
      pid.status().message().find("sleeper not started: cannot create " + spec.pid_file.string()),
      std::string::npos)
      << pid.status().message();
  EXPECT_FALSE(RunsWithArgument(spec.binary, unique));
  if (pid.ok()) StopProcess(*pid, std::chrono::seconds(10));
}

// llmctl ended (Ctrl-C, kill -9) after it started a daemon and before it wrote the daemon's pid
// file: the daemon now never runs its program. It ran on where nothing found it: llmctl daemon stop
// said "not running", and the next command removed its socket and failed on its lock ("another
// llmctld (pid N) is using the data directory"). Here SIGXFSZ ends the starting process at the pid
// file's write.
TEST_F(DaemonsTest, ADaemonWhoseStarterEndsBeforeItsPidFileNeverRuns) {
  DaemonSpec spec = Sleeper(dir_);
  const std::string unique = std::to_string(300 + ::getpid() % 1000) + ".5";  // sleep's seconds
  spec.args = {unique};
  const pid_t starter = ::fork();
  ASSERT_GE(starter, 0);
  if (starter == 0) {
    const rlimit one_byte{1, 1};  // the pid file's second byte is refused
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_FSIZE, &one_byte);
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::signal(SIGXFSZ, SIG_DFL);
    (void)StartDetached(spec);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(starter, &status, 0), starter);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ) << status;
  // Without the fix the daemon runs, for the minutes it sleeps.
  EXPECT_FALSE(RunsWithArgument(spec.binary, unique));
}

TEST_F(DaemonsTest, APidFileOfAnotherProgramIsNotBelieved) {
  std::ofstream(dir_ / "other.pid") << ::getpid() << "\n";  // this test binary, not sleep
  EXPECT_EQ(RunningPid(dir_ / "other.pid", "/bin/sleep"), std::nullopt);
  std::ofstream(dir_ / "garbage.pid") << "not a pid\n";
  EXPECT_EQ(RunningPid(dir_ / "garbage.pid", "/bin/sleep"), std::nullopt);
  EXPECT_EQ(RunningPid(dir_ / "absent.pid", "/bin/sleep"), std::nullopt);
}

// llmctl upgraded into another folder while its daemons ran: the new llmctl neither removes the
// running llmctld's socket nor starts a second one on the data directory; it names both binaries
// and `llmctl daemon stop`, which ends the old one. It used to take the old one for none, remove
// its socket and start its own, which failed on the data directory's lock (and a second llm-agent,
// which has no lock, would have managed the same runs).
TEST_F(DaemonsTest, ADaemonOfAnotherLlmctlIsNamedNotReplacedAndStops) {
  const fs::path data = dir_ / "data";
  fs::create_directories(data / "logs");
  // Stand-ins for the two installs' llmctld: sleep under its name.
  for (const char* install : {"old", "new"}) {
    fs::create_directories(dir_ / install);
    fs::copy_file("/bin/sleep", dir_ / install / "llmctld");
  }
  const fs::path old_binary = fs::canonical(dir_ / "old" / "llmctld");
  const fs::path new_binary = fs::canonical(dir_ / "new" / "llmctld");
  DaemonSpec old_controller =
      EmbeddedDaemons(data, {old_binary, fs::canonical("/bin/false"), fs::canonical("/bin/false")})
          .ControllerSpec();
  old_controller.args = {"300"};
  StatusOr<pid_t> pid = StartReleased(old_controller);
  ASSERT_TRUE(pid.ok()) << pid.status().message();
  std::ofstream(data / "controller.sock") << "";  // its socket

  EmbeddedDaemons daemons(data,
                          {new_binary, fs::canonical("/bin/false"), fs::canonical("/bin/false")});
  const Status started = daemons.EnsureRunning(std::chrono::seconds(5));
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(started.message(),
            "llmctld (pid " + std::to_string(*pid) + ") runs " + old_binary.string() +
                ", not this llmctl's " + new_binary.string() +
                " (llmctl was upgraded or moved while its daemons ran): run llmctl daemon stop "
                "(trials already running go on), then this command again");
  EXPECT_TRUE(fs::exists(data / "controller.sock"));
  EXPECT_EQ(RunningPid(data / "llmctld.pid", old_binary), *pid);
  EXPECT_EQ(RunningPid(data / "llmctld.pid", new_binary), std::nullopt);
  EXPECT_EQ(daemons.Describe()[1], "llmctld: running (pid " + std::to_string(*pid) +
                                       ", another llmctl's " + old_binary.string() +
                                       "), unix:" + (data / "controller.sock").string() + ", log " +
                                       (data / "logs" / "llmctld.log").string());

  const StatusOr<std::vector<std::string>> stopped = daemons.Stop(std::chrono::seconds(10));
  ASSERT_TRUE(stopped.ok()) << stopped.status().message();
  ASSERT_EQ(stopped->size(), 2u);
  EXPECT_EQ((*stopped)[1], "llmctld (pid " + std::to_string(*pid) + "): stopped");
  EXPECT_EQ(RunningPid(data / "llmctld.pid", old_binary), std::nullopt);
  // Without the fix nothing stopped it: the stand-in this test started, while it still runs.
  std::error_code error;
  if (fs::read_symlink("/proc/" + std::to_string(*pid) + "/exe", error) == old_binary) {
    ::kill(*pid, SIGKILL);
  }
}

// llmctl rebuilt or upgraded in place while its daemons ran: the daemon, still the data
// directory's, runs the earlier code that this llmctl's commands reach; a note says so and how to
// restart it, and `daemon stop` stops it.
TEST_F(DaemonsTest, ADaemonWhoseBinaryWasReplacedSinceItStartedIsNoted) {
  const fs::path data = dir_ / "data";
  fs::create_directories(data / "logs");
  const fs::path binary = SleepAsLlmctld();
  EmbeddedDaemons daemons(data, {binary, fs::canonical("/bin/false"), fs::canonical("/bin/false")});
  DaemonSpec controller = daemons.ControllerSpec();
  controller.args = {"300"};
  StatusOr<pid_t> pid = StartReleased(controller);
  ASSERT_TRUE(pid.ok()) << pid.status().message();
  EXPECT_TRUE(daemons.ReplacedBinaryNotes().empty());

  // As a build or an unpacked bundle replaces it: a new file at the same path.
  fs::remove(binary);
  fs::copy_file("/bin/sleep", binary);
  EXPECT_EQ(daemons.ReplacedBinaryNotes(),
            std::vector<std::string>{
                "llmctld (pid " + std::to_string(*pid) + ") runs " + binary.string() +
                " as it was before it was rebuilt or replaced, not this llmctl's: llmctl daemon "
                "stop, and the next command starts the new one (trials already running go on)"});
  EXPECT_EQ(RunningPid(data / "llmctld.pid", binary), *pid);
  const StatusOr<std::vector<std::string>> stopped = daemons.Stop(std::chrono::seconds(10));
  ASSERT_TRUE(stopped.ok()) << stopped.status().message();
  ASSERT_EQ(stopped->size(), 2u);
  EXPECT_EQ((*stopped)[1], "llmctld (pid " + std::to_string(*pid) + "): stopped");
}

// `llmctl daemon stop` while another llmctl starts the daemons: the stop waits for the start,
// which holds daemons.lock until both daemons run, and then stops what it started. It went at once:
// finding no daemon yet, it removed the pid file the start then wrote or had just written (a daemon
// nothing found again, beside which the next start failed on llmctld's lock), or it ended the
// controller the start was waiting for, whose command then said llmctld had exited at start.
TEST_F(DaemonsTest, AStopWaitsForAStartUnderWayAndStopsWhatItStarted) {
  const fs::path data = dir_ / "data";
  fs::create_directories(data / "logs");
  const fs::path binary = SleepAsLlmctld();
  EmbeddedDaemons daemons(data, {binary, fs::canonical("/bin/false"), fs::canonical("/bin/false")});
  std::future<StatusOr<std::vector<std::string>>> stopped;
  pid_t started = 0;
  {
    // A start under way, as EnsureRunning holds it.
    StatusOr<FileLock> start = FileLock::Acquire(data / "daemons.lock");
    ASSERT_TRUE(start.ok()) << start.status().message();
    stopped =
        std::async(std::launch::async, [&] { return daemons.Stop(std::chrono::seconds(10)); });
    // Room for a stop that does not wait to end before the start writes its pid file.
    stopped.wait_for(std::chrono::milliseconds(500));
    DaemonSpec controller = daemons.ControllerSpec();
    controller.args = {"300"};
    StatusOr<pid_t> pid = StartReleased(controller);
    ASSERT_TRUE(pid.ok()) << pid.status().message();
    started = *pid;
  }
  const StatusOr<std::vector<std::string>> lines = stopped.get();
  ASSERT_TRUE(lines.ok()) << lines.status().message();
  EXPECT_EQ(*lines,
            (std::vector<std::string>{"llm-agent: not running",
                                      "llmctld (pid " + std::to_string(started) + "): stopped"}));
  EXPECT_EQ(RunningPid(data / "llmctld.pid", binary), std::nullopt);
  // Without the fix the stand-in this test started runs on.
  std::error_code error;
  if (fs::read_symlink("/proc/" + std::to_string(started) + "/exe", error) == binary) {
    ::kill(started, SIGKILL);
  }
}

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
  std::ofstream(llmctld) << "#!/bin/sh\nkill -s KILL $$\n";
  fs::permissions(llmctld, fs::perms::owner_all);
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
  std::ofstream(llmctld) << "#!/bin/sh\nexec sleep 300\n";
  fs::permissions(llmctld, fs::perms::owner_all);
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

// A controller of this llmctl's version whose first answer waits until `answer_at`: an llmctld
// slow to come up.
class LateController final : public v1::Controller::Service {
 public:
  explicit LateController(std::chrono::steady_clock::time_point answer_at)
      : answer_at_(answer_at) {}

 private:
  grpc::Status ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest*,
                         v1::ListNodesResponse*) override {
    std::this_thread::sleep_until(answer_at_);
    rpc::AnnounceVersion(*context, kVersion);
    return grpc::Status::OK;
  }

  const std::chrono::steady_clock::time_point answer_at_;
};

// The user's one timeout bounds the whole start: the agent started once llmctld answered is given
// what is left of it. It was given a full timeout of its own after llmctld's, up to twice what was
// asked. Here llmctld answers after the timeout has passed, and the agent, which listens well
// within a timeout of its own, is given none.
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
  // Short enough that llmctld's late answer still comes within its call's 1 s deadline.
  constexpr std::chrono::milliseconds kTimeout{500};
  const auto begun = std::chrono::steady_clock::now();
  std::future<Status> started = std::async(
      std::launch::async, [&daemons, kTimeout] { return daemons.EnsureRunning(kTimeout); });
  const auto written = [&](const fs::path& pid_file) {
    while (!fs::exists(pid_file) &&
           started.wait_for(std::chrono::milliseconds(5)) != std::future_status::ready) {
    }
  };
  written(home / "llmctld.pid");
  LateController service(begun + kTimeout + std::chrono::milliseconds(150));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(daemons.controller_target(), grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  const std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  // The agent's socket, made well within a timeout of the agent's own.
  written(home / "llm-agent.pid");
  const int agent_socket = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (started.wait_for(std::chrono::milliseconds(250)) != std::future_status::ready) {
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
  const EnvLookup env = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "LLMCTL_HOME") return home.string();
    if (name == "LLMCTL_LLMCTLD_BIN") return llmctld.string();
    if (name == "LLMCTL_AGENT_BIN" || name == "LLMCTL_TRAIN_BIN") return "/bin/false";
    return std::nullopt;
  };
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
  // Between them, the time: "[2026-12-02T04:05:06.789Z] [info] ".
  EXPECT_TRUE(
      std::regex_match(said.substr(head.size(), said.size() - head.size() - line.size()),
                       std::regex(R"(\[\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\] \[info\] )")))
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
  std::ofstream(llmctld) << "#!/bin/sh\necho '[2026-12-02T04:05:06.789Z] [info] llmctld: "
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

TEST_F(DaemonsTest, LogTailKeepsTheLastLines) {
  std::ofstream(dir_ / "x.log") << "one\ntwo\nthree\n";
  EXPECT_EQ(LogTail(dir_ / "x.log", 2), "  two\n  three\n");
  // From an offset, as a daemon's start left it: only what followed.
  EXPECT_EQ(LogTail(dir_ / "x.log", 5, 4), "  two\n  three\n");
  EXPECT_EQ(LogTail(dir_ / "x.log", 5, 14), "");
}

// A FIFO in place of the pid file or the log is not waited on (llmctl once hung on one). Each
// read runs on a thread that, should it block after all, is released by opening the FIFO's other
// end, so the test ends either way.
TEST_F(DaemonsTest, AFifoInPlaceOfThePidFileOrTheLogIsNotWaitedOn) {
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto in_time = [&](auto read) {
    std::packaged_task<void()> task(read);
    std::future<void> done = task.get_future();
    std::thread reader(std::move(task));
    const bool ready = done.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
    if (!ready) {
      const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (writer >= 0) ::close(writer);
    }
    reader.join();
    return ready;
  };
  std::optional<pid_t> pid = 7;
  EXPECT_TRUE(in_time([&] { pid = RunningPid(fifo, "/bin/sleep"); })) << "the pid file blocked";
  EXPECT_EQ(pid, std::nullopt);
  std::string tail = "unset";
  EXPECT_TRUE(in_time([&] { tail = LogTail(fifo, 5); })) << "the log blocked";
  EXPECT_EQ(tail, "");
}

TEST_F(DaemonsTest, LogTailReadsOnlyTheEndOfALongLog) {
  // 1 MiB without a newline, then two lines: only the end is read, its cut first line left out.
  std::ofstream(dir_ / "long.log") << std::string(1 << 20, 'x') << "\nlast but one\nlast\n";
  EXPECT_EQ(LogTail(dir_ / "long.log", 3), "  last but one\n  last\n");
  std::ofstream(dir_ / "one.log") << std::string(1 << 20, 'y');
  const std::string tail = LogTail(dir_ / "one.log", 3);
  EXPECT_LE(tail.size(), 70u * 1024);
  EXPECT_EQ(tail.find_first_not_of('y', 2), tail.size() - 1);  // "  yyy...y\n"
}

TEST_F(DaemonsTest, APidFileWithMoreThanAPidIsNotBelieved) {
  StatusOr<pid_t> pid = StartReleased(Sleeper(dir_));
  ASSERT_TRUE(pid.ok()) << pid.status().message();
  std::ofstream(dir_ / "padded.pid") << "  " << *pid << "\n";
  EXPECT_EQ(RunningPid(dir_ / "padded.pid", "/bin/sleep"), *pid);
  std::ofstream(dir_ / "trailing.pid") << *pid << "x\n";
  EXPECT_EQ(RunningPid(dir_ / "trailing.pid", "/bin/sleep"), std::nullopt);
  std::ofstream(dir_ / "long.pid") << *pid << std::string(100, ' ') << "\n";
  EXPECT_EQ(RunningPid(dir_ / "long.pid", "/bin/sleep"), std::nullopt);
  EXPECT_FALSE(StopProcess(*pid, std::chrono::seconds(10)));
}

// Credentials of every part, each a word that names it.
v1::NodeCredentials SomeCredentials() {
  v1::NodeCredentials credentials;
  credentials.set_certificate_pem("CERT");
  credentials.set_private_key_pem("KEY");
  credentials.set_ca_certificate_pem("CA");
  credentials.set_token("TOKEN");
  return credentials;
}

TEST_F(DaemonsTest, CredentialsAreWrittenOwnerOnly) {
  v1::NodeCredentials credentials = SomeCredentials();
  const fs::path tls = dir_ / "agent" / "tls";
  ASSERT_TRUE(WriteAgentCredentials(credentials, tls).ok());
  EXPECT_EQ(fs::status(tls).permissions() & fs::perms::all, fs::perms::owner_all);
  for (const char* name : {"ca.crt", "agent.crt", "agent.key", "token"}) {
    EXPECT_EQ(fs::status(tls / name).permissions() & fs::perms::all,
              fs::perms::owner_read | fs::perms::owner_write)
        << name;
  }
  std::ifstream token(tls / "token");
  std::string text((std::istreambuf_iterator<char>(token)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "TOKEN");

  credentials.clear_token();
  EXPECT_EQ(WriteAgentCredentials(credentials, dir_ / "other").code(),
            StatusCode::kInvalidArgument);
}

// Credentials the disk will not take (here past RLIMIT_FSIZE, which fails the write with EFBIG as a
// full disk fails it with ENOSPC) are this machine's failure: the write's Unavailable had llmctl
// exit 3 asking whether the embedded controller, which had just answered, was running.
TEST_F(DaemonsTest, CredentialsTheDiskWillNotTakeAreNotTheControllersFailure) {
  const v1::NodeCredentials credentials = SomeCredentials();
  const fs::path tls = dir_ / "agent" / "tls";
  Status written;
  {
    const llmctl::testing::ScopedFileSizeLimit no_bytes(0);
    ASSERT_TRUE(no_bytes.ok());
    written = WriteAgentCredentials(credentials, tls);
  }
  EXPECT_EQ(written.code(), StatusCode::kFailedPrecondition) << written.ToString();
  EXPECT_NE(written.message().find("cannot write " + (tls / "ca.crt").string() + ": "),
            std::string::npos)
      << written.message();
  EXPECT_NE(written.message().find("File too large"), std::string::npos) << written.message();
}

// LLMCTL_HOME may name a directory that is there already, shared with others (/tmp as root): its
// mode is left as it is, and a link where the daemons' logs would go is refused, not followed.
TEST_F(DaemonsTest, AnExistingHomeKeepsItsModeAndALinkInItIsRefused) {
  const fs::path home = dir_ / "home";
  fs::create_directories(home);
  fs::permissions(home, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                            fs::perms::others_read | fs::perms::others_exec);
  const fs::path elsewhere = dir_ / "elsewhere";
  fs::create_directories(elsewhere);
  fs::permissions(elsewhere, fs::perms::owner_all | fs::perms::others_read);
  fs::create_directory_symlink(elsewhere, home / "logs");
  EmbeddedDaemons daemons(
      home, {.llmctld = "/bin/false", .llm_agent = "/bin/false", .llm_train = "/bin/false"});
  const Status started = daemons.EnsureRunning(std::chrono::seconds(1));
  EXPECT_EQ(started.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(started.message(), (home / "logs").string() + ": a symbolic link, not a directory");
  EXPECT_EQ(fs::status(home).permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                fs::perms::others_read | fs::perms::others_exec);
  EXPECT_EQ(fs::status(elsewhere).permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::others_read);
  EXPECT_TRUE(fs::is_empty(elsewhere));
}

// A home too long for the daemons' sockets is refused before anything is made or started, saying
// the limit and what to do: llmctld failed at its listen with gRPC's "cannot listen on unix:...".
TEST_F(DaemonsTest, AHomeTooLongForTheSocketsIsRefusedNamingTheLimit) {
  // 92 bytes and more make D/controller.sock longer than 107.
  const fs::path home = dir_ / std::string(92 - dir_.string().size() - 1, 'h');
  ASSERT_EQ(home.string().size(), 92u);
  EmbeddedDaemons daemons(
      home, {.llmctld = "/bin/false", .llm_agent = "/bin/false", .llm_train = "/bin/false"});
  const Status started = daemons.EnsureRunning(std::chrono::seconds(1));
  EXPECT_EQ(started.code(), StatusCode::kInvalidArgument) << started.ToString();
  EXPECT_EQ(started.message(),
            "the embedded daemons' socket " + (home / "controller.sock").string() +
                " is 108 bytes, over the system's 107-byte limit for a unix socket's path: set "
                "LLMCTL_HOME to a directory whose path is at most 91 bytes (this one's is 92), or "
                "LLMCTL_CONTROLLER to a running controller");
  EXPECT_FALSE(fs::exists(home));
}

TEST_F(DaemonsTest, BinariesBesideLlmctlOrInTheBuildTreeOrFromOverrides) {
  auto no_env = [](std::string_view) -> std::optional<std::string> { return std::nullopt; };
  // The build tree: build/controller/cli/llmctl, build/controller/llmctld, ...
  const fs::path build = dir_ / "build";
  MakeExecutable(build / "controller" / "llmctld");
  MakeExecutable(build / "agent" / "llm-agent");
  MakeExecutable(build / "trainer" / "llm-train");
  StatusOr<DaemonBinaries> found = LocateDaemonBinaries(build / "controller/cli/llmctl", no_env);
  ASSERT_TRUE(found.ok()) << found.status().message();
  EXPECT_EQ(found->llm_agent, fs::canonical(build / "agent" / "llm-agent"));

  // An install: all in one folder.
  const fs::path bin = dir_ / "bin";
  for (const char* name : {"llmctld", "llm-agent", "llm-train"}) MakeExecutable(bin / name);
  found = LocateDaemonBinaries(bin / "llmctl", no_env);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->llmctld, fs::canonical(bin / "llmctld"));

  // Overrides win, and a wrong one is named.
  MakeExecutable(dir_ / "custom-agent");
  auto env = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "LLMCTL_AGENT_BIN") return (dir_ / "custom-agent").string();
    return std::nullopt;
  };
  EXPECT_EQ(LocateDaemonBinaries(bin / "llmctl", env)->llm_agent,
            fs::canonical(dir_ / "custom-agent"));
  auto wrong = [](std::string_view name) -> std::optional<std::string> {
    if (name == "LLMCTL_TRAIN_BIN") return "/nonexistent/llm-train";
    return std::nullopt;
  };
  Status status = LocateDaemonBinaries(bin / "llmctl", wrong).status();
  EXPECT_EQ(status.message(), "LLMCTL_TRAIN_BIN=/nonexistent/llm-train is not an executable file");

  Status missing = LocateDaemonBinaries(dir_ / "empty" / "llmctl", no_env).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("set LLMCTL_LLMCTLD_BIN"), std::string::npos);
}

// The flags EnsureRunning passes and the credential files it writes, against the real llm-agent: it
// must come up on D/agent.sock with them, and end on `daemon stop`.
TEST_F(DaemonsTest, TheRealAgentStartsWithTheFlagsAndCredentialsWeWrite) {
  const fs::path agent_binary = AgentBinary();
  ASSERT_TRUE(fs::exists(agent_binary)) << agent_binary;
  const fs::path data = dir_ / "data";
  ASSERT_NO_FATAL_FAILURE(WriteLocalAgentCredentials(data));

  EmbeddedDaemons daemons(
      data, {fs::canonical("/bin/false"), fs::canonical(agent_binary), fs::canonical("/bin/true")});
  StatusOr<pid_t> pid = StartReleased(daemons.AgentSpec());
  ASSERT_TRUE(pid.ok()) << pid.status().message();
  // Bounded wait for the socket; the agent exiting instead is the failure this test looks for.
  for (int i = 0; i < 400 && !fs::exists(data / "agent.sock") &&
                  RunningPid(data / "llm-agent.pid", agent_binary);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  EXPECT_TRUE(fs::exists(data / "agent.sock")) << LogTail(data / "logs" / "llm-agent.log", 20);
  EXPECT_EQ(RunningPid(data / "llm-agent.pid", agent_binary), *pid);

  const StatusOr<std::vector<std::string>> stopped = daemons.Stop(std::chrono::seconds(10));
  ASSERT_TRUE(stopped.ok()) << stopped.status().message();
  EXPECT_EQ(*stopped,
            (std::vector<std::string>{
                "llm-agent (pid " + std::to_string(*pid) + "): stopped", "llmctld: not running",
                "trials already running go on, and are picked up when the daemons start again"}));
  EXPECT_EQ(RunningPid(data / "llm-agent.pid", agent_binary), std::nullopt);
}

// llm-agent stopped (SIGTERM) while its rate probe (llm-train --probe, run at its start) runs:
// it kills the probe's process group and exits at once. It used to wait for the probe's end, up to
// its 3-minute timeout, and `daemon stop` had to SIGKILL it.
TEST_F(DaemonsTest, TheRealAgentStopsAtOnceWhileItsRateProbeRuns) {
  const fs::path agent_binary = AgentBinary();
  ASSERT_TRUE(fs::exists(agent_binary)) << agent_binary;
  const fs::path data = dir_ / "data";
  ASSERT_NO_FATAL_FAILURE(WriteLocalAgentCredentials(data));
  // A stand-in llm-train whose probe writes its pid and would take a minute.
  const fs::path trainer = dir_ / "llm-train";
  const fs::path probe_pid = dir_ / "probe.pid";
  std::ofstream(trainer) << "#!/bin/sh\n[ \"$1\" = --probe ] || exit 0\necho $$ > '"
                         << probe_pid.string() << "'\nexec sleep 60\n";
  fs::permissions(trainer, fs::perms::owner_all);

  // The probe runs unless LLMCTL_RATE_PROBE=off, which the tests' environment may set.
  const char* saved = std::getenv("LLMCTL_RATE_PROBE");
  const std::string saved_value = saved != nullptr ? saved : "";
  ::unsetenv("LLMCTL_RATE_PROBE");
  EmbeddedDaemons daemons(
      data, {fs::canonical("/bin/false"), fs::canonical(agent_binary), fs::canonical(trainer)});
  StatusOr<pid_t> pid = StartReleased(daemons.AgentSpec());
  if (saved != nullptr) ::setenv("LLMCTL_RATE_PROBE", saved_value.c_str(), 1);
  ASSERT_TRUE(pid.ok()) << pid.status().message();
  for (int i = 0; i < 800 && !fs::exists(probe_pid); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ASSERT_TRUE(fs::exists(probe_pid)) << LogTail(data / "logs" / "llm-agent.log", 20);

  const auto stopping = std::chrono::steady_clock::now();
  EXPECT_FALSE(StopProcess(*pid, std::chrono::seconds(10))) << "it had to be killed";
  EXPECT_LT(std::chrono::steady_clock::now() - stopping, std::chrono::seconds(3))
      << LogTail(data / "logs" / "llm-agent.log", 20);
  std::ifstream in(probe_pid);
  pid_t probe = 0;
  ASSERT_TRUE(in >> probe);
  for (int i = 0; i < 200 && ::kill(probe, 0) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(::kill(probe, 0), 0) << "the probe outlived the agent";
}

}  // namespace
}  // namespace llmctl::cli
