// Running a program to its end and keeping what it says: its standard output and the tail of its
// error, under a timeout and a stop request, in a child tied to this process (common/
// child_process.h). The agent runs llm-train's probe and version report this way, and llmctl the
// version report of the llm-train beside it.
#ifndef LLMCTL_COMMON_RUN_COMMAND_H_
#define LLMCTL_COMMON_RUN_COMMAND_H_

#include <spawn.h>

#include <chrono>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "common/status.h"

namespace llmctl {

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
// killed (SIGKILL) when this process dies first. Its environment is `env` ("NAME=value" each), or
// this process's when none is given. NotFound when it cannot be started.
StatusOr<CommandOutput> RunCommand(const std::vector<std::string>& argv,
                                   std::chrono::milliseconds timeout, std::stop_token stop = {},
                                   std::optional<std::vector<std::string>> env = std::nullopt);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_RUN_COMMAND_H_
