#include "trainer/parallel/fsdp_checkpoint.h"

#include <filesystem>
#include <vector>

#include "common/atomic_file.h"
#include "common/rank_files.h"

namespace llmctl::trainer {

namespace {

namespace fs = std::filesystem;

// A failed checkpoint's staging directory, once every rank has written into it or failed to (a
// sum of failures is done): what it holds would keep the disk as full as the writes made it.
void RemoveFailedStaging(const fs::path& staging) {
  std::error_code ignored;
  fs::remove_all(staging, ignored);
}

// Rank r > 0's part: its optimizer shard into <dir>.tmp, on its own node, once rank 0's staging
// directory holds its files; then, once every rank has written, the node's first rank renames its
// node's staging directory into place, and the ranks agree that every node did (before rank 0
// renames its own).
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
    if (fsdp.local_rank() == 0) RemoveFailedStaging(staging);
    // Until every node's is gone no rank returns, and so ends its process (its launcher would
    // then stop the node's other ranks, a first rank before its removal).
    RETURN_IF_ERROR(fsdp.Barrier());
    RETURN_IF_ERROR(written);
    return UnavailableError("checkpoint " + dir + " failed on another rank");
  }
  // Every rank has written. A staging directory that holds trainer_state.json is rank 0's, which
  // rank 0 renames once this agreement is done.
  // No exception between the ranks' two agreements: a rank that threw here would leave the
  // others waiting in the second.
  Status renamed = Status::Ok();
  if (fsdp.local_rank() == 0) {
    std::error_code lookup;
    const bool rank0s = fs::exists(staging / kCheckpointStateFile, lookup);
    if (lookup) {
      renamed = UnavailableError("cannot check " + staging.string() + ": " + lookup.message());
    } else if (!rank0s) {
      fs::remove_all(dir, error);
      fs::rename(staging, dir, error);
      renamed = error
                    ? UnavailableError("cannot rename " + staging.string() + ": " + error.message())
                    : SyncDirectoryOf(dir).WithContext("checkpoint " + dir);
    }
  }
  ASSIGN_OR_RETURN(const std::vector<double> not_renamed,
                   fsdp.SumAcrossRanks({renamed.ok() ? 0.0 : 1.0}));
  RETURN_IF_ERROR(renamed);
  if (not_renamed.at(0) > 0) {
    return UnavailableError("checkpoint " + dir + " was not put in place on another node");
  }
  return Status::Ok();
}

}  // namespace

Status SaveShardedCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                             const NamedTensors& optimizer, const TrainingState& state) {
  ASSIGN_OR_RETURN(const NamedTensors model, fsdp.FullState());
  // The ranks' sums of failures are both the barriers before the renames and the verdicts.
  if (fsdp.rank() != 0) return SaveRankShard(fsdp, dir, optimizer);
  bool joined = false;
  bool shards_failed = false;
  const Status saved =
      SaveCheckpoint(dir, model, optimizer, state, [&](const std::string&) -> Status {
        joined = true;
        RETURN_IF_ERROR(fsdp.Barrier());
        ASSIGN_OR_RETURN(const std::vector<double> failed, fsdp.SumAcrossRanks({0.0}));
        if (failed.at(0) > 0) {
          shards_failed = true;
          return UnavailableError("another rank could not write its optimizer shard");
        }
        // The other nodes put theirs in place before rank 0 renames its own, so that on a
        // filesystem they share they still see rank 0's staging directory as rank 0's.
        ASSIGN_OR_RETURN(const std::vector<double> not_renamed, fsdp.SumAcrossRanks({0.0}));
        if (not_renamed.at(0) > 0) {
          return UnavailableError("checkpoint " + dir + " was not put in place on another node");
        }
        return Status::Ok();
      });
  if (!joined) {
    // Rank 0 failed before the others could write: release them, with the failure counted.
    RETURN_IF_ERROR(fsdp.Barrier());
    RETURN_IF_ERROR(fsdp.SumAcrossRanks({1.0}).status());
    // SaveCheckpoint removed its staging directory before the others wrote; the ranks of rank 0's
    // node made it again for their shards.
    RemoveFailedStaging(dir + kCheckpointStagingSuffix);
  }
  // The others wait until every failed checkpoint's staging directory is gone (SaveRankShard).
  if (!joined || shards_failed) RETURN_IF_ERROR(fsdp.Barrier());
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
