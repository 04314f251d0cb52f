// The supervisor: a small process between the agent and one llm-train worker, so that the worker
// outlives an agent restart and its exit status is never lost.
//
// The agent starts `llm-agent --supervise RUN_DIR --grace-ms N -- PROGRAM ARGS...` in a new
// session. The supervisor starts the worker in its own process group with stdout/stderr going to
// RUN_DIR/stdout.log and stderr.log, records it in worker.json, waits for it and writes exit.json
// atomically ({"exit_code": N} or {"signal": N}). SIGTERM asks it to cancel: SIGTERM to the
// worker's process group, SIGKILL after the grace period. SIGUSR1 asks it to cancel after a
// checkpoint: SIGUSR1 to the worker's group (llm-train checkpoints its last complete step, then
// stops), SIGKILL after the grace in milliseconds that the signal's value carries when sent with
// sigqueue (a large checkpoint takes minutes), else after the grace period. Only the first of these
// signals counts. Once the worker has exited, whatever is left of its process group is killed, so
// no stray process holds a device.
#ifndef LLMCTL_AGENT_SUPERVISOR_H_
#define LLMCTL_AGENT_SUPERVISOR_H_

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::agent {

inline constexpr char kSuperviseFlag[] = "--supervise";
inline constexpr char kWorkerFile[] = "worker.json";
inline constexpr char kExitFile[] = "exit.json";
inline constexpr char kStdoutFile[] = "stdout.log";
inline constexpr char kStderrFile[] = "stderr.log";

struct SupervisorCommand {
  std::string run_dir;
  std::chrono::milliseconds grace{0};
  std::vector<std::string> worker_argv;  // the program and its arguments
};

// `program` (the llm-agent binary) followed by the supervisor's arguments.
std::vector<std::string> SupervisorArgv(const std::string& program,
                                        const SupervisorCommand& command);

// The inverse of SupervisorArgv for args[1..] (args[1] is kSuperviseFlag). InvalidArgument with
// the usage when they do not fit.
StatusOr<SupervisorCommand> ParseSupervisorArgs(const std::vector<std::string>& args);

// Runs the supervisor in this process until the worker has exited and exit.json is written;
// returns the process's exit code (0, or 1 when exit.json could not be written).
int RunSupervisor(const SupervisorCommand& command);

// How the worker ended, as the supervisor recorded it.
struct WorkerExit {
  int exit_code = 0;
  int signal = 0;  // non-zero: killed by this signal
};

// Reads RUN_DIR/exit.json; nullopt when it is not there (yet). DataLoss when it does not parse.
StatusOr<std::optional<WorkerExit>> ReadWorkerExit(const std::string& run_dir);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_SUPERVISOR_H_
