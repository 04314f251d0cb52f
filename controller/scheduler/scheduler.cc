#include "controller/scheduler/scheduler.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace llmctl::scheduler {
namespace {

// A pool as this round of placement sees it.
struct PoolState {
  const std::string* agent = nullptr;
  const std::map<std::string, std::string>* labels = nullptr;
  const DevicePool* pool = nullptr;
  std::set<int64_t> free;
  // Held for an earlier trial that could not be placed: later trials may not take from it.
  bool reserved = false;
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

bool CouldEverHold(const PoolState& state, const QueuedTrial& trial) {
  if (!trial.only_agent.empty() && *state.agent != trial.only_agent) return false;
  for (const auto& [name, wanted] : trial.target) {
    auto label = state.labels->find(name);
    if (label == state.labels->end() || label->second != wanted) return false;
  }
  return state.pool->type == trial.device_type && state.pool->count >= trial.device_count;
}

}  // namespace

Placement PlaceTrials(const std::vector<QueuedTrial>& queue, const std::vector<Agent>& agents) {
  std::vector<PoolState> pools = ConnectedPools(agents);
  Placement placement;
  for (const QueuedTrial& trial : queue) {
    PoolState* best = nullptr;
    bool satisfiable = false;
    for (PoolState& state : pools) {
      if (!CouldEverHold(state, trial)) continue;
      satisfiable = true;
      if (state.reserved || static_cast<int64_t>(state.free.size()) < trial.device_count) continue;
      if (best == nullptr ||
          std::pair(state.free.size(), *state.agent) < std::pair(best->free.size(), *best->agent)) {
        best = &state;
      }
    }
    if (!satisfiable) {
      placement.unsatisfiable.push_back(trial.trial_id);
      continue;
    }
    if (best == nullptr) {
      placement.waiting.push_back(trial.trial_id);
      for (PoolState& state : pools) {
        if (CouldEverHold(state, trial)) state.reserved = true;
      }
      continue;
    }
    const auto end = std::next(best->free.begin(), static_cast<std::ptrdiff_t>(trial.device_count));
    placement.assignments.push_back(Assignment{.trial_id = trial.trial_id,
                                               .agent = *best->agent,
                                               .device_type = trial.device_type,
                                               .device_indices = {best->free.begin(), end}});
    best->free.erase(best->free.begin(), end);
  }
  return placement;
}

LostAgentDecision DecideLostAttempts(const std::vector<RunningAttempt>& running, Time now,
                                     std::chrono::milliseconds requeue_after) {
  LostAgentDecision decision;
  const std::chrono::milliseconds timeout = std::max(requeue_after, std::chrono::milliseconds(0));
  for (const RunningAttempt& attempt : running) {
    // A last_seen in the future (clock skew) makes `due` later still: the attempt is kept.
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
