// How a run's supervisor is started (agent/runs.h): llm-train's command line for the trial, the
// environment it runs in, and the supervisor process, spawned in a session of its own; and the
// environment of the node's rate probe, which names its GPU as a worker does.
#ifndef LLMCTL_AGENT_RUN_LAUNCH_H_
#define LLMCTL_AGENT_RUN_LAUNCH_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "agent/runs.h"
#include "agent/trial_file.h"
#include "common/status.h"

namespace llmctl::agent {

// What a run's worker command line and environment are made from.
struct WorkerLaunch {
  std::string llm_train;  // the worker program
  std::string run_dir;
  TrialFile trial_file;
  std::string resume_checkpoint;  // empty: from step 0
  NodeGroup group;                // nodes 1: a trial on one node
  std::vector<int> device_indices;
  std::string cache_dir;  // the agent's input cache, where llm-train keeps its token cache
};

// llm-train --config ... --events ..., with its inputs' names, the checkpoint it resumes from, and
// for a multi-rank or multi-node trial the launcher's ranks, rendezvous and ranks.json.
std::vector<std::string> WorkerArgv(const WorkerLaunch& launch);

// The agent's environment with the worker's CUDA_VISIBLE_DEVICES (NVML's indices, so with
// CUDA_DEVICE_ORDER=PCI_BUS_ID, the order NVML counts in) and LLMCTL_CACHE_DIR, and for a
// multi-node trial the socket interface that reaches node rank 0 (unless the agent's environment
// names one). `run` names the run in the message when that interface is not found.
std::vector<std::string> WorkerEnvironment(const WorkerLaunch& launch, const std::string& run);

// The agent's environment for `llm-train --probe --probe-device device` (node_rates.h): for cuda,
// with CUDA_DEVICE_ORDER=PCI_BUS_ID, as a worker's, so that the CUDA device it measures is the one
// NVML names first.
std::vector<std::string> ProbeEnvironment(const std::string& device);

// Spawns `argv` with `env` in a new session (neither a signal to the agent's group nor its exit
// reaches it), default signal dispositions and an empty mask, stdin from /dev/null, and stdout and
// stderr appended to `log`. The child's pid; Unavailable naming argv[0] when it cannot start.
StatusOr<pid_t> SpawnSupervisor(const std::vector<std::string>& argv,
                                const std::vector<std::string>& env, const std::string& log);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_RUN_LAUNCH_H_
