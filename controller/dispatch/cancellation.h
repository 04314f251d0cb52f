// Stopping and continuing trials at the user's word: Cancel (queued trials at once, running ones
// through CancelRun on their agents, optionally with a checkpoint first) and Resume (Store's
// ResumeTrial; placement then sends the trial to where its checkpoint is). CancelRun, the call
// itself, is shared with lease_watch.h's lease stops.
#ifndef LLMCTL_CONTROLLER_DISPATCH_CANCELLATION_H_
#define LLMCTL_CONTROLLER_DISPATCH_CANCELLATION_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/checkpoint_copy.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/store/store.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::controller::dispatch {

// Asks `node`'s agent (`stub`) to stop the attempt's run there; a failure is logged. With
// `checkpoint_grace`, the worker first checkpoints its last complete step and gets that long before
// it is killed.
void CancelRun(const DispatcherCore& core, const store::RunningAttempt& attempt, const std::string& node,
               const std::string& trial_name, v1::Agent::Stub& stub,
               std::optional<std::chrono::milliseconds> checkpoint_grace);

// CancelRun on every node the attempt runs on whose agent is connected (one not connected is
// skipped: the attempt is declared lost and ends with it), except node rank `except_node_rank` and
// the nodes of a multi-node attempt whose run has already ended.
void CancelRuns(const DispatcherCore& core, AgentLinks& links, const store::RunningAttempt& attempt,
                const std::string& trial_name,
                std::optional<std::chrono::milliseconds> checkpoint_grace,
                std::optional<int64_t> except_node_rank = std::nullopt);

class Cancellation {
 public:
  Cancellation(DispatcherCore& core, AgentLinks& links, CheckpointCopies& checkpoints)
      : core_(core), links_(links), checkpoints_(checkpoints) {}

  // Dispatcher::Cancel and Dispatcher::Resume.
  StatusOr<std::vector<std::string>> Cancel(int64_t experiment_id, std::string_view trial,
                                            bool checkpoint);
  StatusOr<store::TrialResume> Resume(int64_t experiment_id, std::string_view trial);

 private:
  DispatcherCore& core_;
  AgentLinks& links_;
  CheckpointCopies& checkpoints_;
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_CANCELLATION_H_
