// Each round's placement: what the scheduler (controller/scheduler/, the pure policy) is told —
// the queued trials with their experiment's target and, for a resumed trial without the
// controller's copy of its checkpoint, the one node that holds it; the connected, usable agents
// whose lease is not ending (lease_watch.h) with the device indices their running attempts hold —
// and what becomes of its answer: each assignment goes to the Launcher, and each trial that waits
// gets a notice saying why (QueuedNotice): the scheduler's reason for a trial that connected nodes
// could run but not now, WaitingNotice for one that no connected node can run.
#ifndef LLMCTL_CONTROLLER_DISPATCH_PLACEMENT_H_
#define LLMCTL_CONTROLLER_DISPATCH_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/launcher.h"
#include "controller/dispatch/lease_watch.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/store/store.h"

namespace llmctl::controller::dispatch {

// Why `trial`, which no connected node can run now, waits. `target` is its experiment's
// (site, flavor) target; for a resumed trial that needs its checkpoint's node, whether that node
// is still registered and whether it is connected and takes trials; `unusable` lists ("; " before
// each) why connected nodes take no trial.
std::string WaitingNotice(const store::TrialRecord& trial,
                          const std::map<std::string, std::string>& target,
                          bool checkpoint_node_registered, bool checkpoint_node_takes_trials,
                          const std::string& unusable);

class Placement {
 public:
  Placement(DispatcherCore& core, AgentLinks& links, LeaseWatch& leases, Launcher& launcher)
      : core_(core), links_(links), leases_(leases), launcher_(launcher) {}

  // Places the queued trials around the `running` attempts and launches them.
  void PlaceQueued(const std::vector<store::RunningAttempt>& running, store::Time now);
  // Dispatcher::QueuedNotice.
  std::string QueuedNotice(int64_t trial_id);

 private:
  DispatcherCore& core_;
  AgentLinks& links_;
  LeaseWatch& leases_;
  Launcher& launcher_;
  // Queued trials no connected node could run, as of the last placement round → why.
  std::map<int64_t, std::string> queued_notices_ LLMCTL_GUARDED_BY(core_.mutex);
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_PLACEMENT_H_
