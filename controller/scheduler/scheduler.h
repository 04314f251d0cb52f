// The scheduler: which queued trial runs where, and which running attempts to give up on. A pure
// policy over plain values: no store, no network, and no clock reads (time comes in as an
// argument), so every decision is a function of its inputs and tested as such.
#ifndef LLMCTL_CONTROLLER_SCHEDULER_SCHEDULER_H_
#define LLMCTL_CONTROLLER_SCHEDULER_SCHEDULER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace llmctl::scheduler {

struct QueuedTrial {
  int64_t trial_id = 0;
  std::string device_type;   // "cpu" or "cuda"
  int64_t device_count = 1;  // per node
  // The experiment's `target:` ({site, flavor}); each entry must equal the agent's label of that
  // name, so figures measured for one GPU model never come from another. Empty: any agent.
  std::map<std::string, std::string> target;
  // Only this agent may run it (a resumed trial: the agent whose disk holds its checkpoint).
  // Empty: any agent. For a multi-node trial: that agent must be one of its nodes, node rank 0.
  std::string only_agent;
  // The trial key `nodes`: how many distinct agents the trial spans, each with device_count
  // devices of device_type (Lightning's num_nodes x devices). 1: the single-node rule.
  int64_t nodes = 1;
  // The agents that hold its inputs already (its hub model, there or being downloaded there): among
  // the pools that fit, theirs come first, so that nothing is sent or downloaded again.
  std::set<std::string> holding_agents{};
};

// The devices of one type on an agent, numbered 0 .. count - 1. A CPU agent has one "cpu" device.
struct DevicePool {
  std::string type;
  int64_t count = 0;
  std::set<int64_t> busy;  // indices that a running trial holds
};

struct Agent {
  std::string name;
  bool connected = false;                     // only connected agents get trials
  std::map<std::string, std::string> labels;  // from the node's lease: site, flavor
  std::vector<DevicePool> pools;
};

struct Assignment {
  int64_t trial_id = 0;
  std::string agent;
  std::string device_type;
  std::vector<int64_t> device_indices;  // ascending, device_count of them
};

// One node of a multi-node trial.
struct NodeAssignment {
  int64_t node_rank = 0;  // 0 .. nodes - 1; node rank 0 hosts the rendezvous store
  std::string agent;
  std::vector<int64_t> device_indices;  // ascending, device_count of them
};

// A trial with nodes > 1, placed whole: one entry per node, in node-rank order.
struct MultiNodeAssignment {
  int64_t trial_id = 0;
  std::string device_type;
  std::vector<NodeAssignment> nodes;  // nodes[i].node_rank == i; distinct agents
};

struct Placement {
  // Single-node trials (nodes 1), in the order of the queue.
  std::vector<Assignment> assignments;
  // Multi-node trials (nodes > 1), in the order of the queue.
  std::vector<MultiNodeAssignment> multi_node_assignments;
  // Trials that connected agents could run but not now (their devices are busy or held for an
  // earlier trial), in queue order.
  std::vector<int64_t> waiting;
  // Why each waiting trial waits, by trial id: e.g. "needs 2 nodes with 4 free cuda devices each;
  // 1 has them now (3 could run it)", or that the devices it could use are held for an earlier
  // trial.
  std::map<int64_t, std::string> waiting_reasons;
  // Trials that no connected agent could ever run (no pool of their type is large enough, or
  // fewer such agents than the trial's nodes), in queue order. They hold nothing back.
  std::vector<int64_t> unsatisfiable;
};

// The labels a node on a lease has: the lease's site and flavor (or bare-metal node type).
std::map<std::string, std::string> LeaseLabels(const std::string& site, const std::string& flavor);

// The part of an experiment's `target:` a node's labels can match: its site and flavor (a node's
// labels are its lease's; a target's node_type names a bare-metal lease's flavor for `submit
// --provision`, and matches no label).
std::map<std::string, std::string> PlacementTarget(
    const std::map<std::string, std::string>& experiment_target);

// Whether an agent with `labels` may run a trial with `target` (a PlacementTarget): each entry
// equals the label of that name. An empty target: any agent.
bool LabelsMatch(const std::map<std::string, std::string>& labels,
                 const std::map<std::string, std::string>& target);

// Places queued trials (given in file order: experiment by experiment) on agents.
// - A trial goes only to a connected agent whose labels match its target, to a pool of its device
//   type with at least device_count free devices, and takes the lowest free indices. One trial per
//   device at a time: an agent with four GPUs runs four 1-GPU trials, a CPU agent one trial.
// - Among the pools that fit, one on an agent that holds the trial's inputs (holding_agents) wins,
//   so that they are not sent again; then the one with the fewest free devices (ties: agent name),
//   so that small trials pack together and large pools stay free for large trials.
// - No overtaking: a trial that cannot be placed now reserves every pool that could ever hold it,
//   so no later trial takes devices from those pools in this round; later trials may still use
//   pools the waiting trial cannot use at all.
// - A trial that no connected agent could ever satisfy reserves nothing; nor does one whose
//   only_agent is not connected (or could never hold it).
// Multi-node trials (nodes M > 1), under the same queue order and the same holds:
// - All or nothing: placed only when M distinct connected agents each have a pool that could
//   hold the trial (its device type, at least device_count devices, its target's labels), that
//   no earlier trial holds, with device_count free devices; each node takes its lowest free
//   indices. Otherwise nothing is taken.
// - Which M: the fitting pools in the single-node order (holding agents first, then fewest free
//   devices, ties: agent name), the first M of them; node rank i is the i-th of those, so rank 0
//   (the rendezvous store's host) is the first fitting node in that order. With only_agent, that
//   agent is node rank 0 and the other M - 1 follow in the same order.
// - A multi-node trial that cannot be placed now holds every pool that could ever hold it, like
//   a waiting single-node trial: no later trial (single- or multi-node) takes devices from those
//   pools in this round. Since nothing is ever held partly placed, two waiting trials never hold
//   halves of what each needs (no deadlock), and the oldest waiting trial gets the devices as
//   they free up before any later one (no starvation, at the cost of idle devices meanwhile).
// - Fewer than M connected agents that could ever hold it: unsatisfiable, holds nothing.
Placement PlaceTrials(const std::vector<QueuedTrial>& queue, const std::vector<Agent>& agents);

// The controller's monotonic clock: a silence is how long it heard nothing, which NTP stepping the
// wall clock does not change.
using Time = std::chrono::steady_clock::time_point;

struct RunningAttempt {
  int64_t trial_id = 0;
  int64_t attempt = 0;
  std::string agent;
  Time agent_last_seen;  // the last time the controller heard from the attempt's agent
};

struct LostAgentDecision {
  // The agent may still come back: keep the attempt and resume streaming when it does.
  std::vector<RunningAttempt> keep_waiting;
  // The agent has been silent for requeue_after or longer: declare the attempt lost and queue the
  // trial again (as attempt + 1).
  std::vector<RunningAttempt> requeue;
  // The earliest time at which a kept attempt will be due for requeueing, if nothing is heard
  // from its agent before then: when to decide again. Empty when nothing is kept.
  std::optional<Time> decide_again_at;
};

// Sorts running attempts by how long their agents have been silent at `now`: requeue once
// now >= agent_last_seen + requeue_after (a negative requeue_after counts as 0), keep waiting
// before that. An agent last seen after `now` is kept.
LostAgentDecision DecideLostAttempts(const std::vector<RunningAttempt>& running, Time now,
                                     std::chrono::milliseconds requeue_after);

}  // namespace llmctl::scheduler

#endif  // LLMCTL_CONTROLLER_SCHEDULER_SCHEDULER_H_
