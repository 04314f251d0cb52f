#include "controller/dispatch/checkpoint_copy.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/digest/digest.h"
#include "common/foreign_json.h"
#include "common/rank_files.h"
#include "common/trial_config.h"
#include "controller/store/stored_config.h"

namespace llmctl::controller::dispatch {
namespace {

// A checkpoint is its model's files, its state and an optimizer shard per rank (at most 1,024 a
// node): a node that sends more files for one is refused, before each becomes a blob of its own.
constexpr size_t kMaxCheckpointFiles = 4096;

nlohmann::json ParseResult(const std::string& result_json) { return ParseForeignJson(result_json); }

}  // namespace

std::optional<result_event::Checkpoint> ResultCheckpointOf(const std::string& result_json) {
  return result_event::CheckpointOf(ParseResult(result_json));
}

std::string DescribeStopCheckpoint(const std::string& result_json, int64_t experiment_id,
                                   const std::string& trial_name) {
  const nlohmann::json result = ParseResult(result_json);
  if (!result.is_object()) {
    return "no checkpoint: the worker ended without a result (killed when its grace ran out?)";
  }
  if (const std::optional<result_event::Checkpoint> checkpoint =
          result_event::CheckpointOf(result)) {
    // The event counts steps from 0; "after step N" and the directory step-N count completed ones.
    const std::string trial = std::to_string(experiment_id) + " '" + trial_name + "'";
    return "checkpoint after step " + std::to_string(checkpoint->step + 1) + " in " +
           checkpoint->path + " on the node (llmctl resume " + trial +
           " continues from it there; llmctl fetch " + trial +
           " copies the run's output while the node is up)";
  }
  const std::string error = result_event::ErrorOf(result);
  return "no checkpoint" + (error.empty() ? std::string() : " (" + error + ")");
}

bool CheckpointCopies::MarkStopped(const AttemptKey& key, const std::string& why) {
  MutexLock lock(core_.mutex);
  return stops_.try_emplace(key, why).second;
}

std::optional<std::string> CheckpointCopies::OnEnded(const store::RunningAttempt& attempt,
                                                     const std::string& trial_name,
                                                     const std::string& outcome,
                                                     const std::string& result_json) {
  std::optional<std::string> error;
  {
    MutexLock lock(core_.mutex);
    auto stopped = stops_.find({attempt.trial_id, attempt.attempt});
    if (stopped == stops_.end() || outcome != "cancelled") return std::nullopt;
    error = stopped->second + "; " +
            DescribeStopCheckpoint(result_json, attempt.experiment_id, trial_name);
  }
  // At once: a lease stop leaves minutes before the node, and its checkpoint, are gone.
  Start(attempt, trial_name, result_json);
  return error;
}

void CheckpointCopies::Start(const store::RunningAttempt& attempt, const std::string& trial_name,
                             const std::string& result_json) {
  const std::optional<result_event::Checkpoint> checkpoint = ResultCheckpointOf(result_json);
  if (!checkpoint) return;  // nothing to copy; the trial's error says why
  const AttemptKey key{attempt.trial_id, attempt.attempt};
  MutexLock lock(core_.mutex);
  if (core_.stopping || copies_.contains(key)) return;
  auto& copy = copies_[key];
  copy.second = false;
  copy.first = std::thread([this, attempt, trial_name, checkpoint = *checkpoint, key] {
    const auto started = std::chrono::steady_clock::now();
    StatusOr<std::string> tree = Copy(attempt, trial_name, checkpoint);
    std::string from = "node " + attempt.node;
    if (attempt.nodes.size() > 1) {
      from = "nodes";
      for (const store::AttemptNode& node : attempt.nodes) from += " " + node.node;
    }
    if (tree.ok()) {
      spdlog::info(
          "{}: checkpoint after step {} copied from {} in {:.1f} s (tree {}): any "
          "node can continue it",
          AttemptName(attempt), checkpoint.step + 1, from,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), *tree);
    } else {
      spdlog::warn("{}: cannot copy its checkpoint {} from {}: {}; only {} can continue it",
                   AttemptName(attempt), checkpoint.path, from, tree.status().ToString(),
                   attempt.nodes.size() > 1 ? "the same nodes" : "that node");
    }
    MutexLock lock(core_.mutex);
    if (auto entry = copies_.find(key); entry != copies_.end()) entry->second.second = true;
  });
}

StatusOr<std::vector<digest::TreeFile>> MergeNodeCheckpoints(
    const std::vector<std::vector<digest::TreeFile>>& by_node, int64_t ranks_per_node) {
  std::vector<digest::TreeFile> merged = by_node.at(0);
  for (size_t node = 1; node < by_node.size(); ++node) {
    const int64_t first = static_cast<int64_t>(node) * ranks_per_node;
    for (const digest::TreeFile& file : by_node[node]) {
      const int rank = RankOfOptimizerFile(file.path);
      if (rank < first || rank >= first + ranks_per_node) {
        return DataLossError("node rank " + std::to_string(node) + " sent '" + file.path +
                             "', which is not the optimizer shard of one of its ranks (" +
                             std::to_string(first) + " to " +
                             std::to_string(first + ranks_per_node - 1) + ")");
      }
      merged.push_back(file);
    }
  }
  const int64_t world_size = ranks_per_node * static_cast<int64_t>(by_node.size());
  for (int64_t rank = 0; rank < world_size; ++rank) {
    const std::string wanted = RankOptimizerFile(static_cast<int>(rank));
    if (std::none_of(merged.begin(), merged.end(),
                     [&](const digest::TreeFile& file) { return file.path == wanted; })) {
      return DataLossError("no " + wanted + " from node rank " +
                           std::to_string(rank / ranks_per_node) + ": rank " +
                           std::to_string(rank) + "'s optimizer shard is missing");
    }
  }
  std::sort(merged.begin(), merged.end(),
            [](const digest::TreeFile& a, const digest::TreeFile& b) { return a.path < b.path; });
  return merged;
}

StatusOr<std::vector<digest::TreeFile>> CheckpointCopies::FetchFiles(const std::string& node,
                                                                     const v1::RunKey& key,
                                                                     const std::string& path) {
  const BlobStore& blobs = core_.blobs;
  std::vector<digest::TreeFile> files;
  std::unique_ptr<ReceivedBlob> blob;
  Status received;
  const Status fetched = artifacts_.Fetch(
      node, key,
      [&](const v1::ArtifactChunk& chunk) {
        if (core_.Stopping()) {
          received = CancelledError("the controller is stopping");
          return false;
        }
        if (!chunk.path().empty()) {
          if (const std::string problem = digest::RelativePathProblem(chunk.path());
              !problem.empty()) {
            received = DataLossError("the agent sent file '" + chunk.path() + "': " + problem);
            return false;
          }
          if (files.size() == kMaxCheckpointFiles) {
            received =
                DataLossError("the agent sent more than " + std::to_string(kMaxCheckpointFiles) +
                              " files for one checkpoint");
            return false;
          }
          auto begun = blobs.BeginReceive(chunk.size());
          if (!begun.ok()) {
            received = begun.status();
            return false;
          }
          blob = std::move(*begun);
          files.push_back({chunk.path(), "", chunk.size()});
        }
        if (blob == nullptr) {
          received = DataLossError("the agent sent data before naming its file");
          return false;
        }
        received = blob->Append(chunk.data());
        if (received.ok() && chunk.last()) {
          received = blob->Commit(chunk.sha256()).WithContext(files.back().path);
          files.back().sha256 = chunk.sha256();
          blob.reset();
        }
        return received.ok();
      },
      path);
  RETURN_IF_ERROR(received);  // why the sink stopped the download, before the download's own error
  RETURN_IF_ERROR(fetched);
  if (blob != nullptr) return DataLossError(files.back().path + " was cut short");
  std::sort(files.begin(), files.end(),
            [](const digest::TreeFile& a, const digest::TreeFile& b) { return a.path < b.path; });
  return files;
}

StatusOr<std::string> CheckpointCopies::Copy(const store::RunningAttempt& attempt,
                                             const std::string& trial_name,
                                             const result_event::Checkpoint& checkpoint) {
  store::Store& store = core_.store;
  ASSIGN_OR_RETURN(const store::TrialRecord trial, store.GetTrial(attempt.trial_id));
  if (trial.resume && !trial.resume->tree.empty() && trial.resume->step == checkpoint.step + 1) {
    // The attempt continued the controller's copy and wrote no newer checkpoint: its result names
    // the copy (as materialised on the node), which the controller already holds.
    RETURN_IF_ERROR(store.SetCheckpointTree(attempt.trial_id, attempt.attempt, trial.resume->tree));
    return trial.resume->tree;
  }
  v1::RunKey key;
  key.set_experiment_id(attempt.experiment_id);
  key.set_trial(trial_name);
  key.set_attempt(static_cast<int32_t>(attempt.attempt));
  std::vector<std::vector<digest::TreeFile>> by_node;
  ASSIGN_OR_RETURN(by_node.emplace_back(), FetchFiles(attempt.node, key, checkpoint.path));
  // What SaveCheckpoint writes last: without it the directory is no complete checkpoint.
  if (std::none_of(by_node[0].begin(), by_node[0].end(), [](const digest::TreeFile& file) {
        return file.path == kCheckpointStateFile;
      })) {
    return DataLossError(std::string("the agent sent no ") + kCheckpointStateFile +
                         ": no complete checkpoint");
  }
  std::vector<digest::TreeFile> files = by_node[0];
  ASSIGN_OR_RETURN(const TrialConfig config, store::StoredConfig(trial));
  if (attempt.nodes.size() > 1 && config.settings().parallel.strategy == trial::Strategy::kFsdp) {
    // Every node's ranks wrote their shards under the same path in their own run directories,
    // which the agents serve relative to the run directory.
    const size_t output = checkpoint.path.rfind("/output/");
    if (output == std::string::npos) {
      return DataLossError("checkpoint " + checkpoint.path +
                           " is not in the run's output directory: the other nodes' shards "
                           "cannot be found");
    }
    const std::string relative = checkpoint.path.substr(output + 1);
    for (const store::AttemptNode& node : attempt.nodes) {
      if (node.node_rank == 0) continue;
      StatusOr<std::vector<digest::TreeFile>> fetched = FetchFiles(node.node, key, relative);
      if (!fetched.ok()) {
        // Its message names the node.
        return fetched.status().WithContext("node rank " + std::to_string(node.node_rank));
      }
      by_node.push_back(std::move(*fetched));
    }
    ASSIGN_OR_RETURN(files, MergeNodeCheckpoints(by_node, RanksPerNode(config)));
  }
  digest::InputTree tree{.digest = digest::TreeDigest(files), .files = files, .is_file = false};
  RETURN_IF_ERROR(digest::ValidateInputTree("checkpoint " + checkpoint.path, tree));
  RETURN_IF_ERROR(core_.blobs.PutTree(tree));
  RETURN_IF_ERROR(store.SetCheckpointTree(attempt.trial_id, attempt.attempt, tree.digest));
  return tree.digest;
}

void CheckpointCopies::Reclaim(const std::vector<store::RunningAttempt>& running) {
  std::set<AttemptKey> still_running;
  for (const store::RunningAttempt& attempt : running) {
    still_running.emplace(attempt.trial_id, attempt.attempt);
  }
  std::vector<std::thread> finished;
  {
    MutexLock lock(core_.mutex);
    std::erase_if(stops_, [&](const auto& entry) { return !still_running.contains(entry.first); });
    for (auto copy = copies_.begin(); copy != copies_.end();) {
      auto& [thread, done] = copy->second;
      if (!done || still_running.contains(copy->first)) {
        ++copy;
        continue;
      }
      finished.push_back(std::move(thread));
      copy = copies_.erase(copy);
    }
  }
  // Outside the lock: each set `done` in its last hold of the mutex and has only to return.
  for (std::thread& thread : finished) thread.join();
}

int CheckpointCopies::Held() {
  MutexLock lock(core_.mutex);
  return static_cast<int>(copies_.size());
}

int CheckpointCopies::InFlight() {
  MutexLock lock(core_.mutex);
  return static_cast<int>(std::count_if(copies_.begin(), copies_.end(),
                                        [](const auto& entry) { return !entry.second.second; }));
}

void CheckpointCopies::Stop() {
  std::map<AttemptKey, std::pair<std::thread, bool>> copies;
  {
    MutexLock lock(core_.mutex);
    copies.swap(copies_);
  }
  for (auto& [key, copy] : copies) {
    if (copy.first.joinable()) copy.first.join();
  }
}

}  // namespace llmctl::controller::dispatch
