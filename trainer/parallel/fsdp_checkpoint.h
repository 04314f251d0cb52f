// strategy fsdp's checkpoints: the whole model in Hugging Face names, as every other strategy
// writes it, and the optimizer state as the ranks' shards.
//
// <dir>/model.safetensors is gathered unit by unit; rank 0 writes it with its own optimizer shard
// in optimizer.safetensors (SaveCheckpoint's layout), and before rank 0 renames the staging
// directory into place every other rank r adds optimizer.rank<r>.safetensors
// (common/rank_files.h) there, so a directory named step-N is still always whole. The shards'
// shapes depend on the world size: a checkpoint resumes at the world size that wrote it.
//
// Several nodes: each node's ranks write theirs into <dir>.tmp on their own node, and once every
// rank has written, each node's first rank renames its node's staging directory to <dir> (unless
// it is rank 0's, on a filesystem the nodes share), and the ranks agree that every node did, and
// then that rank 0 did, before any returns (a node whose <dir> was renamed before a rename failed
// removes it again). So each node holds its ranks' shards under the same path, and the controller's
// copy of the checkpoint gathers them (controller/dispatch/checkpoint_copy.h) into one whole
// directory that any nodes can resume from.
#ifndef LLMCTL_TRAINER_PARALLEL_FSDP_CHECKPOINT_H_
#define LLMCTL_TRAINER_PARALLEL_FSDP_CHECKPOINT_H_

#include <map>
#include <string>

#include "common/status.h"
#include "trainer/parallel/fsdp.h"
#include "trainer/train/checkpoints.h"

namespace llmctl::trainer {

// Writes the checkpoint at `dir`; a collective: every rank calls it, with its own optimizer state.
// A failure on any rank fails it on every rank, and no step-N directory appears.
Status SaveShardedCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                             const NamedTensors& optimizer, const TrainingState& state);

// Puts `checkpoint` (LoadCheckpoint of `dir`) back into this rank: its pieces of the full model
// into the shards, and its own optimizer shard into checkpoint->optimizer, for the optimizer to
// load.
Status LoadShardedCheckpoint(FullyShardedDataParallel& fsdp, const std::string& dir,
                             LoadedCheckpoint& checkpoint);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_PARALLEL_FSDP_CHECKPOINT_H_
