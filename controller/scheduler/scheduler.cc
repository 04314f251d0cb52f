#include "controller/scheduler/scheduler.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

namespace llmctl::scheduler {
namespace {

// A pool as this round of placement sees it.
struct PoolState {
  const std::string* agent = nullptr;
  const std::map<std::string, std::string>* labels = nullptr;
  const DevicePool* pool = nullptr;
  std::set<int64_t> free;
  // Held for an earlier trial (this id) that could not be placed: later trials may not take from
  // it in this round.
  std::optional<int64_t> held_for;
};

std::vector<PoolState> ConnectedPools(const std::vector<Agent>& agents) {
  std::vector<PoolState> pools;
  for (const Agent& agent : agents) {
    if (!agent.connected) continue;
    for (const DevicePool& pool : agent.pools) {
      PoolState state;
      state.agent = &agent.name;
      state.labels = &agent.labels;
      state.pool = &pool;
      for (int64_t index = 0; index < pool.count; ++index) {
        if (!pool.busy.contains(index)) state.free.insert(index);
      }
      pools.push_back(std::move(state));
    }
  }
  return pools;
}

// The pool's type, size and agent labels suit the trial (one node's share of it).
bool Suits(const PoolState& state, const QueuedTrial& trial) {
  if (!LabelsMatch(*state.labels, trial.target)) return false;
  return state.pool->type == trial.device_type && state.pool->count >= trial.device_count;
}

bool CouldEverHold(const PoolState& state, const QueuedTrial& trial) {
  if (!trial.only_agent.empty() && *state.agent != trial.only_agent) return false;
  return Suits(state, trial);
}

bool FitsNow(const PoolState& state, const QueuedTrial& trial) {
  return static_cast<int64_t>(state.free.size()) >= trial.device_count;
}

// The single-node order for `trial`: an agent that holds its inputs first, then fewest free
// devices, ties by agent name.
bool Before(const PoolState& a, const PoolState& b, const QueuedTrial& trial) {
  const bool a_holds = trial.holding_agents.contains(*a.agent);
  const bool b_holds = trial.holding_agents.contains(*b.agent);
  if (a_holds != b_holds) return a_holds;
  return std::pair(a.free.size(), *a.agent) < std::pair(b.free.size(), *b.agent);
}

std::vector<int64_t> TakeLowest(PoolState& state, int64_t count) {
  const auto end = std::next(state.free.begin(), static_cast<std::ptrdiff_t>(count));
  std::vector<int64_t> taken(state.free.begin(), end);
  state.free.erase(state.free.begin(), end);
  return taken;
}

// "2 free cuda devices", "1 free cpu device".
std::string FreeDevices(const QueuedTrial& trial) {
  return std::to_string(trial.device_count) + " free " + trial.device_type +
         (trial.device_count == 1 ? " device" : " devices");
}

// " (flavor g1, site TACC)" for a targeted trial, else "".
std::string TargetText(const QueuedTrial& trial) {
  std::string text;
  for (const auto& [name, value] : trial.target) {
    text += (text.empty() ? " (" : ", ") + name + " " + value;
  }
  return text.empty() ? text : text + ")";
}

std::string Count(size_t n) { return n == 0 ? "none" : std::to_string(n); }

// "; 1 more has them but is held for trial 7, which waits before it" when pools that fit now are
// held for earlier trials, else "".
std::string HeldText(size_t held_fitting, const std::set<int64_t>& holders) {
  if (held_fitting == 0) return "";
  std::string ids;
  for (int64_t id : holders) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
  const bool one = held_fitting == 1;
  return "; " + std::to_string(held_fitting) + " more " + (one ? "has" : "have") + " them but " +
         (one ? "is" : "are") + " held for " + (holders.size() == 1 ? "trial " : "trials ") + ids +
         ", queued before it and waiting";
}

void PlaceSingleNode(const QueuedTrial& trial, std::vector<PoolState>& pools,
                     Placement& placement) {
  PoolState* best = nullptr;
  bool satisfiable = false;
  size_t held_fitting = 0;
  std::set<int64_t> holders;
  for (PoolState& state : pools) {
    if (!CouldEverHold(state, trial)) continue;
    satisfiable = true;
    if (!FitsNow(state, trial)) continue;
    if (state.held_for) {
      ++held_fitting;
      holders.insert(*state.held_for);
      continue;
    }
    if (best == nullptr || Before(state, *best, trial)) best = &state;
  }
  if (!satisfiable) {
    placement.unsatisfiable.push_back(trial.trial_id);
    return;
  }
  if (best == nullptr) {
    placement.waiting.push_back(trial.trial_id);
    placement.waiting_reasons[trial.trial_id] =
        "needs a node" + TargetText(trial) + " with " + FreeDevices(trial) +
        (trial.only_agent.empty() ? "" : " (only " + trial.only_agent + ")") +
        "; none has them now" + HeldText(held_fitting, holders);
    for (PoolState& state : pools) {
      if (CouldEverHold(state, trial) && !state.held_for) state.held_for = trial.trial_id;
    }
    return;
  }
  placement.assignments.push_back(
      Assignment{.trial_id = trial.trial_id,
                 .agent = *best->agent,
                 .device_type = trial.device_type,
                 .device_indices = TakeLowest(*best, trial.device_count)});
}

void PlaceMultiNode(const QueuedTrial& trial, std::vector<PoolState>& pools, Placement& placement) {
  const auto nodes = static_cast<size_t>(trial.nodes);
  std::set<std::string> could_ever;  // agents with a suitable pool
  std::vector<PoolState*> ready;     // suitable, not held, enough free devices now
  size_t held_fitting = 0;
  std::set<int64_t> holders;
  for (PoolState& state : pools) {
    if (!Suits(state, trial)) continue;
    could_ever.insert(*state.agent);
    if (!FitsNow(state, trial)) continue;
    if (state.held_for) {
      ++held_fitting;
      holders.insert(*state.held_for);
      continue;
    }
    ready.push_back(&state);
  }
  if (could_ever.size() < nodes ||
      (!trial.only_agent.empty() && !could_ever.contains(trial.only_agent))) {
    placement.unsatisfiable.push_back(trial.trial_id);
    return;
  }
  std::sort(ready.begin(), ready.end(),
            [&trial](const PoolState* a, const PoolState* b) { return Before(*a, *b, trial); });
  if (!trial.only_agent.empty()) {
    // The named agent is node rank 0; the others keep their order after it.
    std::stable_partition(ready.begin(), ready.end(), [&](const PoolState* state) {
      return *state->agent == trial.only_agent;
    });
  }
  // One pool per agent: the first of each agent's in that order.
  std::vector<PoolState*> chosen;
  std::set<std::string> agents;
  for (PoolState* state : ready) {
    if (agents.insert(*state->agent).second) chosen.push_back(state);
  }
  const bool only_agent_ready =
      trial.only_agent.empty() || (!chosen.empty() && *chosen[0]->agent == trial.only_agent);
  if (chosen.size() < nodes || !only_agent_ready) {
    placement.waiting.push_back(trial.trial_id);
    std::string reason = "needs " + std::to_string(nodes) + " nodes" + TargetText(trial) +
                         " with " + FreeDevices(trial) + " each; " + Count(chosen.size()) +
                         (chosen.size() == 1 ? " has" : " have") + " them now (" +
                         std::to_string(could_ever.size()) + " could run it)" +
                         HeldText(held_fitting, holders);
    if (!only_agent_ready) {
      reason += "; node rank 0 must be " + trial.only_agent + ", which has not";
    }
    placement.waiting_reasons[trial.trial_id] = std::move(reason);
    for (PoolState& state : pools) {
      if (Suits(state, trial) && !state.held_for) state.held_for = trial.trial_id;
    }
    return;
  }
  MultiNodeAssignment assignment{
      .trial_id = trial.trial_id, .device_type = trial.device_type, .nodes = {}};
  for (size_t rank = 0; rank < nodes; ++rank) {
    assignment.nodes.push_back(
        NodeAssignment{.node_rank = static_cast<int64_t>(rank),
                       .agent = *chosen[rank]->agent,
                       .device_indices = TakeLowest(*chosen[rank], trial.device_count)});
  }
  placement.multi_node_assignments.push_back(std::move(assignment));
}

}  // namespace

std::map<std::string, std::string> LeaseLabels(const std::string& site, const std::string& flavor) {
  return {{"site", site}, {"flavor", flavor}};
}

std::map<std::string, std::string> PlacementTarget(
    const std::map<std::string, std::string>& experiment_target) {
  std::map<std::string, std::string> target;
  for (const char* key : {"site", "flavor"}) {
    if (auto value = experiment_target.find(key); value != experiment_target.end()) {
      target[key] = value->second;
    }
  }
  return target;
}

bool LabelsMatch(const std::map<std::string, std::string>& labels,
                 const std::map<std::string, std::string>& target) {
  for (const auto& [name, wanted] : target) {
    auto label = labels.find(name);
    if (label == labels.end() || label->second != wanted) return false;
  }
  return true;
}

Placement PlaceTrials(const std::vector<QueuedTrial>& queue, const std::vector<Agent>& agents) {
  std::vector<PoolState> pools = ConnectedPools(agents);
  Placement placement;
  for (const QueuedTrial& trial : queue) {
    if (trial.nodes > 1) {
      PlaceMultiNode(trial, pools, placement);
    } else {
      PlaceSingleNode(trial, pools, placement);
    }
  }
  return placement;
}

LostAgentDecision DecideLostAttempts(const std::vector<RunningAttempt>& running, Time now,
                                     std::chrono::milliseconds requeue_after) {
  LostAgentDecision decision;
  const std::chrono::milliseconds timeout = std::max(requeue_after, std::chrono::milliseconds(0));
  for (const RunningAttempt& attempt : running) {
    // A last_seen after `now` makes `due` later still: the attempt is kept.
    const Time due = attempt.agent_last_seen + timeout;
    if (now >= due) {
      decision.requeue.push_back(attempt);
      continue;
    }
    decision.keep_waiting.push_back(attempt);
    if (!decision.decide_again_at || due < *decision.decide_again_at) {
      decision.decide_again_at = due;
    }
  }
  return decision;
}

}  // namespace llmctl::scheduler
