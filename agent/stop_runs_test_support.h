// StopRuns, what the fixtures of the tests with real runs (agent_test_support.h's AgentTest,
// hub_test.cc's, tests/integration/controller_agent_fixture.h's ControllerAgentTest) call in their
// TearDown: a run's supervisor and worker outlive their agent by design (agent/runs.h), so a test
// that failed midway, with a trial still running, left its workers (llm-train or the fake trainer)
// busy on the machine's cores after the test process had ended.
#ifndef LLMCTL_AGENT_STOP_RUNS_TEST_SUPPORT_H_
#define LLMCTL_AGENT_STOP_RUNS_TEST_SUPPORT_H_

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <thread>

#include "agent/process.h"
#include "agent/run_files.h"
#include "agent/supervisor.h"

namespace llmctl::agent::test_support {

// Sends SIGKILL to `target` (`pid`, or a process group as -pgid) if the process `pid` started at
// `start_time` runs, and waits until it has ended, for a bounded while.
inline void KillUntilGone(pid_t target, pid_t pid, uint64_t start_time) {
  if (pid <= 1 || !IsSameProcessAlive(pid, start_time)) return;
  ::kill(target, SIGKILL);
  for (int i = 0; i < 500 && IsSameProcessAlive(pid, start_time); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Stops the runs under the agent data directory `data_dir`, each as the agent stops one whose
// supervisor is gone (RunManager::CheckRun): the supervisor first, so that it starts nothing
// more, then the worker's whole process group from worker.json, each only while the process the
// file names still runs (a pid the kernel reused is left alone).
inline void StopRuns(const std::filesystem::path& data_dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  // runs/<experiment>/<trial>/<attempt>: a run's directory is at depth 2.
  for (auto run = fs::recursive_directory_iterator(data_dir / "runs", error);
       run != fs::recursive_directory_iterator(); run.increment(error)) {
    if (run.depth() < 2) continue;
    run.disable_recursion_pending();
    const std::string dir = run->path().string();
    if (const auto supervisor = ReadJsonObject(dir + "/" + kSupervisorFile)) {
      const pid_t pid = JsonFieldOr(*supervisor, "pid", pid_t{0});
      KillUntilGone(pid, pid, JsonFieldOr(*supervisor, "start_time", uint64_t{0}));
    }
    if (const auto worker = ReadJsonObject(dir + "/" + kWorkerFile)) {
      const pid_t pid = JsonFieldOr(*worker, "pid", pid_t{0});
      // -0 and -1 would name this process's group and every process: only a real group.
      const pid_t pgid = JsonFieldOr(*worker, "pgid", pid);
      KillUntilGone(pgid > 1 ? -pgid : pid, pid, JsonFieldOr(*worker, "start_time", uint64_t{0}));
    }
  }
}

}  // namespace llmctl::agent::test_support

#endif  // LLMCTL_AGENT_STOP_RUNS_TEST_SUPPORT_H_
