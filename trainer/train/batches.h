// Micro-batches as tensors, from the tokenized dataset (common/data), for the training loop.
#ifndef LLMCTL_TRAINER_TRAIN_BATCHES_H_
#define LLMCTL_TRAINER_TRAIN_BATCHES_H_

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/trial_config.h"
#include "common/data/text_encoder.h"
#include "common/inputs/token_cache.h"

namespace llmctl::trainer {

struct MicroBatch {
  torch::Tensor input_ids;       // (B, T) int64, right-padded
  torch::Tensor labels;          // (B, T) int64, -100 where no loss is taken
  torch::Tensor attention_mask;  // (B, T) bool, false on the padding
  // (B, 3, S, S) float32 normalised pixels, one image per row: image-caption data only (BLIP-2),
  // whose input_ids then hold the image's placeholder tokens; undefined for text.
  torch::Tensor pixel_values;
  int64_t label_tokens = 0;              // positions that count in the loss (after the shift)
  int64_t real_tokens = 0;               // non-padding input tokens: what tokens/s counts
  std::vector<int64_t> example_indices;  // (B) the rows' examples in the dataset's order
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

// Opens the prepared token file for training, shuffled with the trial's seed; as rank `rank` of
// `world_size` data-parallel ranks, its shard of every epoch (DistributedSampler's). `vocab_size`
// is the model's embedding rows, which every token id must be under.
StatusOr<std::unique_ptr<BatchSource>> OpenBatches(const TrialConfig& config, int64_t vocab_size,
                                                   int rank, int world_size);

// A token file's micro-batches as OpenBatches makes them (shuffled with the seed, the rank's shard,
// whole micro-batches only), right-padded with `pad_id` (< 0: the file's EOS).
StatusOr<std::unique_ptr<BatchSource>> OpenTokenFileBatches(const std::string& token_path,
                                                            const TrialConfig& config,
                                                            int64_t vocab_size, int32_t pad_id,
                                                            int rank, int world_size);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_BATCHES_H_
