// Micro-batches as tensors, from the tokenized dataset (trainer/data), for the training loop.
#ifndef LLMCTL_TRAINER_TRAIN_BATCHES_H_
#define LLMCTL_TRAINER_TRAIN_BATCHES_H_

#include <torch/torch.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::trainer {

struct MicroBatch {
  torch::Tensor input_ids;   // (B, T) int64, right-padded
  torch::Tensor labels;      // (B, T) int64, -100 where no loss is taken
  int64_t label_tokens = 0;  // positions that count in the loss (after the shift)
  int64_t real_tokens = 0;   // non-padding input tokens: what tokens/s counts
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t num_examples() const = 0;
  // The next micro-batch of `size` examples; wraps into a new (reshuffled) epoch as needed.
  virtual MicroBatch Next(int64_t size, torch::Device device) = 0;
  // Where the iteration stands, for checkpoints, and putting it back.
  virtual nlohmann::json Position() const = 0;
  virtual Status Restore(const nlohmann::json& position) = 0;
};

// Tokenizes the trial's dataset into the token cache if needed (what `llm-train --prepare` does)
// and returns the token file's path. The trial's inputs are checked first (TrialInputsChecker).
StatusOr<std::string> PrepareTokens(const TrialConfig& config);

// Opens the prepared token file for training, shuffled with the trial's seed; as rank `rank` of
// `world_size` data-parallel ranks, its shard of every epoch (DistributedSampler's).
StatusOr<std::unique_ptr<BatchSource>> OpenBatches(const TrialConfig& config,
                                                   const ModelConfig& model, int rank,
                                                   int world_size);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_BATCHES_H_
