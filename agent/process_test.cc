// The agent's processes: a pidfd exit watch, and RunCommand's programs (their timeout after their
// output closes, their signals unblocked, their death with the agent).
#include "agent/process.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent_test_support.h"
#include "common/status.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
using test_support::FreshTestDir;

TEST(ProcessTest, ExitWatchIsReadableOnceTheProcessHasExited) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();  // until killed
    ::_exit(0);
  }
  const std::optional<uint64_t> start_time = ProcessStartTime(child);
  ASSERT_TRUE(start_time.has_value());
  EXPECT_FALSE(OpenExitWatch(child, *start_time + 1).valid()) << "another process's start time";
  UniqueFd watch = OpenExitWatch(child, *start_time);
  ASSERT_TRUE(watch.valid()) << "pidfd_open is refused here";
  pollfd exited{watch.get(), POLLIN, 0};
  EXPECT_EQ(::poll(&exited, 1, 0), 0) << "readable while the process runs";

  ::kill(child, SIGKILL);
  EXPECT_EQ(::poll(&exited, 1, 60 * 1000), 1);
  EXPECT_TRUE(exited.revents & POLLIN);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(OpenExitWatch(child, *start_time).valid()) << "the process is gone";
}

// A program's output and exit code; one that closes its standard output and then hangs is still
// killed at the timeout (its end of output is not its end).
TEST(ProcessTest, RunCommandHoldsAProgramToItsTimeoutAfterItsOutputCloses) {
  StatusOr<CommandOutput> said =
      RunCommand({"sh", "-c", "echo hi; echo why >&2; exit 3"}, std::chrono::seconds(60));
  ASSERT_TRUE(said.ok()) << said.status().ToString();
  EXPECT_EQ(said->stdout_text, "hi\n");
  EXPECT_EQ(said->stderr_tail, "why\n");
  EXPECT_EQ(said->exit_code, 3);

  // Without the deadline after EOF this call would wait out the 600 s sleep, past the test's
  // ctest timeout.
  StatusOr<CommandOutput> hung = RunCommand(
      {"sh", "-c", "echo part; exec 1>&- 2>&-; exec sleep 600"}, std::chrono::milliseconds(300));
  ASSERT_TRUE(hung.ok()) << hung.status().ToString();
  EXPECT_EQ(hung->stdout_text, "part\n");
  EXPECT_EQ(hung->exit_code, -1);

  EXPECT_EQ(RunCommand({"/no/such/program"}, std::chrono::seconds(1)).status().code(),
            StatusCode::kNotFound);
}

// A program given an environment has that one, none of the agent's.
TEST(ProcessTest, RunCommandGivesAProgramTheEnvironmentAskedFor) {
  ::setenv("LLMCTL_PROCESS_TEST_AGENTS", "agent's", 1);
  StatusOr<CommandOutput> said = RunCommand(
      {"sh", "-c", "echo \"$LLMCTL_PROCESS_TEST_GIVEN/$LLMCTL_PROCESS_TEST_AGENTS\""},
      std::chrono::seconds(60), {}, std::vector<std::string>{"LLMCTL_PROCESS_TEST_GIVEN=given"});
  ::unsetenv("LLMCTL_PROCESS_TEST_AGENTS");
  ASSERT_TRUE(said.ok()) << said.status().ToString();
  EXPECT_EQ(said->stdout_text, "given/\n");
}

// The agent blocks SIGINT and SIGTERM in every thread (for sigwait) and a mask survives exec: a
// command it runs (llm-train --version, the rate probe) starts with none blocked or ignored, or a
// SIGTERM sent to it (a user's pkill, the node's shutdown) would do nothing.
TEST(ProcessTest, RunCommandStartsTheProgramWithNoSignalBlockedOrIgnored) {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigset_t before;
  ASSERT_EQ(::pthread_sigmask(SIG_BLOCK, &stop_signals, &before), 0);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction hup_before {};
  ASSERT_EQ(::sigaction(SIGHUP, &ignore, &hup_before), 0);
  StatusOr<CommandOutput> status = RunCommand(
      {"sh", "-c", "exec grep -E '^Sig(Blk|Ign):' /proc/self/status"}, std::chrono::seconds(60));
  ::sigaction(SIGHUP, &hup_before, nullptr);
  ::pthread_sigmask(SIG_SETMASK, &before, nullptr);
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  std::istringstream lines(status->stdout_text);
  std::string blocked_label, blocked_hex, ignored_label, ignored_hex;
  lines >> blocked_label >> blocked_hex >> ignored_label >> ignored_hex;
  ASSERT_EQ(ignored_label, "SigIgn:") << status->stdout_text;
  EXPECT_EQ(std::stoull(blocked_hex, nullptr, 16), 0u) << status->stdout_text;
  const uint64_t ignored = std::stoull(ignored_hex, nullptr, 16);
  for (int signal : {SIGHUP, SIGINT, SIGTERM}) {  // bit signal - 1 of the mask
    EXPECT_EQ(ignored & (uint64_t{1} << (signal - 1)), 0u) << "signal " << signal;
  }
}

// A command is killed with the agent (SIGKILL, a crash): a rate probe left running would measure
// the machine beside the restarted agent's own probe, and both would store half its rates.
TEST(ProcessTest, RunCommandsProgramDiesWithTheAgent) {
  const fs::path dir = FreshTestDir("dies_with_agent");
  const std::string pid_file = (dir / "pid").string();
  const pid_t agent = ::fork();
  ASSERT_GE(agent, 0);
  if (agent == 0) {
    (void)RunCommand({"sh", "-c", "echo $$ > " + pid_file + "; exec sleep 600"},
                     std::chrono::seconds(600));
    ::_exit(0);
  }
  pid_t command = 0;
  for (int tries = 0; tries < 1000 && command == 0; ++tries) {
    std::ifstream in(pid_file);
    std::string line;
    if (std::getline(in, line) && in.good()) {
      command = std::stoi(line);  // a whole line: the shell has written all of it
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ::kill(agent, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(agent, &status, 0), agent);
  ASSERT_GT(command, 0) << "the command never wrote " << pid_file;
  bool gone = false;
  for (int tries = 0; tries < 1000 && !gone; ++tries) {
    gone = !ProcessStartTime(command).has_value();  // a zombie left for init counts as gone
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone) << "the command (pid " << command << ") outlived the agent";
  if (!gone) ::kill(-command, SIGKILL);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmctl::agent
