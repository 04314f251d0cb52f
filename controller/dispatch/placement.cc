#include "controller/dispatch/placement.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/foreign_json.h"
#include "common/text.h"

namespace llmctl::controller::dispatch {
namespace {

// The trial keys of a stored config that placement needs, from one parse of it.
struct PlacementKeys {
  // 1 when absent or unreadable: the launcher reports a damaged config.
  int64_t nodes = 1;
  // "" when absent or unreadable.
  std::string model;
};

PlacementKeys PlacementKeysOf(const store::TrialRecord& trial) {
  PlacementKeys keys;
  const nlohmann::json config = ParseForeignJson(trial.config_json);
  if (!config.is_object()) return keys;
  if (const auto nodes = config.find("nodes");
      nodes != config.end() && nodes->is_number_integer()) {
    keys.nodes = nodes->get<int64_t>();
  }
  if (const auto model = config.find("model"); model != config.end() && model->is_string()) {
    keys.model = model->get<std::string>();
  }
  return keys;
}

// "1 cpu device", "2 cuda devices": what the trial needs on one node.
std::string DeviceCount(const store::TrialRecord& trial) {
  return CountOf(trial.device_count, trial.device_type + " device", trial.device_type + " devices");
}

}  // namespace

std::string WaitingNotice(const store::TrialRecord& trial,
                          const std::map<std::string, std::string>& target,
                          bool checkpoint_node_registered, bool checkpoint_node_takes_trials,
                          const std::vector<std::string>& connecting, const std::string& unusable) {
  if (trial.resume && trial.resume->tree.empty()) {
    const std::string& node = trial.resume->node;
    const std::string from = "it resumes from a checkpoint on node " + node;
    return !checkpoint_node_registered
               ? from + ", which has been removed: it cannot run (llmctl cancel " +
                     std::to_string(trial.experiment_id) + " --trial '" + trial.name + "')"
           : checkpoint_node_takes_trials
               ? from + ", which has no " + DeviceCount(trial) + " now; it waits there"
               : from +
                     ", which is not connected or takes no new trials (its lease ends soon); "
                     "it waits for it (llmctl nodes)";
  }
  std::string with;
  for (const auto& [name, value] : target) {
    with += (with.empty() ? " with " : ", ") + name + " " + value;
  }
  const std::string devices = DeviceCount(trial);
  const int64_t nodes = PlacementKeysOf(trial).nodes;
  const std::string count = std::to_string(nodes);
  const std::string lacking = nodes > 1
                                  ? "fewer than " + count + " connected nodes" + with + " have " +
                                        devices + " each (it spans " + count + " nodes)"
                                  : "no connected node" + with + " has " + devices;
  // Until a node has connected the controller does not know its devices, so telling the user to
  // bring nodes up would mislead while, say, the embedded agent is still starting.
  if (!connecting.empty()) {
    std::string names;
    for (const std::string& name : connecting) names += (names.empty() ? "" : ", ") + name;
    return lacking + " yet: " + (connecting.size() > 1 ? "nodes " : "node ") + names +
           (connecting.size() > 1 ? " have" : " has") +
           " not connected since the controller started; the trial waits (llmctl nodes)" + unusable;
  }
  return lacking + "; the trial waits until " + (nodes > 1 ? count + " do" : "one does") +
         " (llmctl nodes, llmctl node up)" + unusable;
}

void Placement::PlaceQueued(const std::vector<store::RunningAttempt>& running, store::Time now) {
  store::Store& store = core_.store;
  auto queued = store.NextQueuedTrials();
  if (!queued.ok()) {
    spdlog::error("dispatcher: cannot list queued trials: {}", queued.status().ToString());
    return;
  }
  if (queued->empty()) {
    MutexLock lock(core_.mutex);
    queued_notices_.clear();
    return;
  }
  const NodeLabels labels = ReadNodeLabels(store);
  UsableAgents usable = FindUsableAgents(labels.labels);
  MarkBusyDevices(store, running, usable.agents);
  const QueuedTrials trials = ReadQueuedTrials(store, *queued);
  const scheduler::Placement placement = scheduler::PlaceTrials(trials.queue, usable.agents);
  std::map<int64_t, std::string> waiting = WaitingNotices(placement, trials, labels, usable);
  {
    MutexLock lock(core_.mutex);
    queued_notices_ = std::move(waiting);
  }
  Launch(placement, trials, usable, now);
}

Placement::NodeLabels Placement::ReadNodeLabels(store::Store& store) {
  NodeLabels labels;
  if (auto nodes = store.ListNodes(); nodes.ok()) {
    for (const store::NodeRecord& node : *nodes) {
      labels.registered.insert(node.name);
      if (node.lease) {
        labels.labels[node.name] = scheduler::LeaseLabels(node.lease->site, node.lease->flavor);
      }
    }
  }
  return labels;
}

Placement::UsableAgents Placement::FindUsableAgents(
    const std::map<std::string, std::map<std::string, std::string>>& labels) {
  UsableAgents usable;
  MutexLock lock(core_.mutex);
  for (const auto& [name, link] : links_.AllLocked()) {
    if (!link->has_connected && !link->removed) usable.connecting.push_back(name);
    if (link->connected && !link->unusable.empty()) usable.unusable += "; " + link->unusable;
    if (link->connected && link->unusable.empty() && link->measuring) {
      usable.unusable += "; node " + name +
                         " is measuring its rates (about 12 s on a CPU, under 30 s on a GPU): it "
                         "takes trials once that ends";
    }
    // A node whose lease ends soon, that cannot run llm-train, or that measures its rates now,
    // takes no new trial.
    if (!link->connected || !link->unusable.empty() || link->measuring ||
        leases_.EndsSoonLocked(name)) {
      continue;
    }
    usable.links[name] = link.get();
    scheduler::Agent& agent = usable.agents.emplace_back();
    agent.name = name;
    agent.connected = true;
    if (auto found = labels.find(name); found != labels.end()) agent.labels = found->second;
    std::map<std::string, int64_t> counts;
    for (const v1::Device& device : link->devices) ++counts[device.type()];
    if (counts.empty()) counts["cpu"] = 1;
    for (const auto& [type, count] : counts)
      agent.pools.push_back({.type = type, .count = count, .busy = {}});
  }
  return usable;
}

void Placement::MarkBusyDevices(store::Store& store,
                                const std::vector<store::RunningAttempt>& running,
                                std::vector<scheduler::Agent>& agents) {
  struct Holding {
    const store::RunningAttempt* attempt;
    std::vector<int64_t> device_indices;
  };
  std::map<std::string, std::vector<Holding>> running_on;
  for (const store::RunningAttempt& attempt : running) {
    for (store::AttemptNode& run : attempt.Runs()) {
      running_on[run.node].push_back({&attempt, std::move(run.device_indices)});
    }
  }
  for (scheduler::Agent& agent : agents) {
    std::vector<std::pair<scheduler::DevicePool*, int64_t>> unrecorded;  // (pool, device count)
    for (const auto& [attempt, device_indices] : running_on[agent.name]) {
      auto trial = store.GetTrial(attempt->trial_id);
      if (!trial.ok()) continue;
      auto pool = std::find_if(
          agent.pools.begin(), agent.pools.end(),
          [&](const scheduler::DevicePool& p) { return p.type == trial->device_type; });
      if (pool == agent.pools.end()) continue;
      if (device_indices.empty()) {
        unrecorded.emplace_back(&*pool, trial->device_count);
      } else {
        pool->busy.insert(device_indices.begin(), device_indices.end());
      }
    }
    // After every recorded index, so a guess never lands on a device known to be busy.
    for (auto [pool, count] : unrecorded) {
      for (int64_t index = 0; index < pool->count && count > 0; ++index) {
        if (pool->busy.insert(index).second) --count;
      }
    }
  }
}

Placement::QueuedTrials Placement::ReadQueuedTrials(store::Store& store,
                                                    const std::vector<store::TrialRecord>& queued) {
  QueuedTrials trials;
  for (const store::TrialRecord& trial : queued) {
    if (!trials.targets.contains(trial.experiment_id)) {
      std::map<std::string, std::string>& target = trials.targets[trial.experiment_id];
      if (auto experiment = store.GetExperiment(trial.experiment_id); experiment.ok()) {
        target = scheduler::PlacementTarget(experiment->target);
      }
    }
    const PlacementKeys keys = PlacementKeysOf(trial);
    trials.queue.push_back(
        {.trial_id = trial.id,
         .device_type = trial.device_type,
         .device_count = trial.device_count,
         .target = trials.targets[trial.experiment_id],
         // Without the controller's copy of its checkpoint, only the node that
         // holds it can continue the trial.
         .only_agent = trial.resume && trial.resume->tree.empty() ? trial.resume->node : "",
         .nodes = keys.nodes,
         // Only hub models: the controller keeps no record of which uploaded blobs a node has
         // (each launch asks its agent, MissingBlobs).
         .holding_agents = hub_models_.NodesWith(keys.model)});
    trials.by_id[trial.id] = &trial;
  }
  return trials;
}

std::map<int64_t, std::string> Placement::WaitingNotices(const scheduler::Placement& placement,
                                                         const QueuedTrials& trials,
                                                         const NodeLabels& labels,
                                                         const UsableAgents& usable) {
  std::map<int64_t, std::string> waiting;
  // A trial that no connected node could ever run would otherwise wait without a word (say, an
  // experiment for GPUs submitted to the embedded CPU agent).
  for (int64_t trial_id : placement.unsatisfiable) {
    const store::TrialRecord& trial = *trials.by_id.at(trial_id);
    const std::string checkpoint_node = trial.resume ? trial.resume->node : "";
    waiting[trial_id] = WaitingNotice(
        trial, trials.targets.at(trial.experiment_id), labels.registered.contains(checkpoint_node),
        usable.links.contains(checkpoint_node), usable.connecting, usable.unusable);
  }
  // A trial that connected nodes could run, but not now, waits with the scheduler's own reason
  // (the devices it needs and how many nodes have them free, or that they are held for an earlier
  // trial).
  for (int64_t trial_id : placement.waiting) {
    if (auto reason = placement.waiting_reasons.find(trial_id);
        reason != placement.waiting_reasons.end()) {
      waiting[trial_id] = reason->second;
    }
  }
  return waiting;
}

void Placement::Launch(const scheduler::Placement& placement, const QueuedTrials& trials,
                       const UsableAgents& usable, store::Time now) {
  for (const scheduler::Assignment& assignment : placement.assignments) {
    const store::TrialRecord& trial = *trials.by_id.at(assignment.trial_id);
    std::string waiting;
    Status launched = launcher_.Launch(trial, *usable.links.at(assignment.agent),
                                       assignment.device_indices, now, waiting);
    NoteWaiting(trial.id, waiting);
    if (!launched.ok()) {
      spdlog::warn("trial {} of experiment {} on node {}: {}", trial.name, trial.experiment_id,
                   assignment.agent, launched.ToString());
    }
  }
  for (const scheduler::MultiNodeAssignment& assignment : placement.multi_node_assignments) {
    const store::TrialRecord& trial = *trials.by_id.at(assignment.trial_id);
    std::vector<AgentLinks::Link*> links;
    std::vector<std::vector<int64_t>> devices;
    for (const scheduler::NodeAssignment& node : assignment.nodes) {
      links.push_back(usable.links.at(node.agent));
      devices.push_back(node.device_indices);
    }
    std::string waiting;
    const Status launched = launcher_.LaunchMultiNode(trial, links, devices, now, waiting);
    NoteWaiting(trial.id, waiting);
    if (!launched.ok()) {
      spdlog::warn("trial {} of experiment {} on {} nodes: {}", trial.name, trial.experiment_id,
                   links.size(), launched.ToString());
    }
  }
}

void Placement::NoteWaiting(int64_t trial_id, const std::string& waiting) {
  if (waiting.empty()) return;
  MutexLock lock(core_.mutex);
  queued_notices_[trial_id] = "placed, and waits: " + waiting;
}

std::string Placement::QueuedNotice(int64_t trial_id) {
  MutexLock lock(core_.mutex);
  auto notice = queued_notices_.find(trial_id);
  return notice == queued_notices_.end() ? "" : notice->second;
}

}  // namespace llmctl::controller::dispatch
