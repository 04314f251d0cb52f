// RunCommand's programs: their output and exit code, their timeout after their output closes,
// the environment given, their signals unblocked.
#include "common/run_command.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl {
namespace {

// A program's output and exit code; one that closes its standard output and then hangs is still
// killed at the timeout (its end of output is not its end).
TEST(RunCommandTest, RunCommandHoldsAProgramToItsTimeoutAfterItsOutputCloses) {
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

// A program given an environment has that one, none of this process's.
TEST(RunCommandTest, RunCommandGivesAProgramTheEnvironmentAskedFor) {
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
TEST(RunCommandTest, RunCommandStartsTheProgramWithNoSignalBlockedOrIgnored) {
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

}  // namespace
}  // namespace llmctl
