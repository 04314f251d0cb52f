// The end of each node's cloud lease (stored with the node, set by UpdateNode): from lease_warning
// before it, a warning (logged once, NodeNotice for the status the CLI shows) and no new trial on
// that node (Placement asks EndsSoonLocked); from lease_stop_margin before it, CancelRun with a
// checkpoint for each trial running there, with what is left of the lease less lease_stop_reserve
// as the grace before the worker is killed. The attempt is recorded as stopped with a checkpoint
// (checkpoint_copy.h), so it ends cancelled saying where its checkpoint is, and the checkpoint is
// copied to the controller.
#ifndef LLMCTL_CONTROLLER_DISPATCH_LEASE_WATCH_H_
#define LLMCTL_CONTROLLER_DISPATCH_LEASE_WATCH_H_

#include <map>
#include <string>
#include <vector>

#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/checkpoint_copy.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/store/records.h"

namespace llmctl::controller::dispatch {

class LeaseWatch {
 public:
  LeaseWatch(DispatcherCore& core, AgentLinks& links, CheckpointCopies& checkpoints)
      : core_(core), links_(links), checkpoints_(checkpoints) {}

  // One round: warns about the `nodes` whose lease ends soon and stops their `running` trials once
  // it ends sooner still.
  void Watch(const std::vector<store::NodeRecord>& nodes,
             const std::vector<store::RunningAttempt>& running, store::Time now);
  // Dispatcher::NodeNotice.
  std::string Notice(const std::string& node);
  // RemoveNode: the node's warning goes with it.
  void ForgetNode(const std::string& node);
  // Whether the node's lease ends soon, so that it takes no new trial.
  bool EndsSoonLocked(const std::string& node) const LLMCTL_REQUIRES(core_.mutex) {
    return notices_.contains(node);
  }

 private:
  DispatcherCore& core_;
  AgentLinks& links_;
  CheckpointCopies& checkpoints_;
  // Nodes whose lease ends soon → the warning.
  std::map<std::string, std::string> notices_ LLMCTL_GUARDED_BY(core_.mutex);
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_LEASE_WATCH_H_
