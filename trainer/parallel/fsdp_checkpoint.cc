#include "trainer/parallel/fsdp_checkpoint.h"

#include <vector>

namespace llmctl::trainer {

std::string RankOptimizerFile(int rank) {
  return rank == 0 ? "optimizer.safetensors"
                   : "optimizer.rank" + std::to_string(rank) + ".safetensors";
}

Status SaveShardedCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                             const NamedTensors& optimizer, const TrainingState& state) {
  ASSIGN_OR_RETURN(const NamedTensors model, fsdp.FullState());
  // The ranks' sum of failures is both the barrier before rank 0's rename and the verdict.
  if (fsdp.rank() != 0) {
    RETURN_IF_ERROR(fsdp.Barrier());  // rank 0's staging directory holds its files
    const Status written = WriteTensors(dir + ".tmp/" + RankOptimizerFile(fsdp.rank()), optimizer);
    ASSIGN_OR_RETURN(const std::vector<double> failed,
                     fsdp.SumAcrossRanks({written.ok() ? 0.0 : 1.0}));
    RETURN_IF_ERROR(written);
    if (failed.at(0) > 0) return UnavailableError("checkpoint " + dir + " failed on another rank");
    return Status::Ok();
  }
  bool joined = false;
  const Status saved =
      SaveCheckpoint(dir, model, optimizer, state, [&](const std::string&) -> Status {
        joined = true;
        RETURN_IF_ERROR(fsdp.Barrier());
        ASSIGN_OR_RETURN(const std::vector<double> failed, fsdp.SumAcrossRanks({0.0}));
        if (failed.at(0) > 0) {
          return UnavailableError("another rank could not write its optimizer shard");
        }
        return Status::Ok();
      });
  if (!joined) {
    // Rank 0 failed before the others could write: release them, with the failure counted.
    RETURN_IF_ERROR(fsdp.Barrier());
    RETURN_IF_ERROR(fsdp.SumAcrossRanks({1.0}).status());
  }
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
