// Processes the agent did not necessarily start: identity by pid plus start time, so that a pid
// the kernel reused for something else is never mistaken for our worker.
#ifndef LLMCTL_AGENT_PROCESS_H_
#define LLMCTL_AGENT_PROCESS_H_

#include <spawn.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace llmctl::agent {

// The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or nullopt when
// there is no such process or it has exited (a zombie counts as exited).
std::optional<uint64_t> ProcessStartTime(pid_t pid);

// True while `pid` runs and started at `start_time`.
bool IsSameProcessAlive(pid_t pid, uint64_t start_time);

// A descriptor that poll() reports readable once the process `pid` (started at `start_time`) has
// exited: a pidfd, so it works for processes this one did not start. Invalid when the process is
// already gone or the kernel has no pidfd_open (before Linux 5.3, or a seccomp filter refuses it):
// callers keep a periodic check for that case.
UniqueFd OpenExitWatch(pid_t pid, uint64_t start_time);

// Makes a child spawned with `attributes` start with no signal blocked and SIGPIPE, SIGINT,
// SIGTERM, SIGHUP, SIGQUIT and SIGCHLD at their default actions, whatever this process blocks or
// ignores: the agent blocks SIGINT and SIGTERM in every thread for sigwait, and a mask survives
// exec, so a child would otherwise ignore the stop signals meant for it. Keeps the flags already
// set.
void StartWithDefaultSignals(posix_spawnattr_t& attributes);
// The same for a child started by StartChild.
void StartWithDefaultSignals(ChildSpec& spec);

struct CommandOutput {
  int exit_code = -1;       // -1 when it could not run or was killed (timeout)
  std::string stdout_text;  // its first 1 MiB
  std::string stderr_tail;  // its last 64 KiB: where a program says why it failed
};

// Runs `argv` (argv[0] looked up in PATH) in a process group of its own, with stdin on /dev/null
// and the signals StartWithDefaultSignals sets, and returns its standard output and error. Its
// group is killed (SIGKILL) after `timeout`, or within about 50 ms of `stop` being requested (the
// agent stopping: a 3-minute rate probe must not hold it up): Cancelled then. The program itself is
// killed (SIGKILL) when the agent dies first. Its environment is `env` ("NAME=value" each), or the
// agent's when none is given. NotFound when it cannot be started.
StatusOr<CommandOutput> RunCommand(const std::vector<std::string>& argv,
                                   std::chrono::milliseconds timeout, std::stop_token stop = {},
                                   std::optional<std::vector<std::string>> env = std::nullopt);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_PROCESS_H_
