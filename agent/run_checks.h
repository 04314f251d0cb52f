// The checks of a run request (agent/runs.h) from the controller, at the agent's edge: its key, and
// its devices and node group before and after its trial is read. Internal to agent/.
#ifndef LLMCTL_AGENT_RUN_CHECKS_H_
#define LLMCTL_AGENT_RUN_CHECKS_H_

#include "agent/runs.h"
#include "agent/trial_file.h"
#include "common/status.h"

namespace llmctl::agent {

// InvalidArgument naming the field for a non-positive experiment id or attempt, or a trial name
// that is empty, "." or "..", or longer than 200 bytes (it names the run's directory).
Status CheckKey(const RunKey& key);

// The request's devices and node group, before its trial is read.
Status CheckPlacement(const RunRequest& request);

// The request's devices and node group against its trial's device, ranks and nodes.
Status CheckTrialPlacement(const RunRequest& request, const TrialFile& trial_file);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_RUN_CHECKS_H_
