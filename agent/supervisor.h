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
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl::agent {

inline constexpr char kSuperviseFlag[] = "--supervise";
inline constexpr char kWorkerFile[] = "worker.json";
inline constexpr char kExitFile[] = "exit.json";
inline constexpr char kStdoutFile[] = "stdout.log";
inline constexpr char kStderrFile[] = "stderr.log";

// The longest grace the supervisor takes (about 24.8 days, what a sigqueue value carries): it adds
// the grace to the steady clock's now in nanoseconds, which a grace near int64's end of
// milliseconds would overflow.
inline constexpr std::chrono::milliseconds kMaxSupervisorGrace{INT32_MAX};

struct SupervisorCommand {
  std::string run_dir;
  std::chrono::milliseconds grace{0};    // 0 to kMaxSupervisorGrace
  std::vector<std::string> worker_argv;  // the program and its arguments
};

// `program` (the llm-agent binary) followed by the supervisor's arguments.
std::vector<std::string> SupervisorArgv(const std::string& program,
                                        const SupervisorCommand& command);

// The inverse of SupervisorArgv for args[1..] (args[1] is kSuperviseFlag). InvalidArgument with
// the usage when they do not fit, or when the grace is not a number of milliseconds from 0 to
// kMaxSupervisorGrace.
StatusOr<SupervisorCommand> ParseSupervisorArgs(const std::vector<std::string>& args);

// Runs the supervisor in this process until the worker has exited and exit.json is written;
// returns the process's exit code (0, or 1 when exit.json could not be written).
int RunSupervisor(const SupervisorCommand& command);

// How the worker ended, as the supervisor recorded it.
struct WorkerExit {
  int exit_code = 0;
  int signal = 0;  // non-zero: killed by this signal
};

// exit.json's text (`path` names it in messages): {"exit_code": 0 to 255} or {"signal": 1 to 64},
// as RunSupervisor writes it. DataLoss for anything else: a damaged file must not read as another
// exit, and a signal of 0 or 2^32 would read as a clean exit.
StatusOr<WorkerExit> ParseWorkerExit(std::string_view text, const std::string& path);

// Reads RUN_DIR/exit.json; nullopt when it is not there (yet). DataLoss when it does not parse
// (ParseWorkerExit).
StatusOr<std::optional<WorkerExit>> ReadWorkerExit(const std::string& run_dir);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_SUPERVISOR_H_
