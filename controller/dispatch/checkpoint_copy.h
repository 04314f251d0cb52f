// Attempts stopped with a checkpoint (their node's lease ends, lease_watch.h, or Cancel with
// `checkpoint`, cancellation.h): why they were stopped, what their end says (the trial's error
// names the checkpoint, or why there is none), and the copy of that checkpoint, on a thread of its
// own, from the agent into the blob store as an input tree (FetchArtifacts of the checkpoint's
// directory, every file checked against its sha256), recorded with Store::SetCheckpointTree. A
// multi-node fsdp trial's checkpoint is copied from every node of the attempt (each holds its
// ranks' optimizer shards) into one tree. With the copy a resumed trial may run on any nodes; a
// failed copy is logged, and the node holding the checkpoint stays the only one that can continue
// it (a multi-node one then cannot be continued: its other nodes' shards are not on node rank 0).
#ifndef LLMCTL_CONTROLLER_DISPATCH_CHECKPOINT_COPY_H_
#define LLMCTL_CONTROLLER_DISPATCH_CHECKPOINT_COPY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/digest/digest.h"
#include "common/result_event.h"
#include "common/status.h"
#include "controller/dispatch/artifacts.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/store/records.h"

namespace llmctl::controller::dispatch {

// The checkpoint a worker's `result` event names (common/result_event.h); nothing when
// `result_json` is no result naming one.
std::optional<result_event::Checkpoint> ResultCheckpointOf(const std::string& result_json);

// A multi-node fsdp checkpoint as one tree: node rank 0's files (`by_node[0]`: the whole model, its
// ranks' optimizer shards and the trainer's state) and, from each other node k, the optimizer
// shards of its ranks k * ranks_per_node .. (k + 1) * ranks_per_node - 1 (common/rank_files.h),
// sorted by path. DataLoss naming the node and the file when a node sent anything else, or when
// a rank's shard is missing.
StatusOr<std::vector<digest::TreeFile>> MergeNodeCheckpoints(
    const std::vector<std::vector<digest::TreeFile>>& by_node, int64_t ranks_per_node);

// What a run stopped with a checkpoint kept, from the worker's `result` event (empty when none
// came): the checkpoint of its last complete step (written, or the one it resumed from), or why
// there is none.
std::string DescribeStopCheckpoint(const std::string& result_json, int64_t experiment_id,
                                   const std::string& trial_name);

class CheckpointCopies {
 public:
  CheckpointCopies(DispatcherCore& core, const ArtifactFetcher& artifacts)
      : core_(core), artifacts_(artifacts) {}

  // Records that the attempt is being stopped with a checkpoint, and why; false when it already
  // was.
  bool MarkStopped(const AttemptKey& key, const std::string& why);
  // The attempt ended with `outcome`: when it was stopped with a checkpoint and ended cancelled,
  // the trial's error (why it stopped; what it kept), and the copy of its checkpoint has started.
  // Before the trial is marked ended, so whoever sees it ended also sees the copy under way.
  std::optional<std::string> OnEnded(const store::RunningAttempt& attempt,
                                     const std::string& trial_name, const std::string& outcome,
                                     const std::string& result_json);
  // The round, with the attempts running now: forgets the attempts that are not, joining their
  // finished copies' threads. A running attempt keeps its entries, so that an end read again
  // (its FinishAttempt failed and its stream was reopened) neither copies twice nor loses why it
  // stopped. Only the round thread calls it, after the parts that start attempts.
  void Reclaim(const std::vector<store::RunningAttempt>& running);
  // How many copies are in flight now (for tests).
  int InFlight();
  // How many copies' threads it holds, finished or not (for tests).
  int Held();
  // Waits for the copies (Dispatcher::Stop, after `stopping` and after the stream readers, which
  // start copies, have stopped); running ones see `stopping` at their next chunk.
  void Stop();

 private:
  // Starts copying the checkpoint that `result_json` (the attempt's result event) names into the
  // blob store, when it names one.
  void Start(const store::RunningAttempt& attempt, const std::string& trial_name,
             const std::string& result_json);
  // The copy itself: the tree's digest, recorded with the attempt. A multi-node fsdp attempt's
  // checkpoint is on every node (trainer/parallel/fsdp_checkpoint.h): its files are fetched from
  // each and merged (MergeNodeCheckpoints).
  StatusOr<std::string> Copy(const store::RunningAttempt& attempt, const std::string& trial_name,
                             const result_event::Checkpoint& checkpoint);
  // Fetches the files of directory `path` of `key`'s run on `node` into the blob store.
  StatusOr<std::vector<digest::TreeFile>> FetchFiles(const std::string& node, const v1::RunKey& key,
                                                     const std::string& path);

  DispatcherCore& core_;
  const ArtifactFetcher& artifacts_;
  // Attempts stopped with a checkpoint → why; erased by Reclaim once the attempt has ended.
  std::map<AttemptKey, std::string> stops_ LLMCTL_GUARDED_BY(core_.mutex);
  // Copies → their thread and whether it is done; joined by Reclaim once done and its attempt has
  // ended, and by Stop.
  std::map<AttemptKey, std::pair<std::thread, bool>> copies_ LLMCTL_GUARDED_BY(core_.mutex);
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_CHECKPOINT_COPY_H_
