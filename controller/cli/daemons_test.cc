// The embedded daemons' lifecycle: starting one detached, finding it by its pid file, stopping it;
// pid files and logs not to be believed or waited on; the local agent's credentials; the home and
// the binaries; the real llm-agent started as llmctl starts it. How a daemon's end at start is
// reported is daemons_start_test.cc's.
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
#include "controller/cli/daemons_test_support.h"
#include "controller/cli/offline_cli_test.h"
#include "llmctl/v1/controller.grpc.pb.h"
#include "rpc/certificates.h"
#include "rpc/version_check.h"
#include "tests/support/file_size_limit.h"
#include "tests/support/shell_command.h"

namespace llmctl::cli {
namespace {

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
