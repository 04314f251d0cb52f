#include "agent/run_checks.h"

#include <cstddef>
#include <string>

#include "common/trial_name.h"

namespace llmctl::agent {
namespace {

// The checks of a multi-node run's group that need no trial config.
Status CheckNodeGroup(const NodeGroup& group) {
  if (group.node_rank < 0 || group.node_rank >= group.nodes) {
    return InvalidArgumentError("node_group.node_rank: " + std::to_string(group.node_rank) +
                                " is not a node rank of " + std::to_string(group.nodes) +
                                " nodes (0.." + std::to_string(group.nodes - 1) + ")");
  }
  if (group.node_rank == 0) {
    if (group.master_port != 0) {
      return InvalidArgumentError(
          "node_group.master_port: node rank 0 binds a free port for the rendezvous, so it must "
          "be 0, got " +
          std::to_string(group.master_port));
    }
    return Status::Ok();
  }
  if (group.master_addr.empty()) {
    return InvalidArgumentError("node_group.master_addr: node rank " +
                                std::to_string(group.node_rank) +
                                " needs node rank 0's address, got none");
  }
  if (group.master_port < 1 || group.master_port > 65535) {
    return InvalidArgumentError("node_group.master_port: node rank " +
                                std::to_string(group.node_rank) +
                                " needs node rank 0's rendezvous port (1..65535), got " +
                                std::to_string(group.master_port));
  }
  return Status::Ok();
}

}  // namespace

Status CheckKey(const RunKey& key) {
  if (key.experiment_id <= 0) {
    return InvalidArgumentError("run key: experiment_id must be positive, got " +
                                std::to_string(key.experiment_id));
  }
  if (key.attempt <= 0) {
    return InvalidArgumentError("run key: attempt must be positive, got " +
                                std::to_string(key.attempt));
  }
  if (const std::string problem = TrialNameProblem(key.trial); !problem.empty()) {
    return InvalidArgumentError("run key: trial name '" + key.trial + "' " + problem);
  }
  return Status::Ok();
}

Status CheckPlacement(const RunRequest& request) {
  for (int index : request.device_indices) {
    if (index < 0) {
      return InvalidArgumentError("device_indices: " + std::to_string(index) + " is negative");
    }
  }
  if (request.node_group.nodes > 1) RETURN_IF_ERROR(CheckNodeGroup(request.node_group));
  return Status::Ok();
}

Status CheckTrialPlacement(const RunRequest& request, const TrialFile& trial_file) {
  if (trial_file.device == "cuda" && request.device_indices.empty()) {
    return InvalidArgumentError("a cuda trial needs device_indices");
  }
  // One node's ranks are processes of this host: at most as many as a run keeps (kMaxRanks,
  // which Recover reads back), however many `devices` the trial names.
  if (trial_file.ranks > kMaxRanks) {
    return InvalidArgumentError("the trial's " + std::to_string(trial_file.ranks) +
                                " ranks are more than " + std::to_string(kMaxRanks) +
                                " on one node");
  }
  const NodeGroup& group = request.node_group;
  if (group.nodes <= 1) return Status::Ok();
  if (group.nodes != trial_file.nodes) {
    return InvalidArgumentError("node_group.nodes: " + std::to_string(group.nodes) +
                                " is not the trial's nodes (" + std::to_string(trial_file.nodes) +
                                ")");
  }
  if (group.nodes > kMaxRanks / trial_file.ranks) {
    return InvalidArgumentError("node_group.nodes: " + std::to_string(group.nodes) + " x " +
                                std::to_string(trial_file.ranks) + " ranks is more than " +
                                std::to_string(kMaxRanks));
  }
  return Status::Ok();
}

}  // namespace llmctl::agent
