// Each round's placement: what the scheduler (controller/scheduler/, the pure policy) is told —
// the queued trials with their experiment's target, the nodes that have their hub model or are
// downloading it, and, for a resumed trial without the controller's copy of its checkpoint, the
// one node that holds it; the connected, usable agents
// whose lease is not ending (lease_watch.h) with the device indices their running attempts hold —
// and what becomes of its answer: each assignment goes to the Launcher, and each trial that waits
// gets a notice saying why (QueuedNotice): the scheduler's reason for a trial that connected nodes
// could run but not now, WaitingNotice for one that no connected node can run.
#ifndef LLMCTL_CONTROLLER_DISPATCH_PLACEMENT_H_
#define LLMCTL_CONTROLLER_DISPATCH_PLACEMENT_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/dispatch/hub_preparation.h"
#include "controller/dispatch/launcher.h"
#include "controller/dispatch/lease_watch.h"
#include "controller/scheduler/scheduler.h"
#include "controller/store/store.h"

namespace llmctl::controller::dispatch {

// Why `trial`, which no connected node can run now, waits. `target` is its experiment's
// (site, flavor) target; for a resumed trial that needs its checkpoint's node, whether that node
// is still registered and whether it is connected and takes trials; `connecting` names the nodes
// that have not connected since the controller started, whose devices it does not know yet;
// `unusable` lists ("; " before each) why connected nodes take no trial.
std::string WaitingNotice(const store::TrialRecord& trial,
                          const std::map<std::string, std::string>& target,
                          bool checkpoint_node_registered, bool checkpoint_node_takes_trials,
                          const std::vector<std::string>& connecting, const std::string& unusable);

class Placement {
 public:
  Placement(DispatcherCore& core, AgentLinks& links, LeaseWatch& leases, Launcher& launcher,
            HubPreparations& hub_models)
      : core_(core), links_(links), leases_(leases), launcher_(launcher), hub_models_(hub_models) {}

  // Places the queued trials around the `running` attempts and launches them.
  void PlaceQueued(const std::vector<store::RunningAttempt>& running, store::Time now);
  // Dispatcher::QueuedNotice.
  std::string QueuedNotice(int64_t trial_id);

 private:
  // A node's labels are its lease's site and flavor; an experiment's `target:` must match them.
  struct NodeLabels {
    std::map<std::string, std::map<std::string, std::string>> labels;  // by node
    std::set<std::string> registered;                                  // not removed
  };
  // The connected agents that take new trials, with their device pools.
  struct UsableAgents {
    std::vector<scheduler::Agent> agents;
    std::map<std::string, AgentLinks::Link*> links;  // by node
    std::string unusable;  // why connected nodes take no trial, for the waiting trials' notices
    // Nodes not connected since the controller started (AgentLinks::Link::has_connected).
    std::vector<std::string> connecting;
  };
  // The queue as the scheduler takes it, with each trial's record and experiment's target.
  struct QueuedTrials {
    std::vector<scheduler::QueuedTrial> queue;
    std::map<int64_t, const store::TrialRecord*> by_id;
    std::map<int64_t, std::map<std::string, std::string>> targets;  // by experiment
  };

  static NodeLabels ReadNodeLabels(store::Store& store);
  UsableAgents FindUsableAgents(
      const std::map<std::string, std::map<std::string, std::string>>& labels)
      LLMCTL_EXCLUDES(core_.mutex);
  // Which devices the running attempts hold, as the store recorded them when they started, so a
  // restarted controller sees the same occupancy: on each node of a multi-node attempt, that
  // node's. Attempts stored without indices (started before the store kept them) are then taken
  // to hold the lowest indices still free.
  static void MarkBusyDevices(store::Store& store,
                              const std::vector<store::RunningAttempt>& running,
                              std::vector<scheduler::Agent>& agents);
  // Each trial's holding_agents: the nodes that have its hub model or are downloading it.
  QueuedTrials ReadQueuedTrials(store::Store& store, const std::vector<store::TrialRecord>& queued);
  // Why each trial the placement left waiting waits.
  static std::map<int64_t, std::string> WaitingNotices(const scheduler::Placement& placement,
                                                       const QueuedTrials& trials,
                                                       const NodeLabels& labels,
                                                       const UsableAgents& usable);
  // Hands each assignment to the launcher.
  void Launch(const scheduler::Placement& placement, const QueuedTrials& trials,
              const UsableAgents& usable, store::Time now);
  // A launched trial that stays queued (its hub model or inputs on their way): its notice.
  void NoteWaiting(int64_t trial_id, const std::string& waiting) LLMCTL_EXCLUDES(core_.mutex);

  DispatcherCore& core_;
  AgentLinks& links_;
  LeaseWatch& leases_;
  Launcher& launcher_;
  HubPreparations& hub_models_;
  // Queued trials no connected node could run, or placed and waiting for their hub model or
  // inputs, as of the last placement round → why.
  std::map<int64_t, std::string> queued_notices_ LLMCTL_GUARDED_BY(core_.mutex);
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_PLACEMENT_H_
