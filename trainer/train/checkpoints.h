// Training checkpoints: everything a run needs to continue exactly where it stopped.
//
// <output_dir>/checkpoints/step-<N>/ holds model.safetensors (Hugging Face names, the run's dtype:
// the directory loads in transformers; a QLoRA run's NF4 base weights are there as their buffers,
// "<projection>.nf4_packed" etc., saved rather than re-derived so a resume never depends on the
// model files or seed being the same), optimizer.safetensors (the optimizer's named state),
// rng.safetensors (the generator states) and trainer_state.json (next step, data position, loss
// scale). A checkpoint is written into step-<N>.tmp and renamed when complete, so a directory named
// step-<N> is always whole.
#ifndef LLMCTL_TRAINER_TRAIN_CHECKPOINTS_H_
#define LLMCTL_TRAINER_TRAIN_CHECKPOINTS_H_

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/safetensors/safetensors.h"
#include "common/status.h"

namespace llmctl::trainer {

struct TrainingState {
  int64_t next_step = 0;         // the first step the resumed run executes
  nlohmann::json data_position;  // BatchSource::Position()
  double loss_scale = 0.0;       // 16-mixed only
  nlohmann::json config;         // the resolved trial config, for the record
};

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// What a checkpoint holds of `model`: its parameters and buffers (a QLoRA model's NF4 base
// weights), by name.
NamedTensors ModelState(torch::nn::Module& model);

// Writes `tensors` (any device, any layout) to a safetensors file at `path`, atomically.
Status WriteTensors(const std::string& path, const NamedTensors& tensors,
                    const std::map<std::string, std::string>& metadata = {});

// What a checkpoint directory's name takes while it is written: step-<N>.tmp.
inline constexpr char kCheckpointStagingSuffix[] = ".tmp";

// Writes a complete checkpoint directory at `dir` (atomically: into dir + ".tmp", then renamed, and
// the rename synced to disk: a failure to sync fails the checkpoint, whose `dir` is whole).
// `before_rename`, when set, runs once the staging directory holds everything above and may add to
// it (strategy fsdp's other ranks' optimizer shards); its failure fails the checkpoint. A failed
// checkpoint's staging directory is removed (under fsdp, other ranks may still write into it once
// rank 0 failed: SaveShardedCheckpoint removes it again once they have).
Status SaveCheckpoint(
    const std::string& dir, const NamedTensors& model, const NamedTensors& optimizer,
    const TrainingState& state,
    const std::function<Status(const std::string& staging_dir)>& before_rename = nullptr);

// Removes the staging directories (step-<N>.tmp) directly in `checkpoints_dir` that a run killed
// while writing a checkpoint left behind; complete checkpoints (step-<N>) stay. Only while no
// checkpoint is being written there. OK when the directory is missing.
Status RemoveCheckpointStaging(const std::string& checkpoints_dir);

// The tensors of a safetensors file, as owned CPU tensors.
StatusOr<NamedTensors> ReadTensors(const std::string& path);

// The bytes SaveCheckpoint needs on disk for `model` and `optimizer`: their tensors' data, the
// generator states, and an allowance for the safetensors headers and trainer_state.json.
uint64_t CheckpointBytes(const NamedTensors& model, const NamedTensors& optimizer);

struct LoadedCheckpoint {
  // CPU tensors that view the files' read-only mappings (`files`): read, never written. Only what
  // is copied out of them is read from disk: a tensor the model has no use for (a checkpoint may
  // come from another node) costs no memory, where reading every tensor first did.
  NamedTensors model;
  NamedTensors optimizer;
  NamedTensors
      generators;  // for RestoreGeneratorStates, once everything that draws at setup has drawn
  TrainingState state;
  std::vector<std::unique_ptr<safetensors::SafetensorsFile>> files;
};

// Reads a checkpoint directory written by SaveCheckpoint; errors name the file and what is wrong.
StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir);

// The CPU (and, when present, CUDA) generator states, as tensors to save and to put back.
NamedTensors GeneratorStates();
Status RestoreGeneratorStates(const NamedTensors& states);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_CHECKPOINTS_H_
