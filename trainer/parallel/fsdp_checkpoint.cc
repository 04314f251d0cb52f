#include "trainer/parallel/fsdp_checkpoint.h"

#include <filesystem>
#include <vector>

#include "common/atomic_file.h"
#include "common/rank_files.h"

namespace llmctl::trainer {

namespace {

namespace fs = std::filesystem;

// A failed checkpoint's directory (a staging one, or a node's step-N put in place), once every
// rank has written into it or failed to (a sum of failures is done): what it holds would keep the
// disk as full as the writes made it.
void RemoveFailedCheckpoint(const fs::path& dir) {
  std::error_code ignored;
  fs::remove_all(dir, ignored);
}

// Rank r > 0's part: its optimizer shard into <dir>.tmp, on its own node, once rank 0's staging
// directory holds its files; then, once every rank has written, the node's first rank renames its
// node's staging directory into place, the ranks agree that every node did, and then that rank 0
// renamed its own. A node's step-N holds only its ranks' shards: when the checkpoint fails after
// it was renamed, the node's first rank removes it.
Status SaveRankShard(FullyShardedDataParallel& fsdp, const std::string& dir,
                     const NamedTensors& optimizer) {
  RETURN_IF_ERROR(fsdp.Barrier());  // rank 0's staging directory holds its files
  const fs::path staging = dir + ".tmp";
  // On rank 0's node (or a filesystem the nodes share) it exists; on another node the first of its
  // ranks to get here makes it.
  std::error_code error;
  fs::create_directories(staging, error);
  Status written =
      error ? UnavailableError("cannot create " + staging.string() + ": " + error.message())
            : WriteTensors((staging / RankOptimizerFile(fsdp.rank())).string(), optimizer);
  ASSIGN_OR_RETURN(const std::vector<double> failed,
                   fsdp.SumAcrossRanks({written.ok() ? 0.0 : 1.0}));
  if (failed.at(0) > 0) {
    // The node's first rank removes its node's staging directory; rank 0's node's is rank 0's
    // (SaveCheckpoint's, or SaveShardedCheckpoint's when rank 0 failed first).
    if (fsdp.local_rank() == 0) RemoveFailedCheckpoint(staging);
    // Until every node's is gone no rank returns, and so ends its process (its launcher would
    // then stop the node's other ranks, a first rank before its removal).
    RETURN_IF_ERROR(fsdp.Barrier());
    RETURN_IF_ERROR(written);
    return UnavailableError("checkpoint " + dir + " failed on another rank");
  }
  // Every rank has written. A staging directory that holds trainer_state.json is rank 0's, which
  // rank 0 renames once this agreement is done.
  // No exception between the ranks' agreements: a rank that threw here would leave the others
  // waiting in the next.
  Status renamed = Status::Ok();
  bool nodes_own = false;  // this node's first rank put (or tried to put) its staging in place
  if (fsdp.local_rank() == 0) {
    std::error_code lookup;
    const bool rank0s = fs::exists(staging / kCheckpointStateFile, lookup);
    if (lookup) {
      renamed = UnavailableError("cannot check " + staging.string() + ": " + lookup.message());
    } else if (!rank0s) {
      nodes_own = true;
      fs::remove_all(dir, error);
      fs::rename(staging, dir, error);
      renamed = error
                    ? UnavailableError("cannot rename " + staging.string() + ": " + error.message())
                    : SyncDirectoryOf(dir).WithContext("checkpoint " + dir);
    }
  }
  ASSIGN_OR_RETURN(const std::vector<double> not_renamed,
                   fsdp.SumAcrossRanks({renamed.ok() ? 0.0 : 1.0}));
  Status verdict = renamed;
  if (not_renamed.at(0) > 0) {
    if (verdict.ok()) {
      verdict = UnavailableError("checkpoint " + dir + " was not put in place on another node");
    }
  } else {
    // Rank 0 renames its own now and says whether it could.
    ASSIGN_OR_RETURN(const std::vector<double> rank0_failed, fsdp.SumAcrossRanks({0.0}));
    if (rank0_failed.at(0) == 0) return Status::Ok();
    verdict = UnavailableError("checkpoint " + dir + " was not put in place on rank 0's node");
  }
  // Without the other nodes' shards this node's are no checkpoint, yet as step-N they would pass
  // for one and keep the disk as full as they made it.
  if (nodes_own) {
    RemoveFailedCheckpoint(staging);
    RemoveFailedCheckpoint(dir);
  }
  RETURN_IF_ERROR(fsdp.Barrier());  // as above: every node's removed before any rank returns
  return verdict;
}

}  // namespace

Status SaveShardedCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                             const NamedTensors& optimizer, const TrainingState& state) {
  ASSIGN_OR_RETURN(const NamedTensors model, fsdp.FullState());
  // The ranks' sums of failures are both the barriers before the renames and the verdicts.
  if (fsdp.rank() != 0) return SaveRankShard(fsdp, dir, optimizer);
  bool joined = false;
  bool every_node_renamed = false;
  // Whether the other ranks learnt from the agreements that the checkpoint failed: they then wait
  // until every node's staging directory, or step-N put in place, is gone (SaveRankShard).
  bool failure_agreed = false;
  const Status saved =
      SaveCheckpoint(dir, model, optimizer, state, [&](const std::string&) -> Status {
        joined = true;
        RETURN_IF_ERROR(fsdp.Barrier());
        ASSIGN_OR_RETURN(const std::vector<double> failed, fsdp.SumAcrossRanks({0.0}));
        if (failed.at(0) > 0) {
          failure_agreed = true;
          return UnavailableError("another rank could not write its optimizer shard");
        }
        // The other nodes put theirs in place before rank 0 renames its own, so that on a
        // filesystem they share they still see rank 0's staging directory as rank 0's.
        ASSIGN_OR_RETURN(const std::vector<double> not_renamed, fsdp.SumAcrossRanks({0.0}));
        if (not_renamed.at(0) > 0) {
          failure_agreed = true;
          return UnavailableError("checkpoint " + dir + " was not put in place on another node");
        }
        every_node_renamed = true;
        return Status::Ok();
      });
  if (!joined) {
    // Rank 0 failed before the others could write: release them, with the failure counted.
    RETURN_IF_ERROR(fsdp.Barrier());
    RETURN_IF_ERROR(fsdp.SumAcrossRanks({1.0}).status());
    // SaveCheckpoint removed its staging directory before the others wrote; the ranks of rank 0's
    // node made it again for their shards.
    RemoveFailedCheckpoint(dir + kCheckpointStagingSuffix);
    failure_agreed = true;
  }
  if (every_node_renamed) {
    // Whether rank 0's own rename (or its sync) worked: the other nodes' step-N stand or go by it.
    RETURN_IF_ERROR(fsdp.SumAcrossRanks({saved.ok() ? 0.0 : 1.0}).status());
    failure_agreed = !saved.ok();
  }
  if (failure_agreed) RETURN_IF_ERROR(fsdp.Barrier());
  return saved;
}

Status LoadShardedCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                             LoadedCheckpoint& checkpoint) {
  const std::map<std::string, torch::Tensor> saved(checkpoint.model.begin(),
                                                   checkpoint.model.end());
  RETURN_IF_ERROR(fsdp.LoadFullState(saved).WithContext(dir + "/model.safetensors"));
  if (fsdp.rank() != 0) {
    ASSIGN_OR_RETURN(checkpoint.optimizer, ReadTensors(dir + "/" + RankOptimizerFile(fsdp.rank())));
  }
  return Status::Ok();
}

}  // namespace llmctl::trainer
