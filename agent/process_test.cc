// The agent's processes: a pidfd exit watch, and a program RunCommand runs dying with the agent.
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
#include "common/run_command.h"
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
