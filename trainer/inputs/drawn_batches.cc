#include "trainer/inputs/drawn_batches.h"

#include <algorithm>
#include <memory>

#include "trainer/data/batch_iterator.h"
#include "trainer/data/token_file.h"
#include "trainer/inputs/token_cache.h"

namespace llmctl {

StatusOr<DrawnBatches> DrawMicroBatches(const TrialConfig& config) {
  ASSIGN_OR_RETURN(const std::string path, PrepareTokens(config));
  ASSIGN_OR_RETURN(std::unique_ptr<data::TokenFile> file, data::TokenFile::Open(path));
  const int64_t micro = config.GetInt("train.micro_batch_size");
  const int64_t world =
      std::max<int64_t>(1, config.GetInt("devices")) * std::max<int64_t>(1, config.GetInt("nodes"));
  const std::string strategy = config.GetString("strategy");
  const int64_t ranks = strategy == "ddp" || strategy == "fsdp" ? world : 1;
  const int64_t global = config.GetInt("train.global_batch_size");
  const int64_t accumulation = std::max<int64_t>(1, global / (micro * ranks));
  if (file->num_examples() < micro * ranks) {
    return InvalidArgumentError(
        config.GetString("data.path") + " has " + std::to_string(file->num_examples()) +
        " examples, fewer than one micro-batch of " + std::to_string(micro) + " on each of " +
        std::to_string(ranks) + " rank(s)");
  }
  DrawnBatches drawn;
  double padded = 0;
  double real = 0;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    // As llm-train's OpenTokenFileBatches: the seed's shuffle, the rank's shard, whole
    // micro-batches only.
    data::BatchOptions options;
    options.micro_batch_size = micro;
    options.seed = static_cast<uint64_t>(config.GetInt("seed"));
    options.rank = rank;
    options.world_size = ranks;
    options.drop_last = true;
    ASSIGN_OR_RETURN(data::BatchIterator iterator, data::BatchIterator::Create(*file, options));
    if (drawn.steps == 0) {
      // As the trainer counts them (TrialRun::EmitStart).
      const int64_t steps_per_epoch =
          std::max<int64_t>(1, file->num_examples() / (micro * accumulation * ranks));
      drawn.steps = config.GetInt("train.max_steps") > 0
                        ? config.GetInt("train.max_steps")
                        : steps_per_epoch * std::max<int64_t>(1, config.GetInt("train.epochs"));
      drawn.micro_batches = drawn.steps * accumulation;
    }
    for (int64_t i = 0; i < drawn.micro_batches; ++i) {
      const data::Batch batch = iterator.Next();
      drawn.longest = std::max(drawn.longest, batch.seq_len);
      int64_t& step_longest = i < accumulation ? drawn.longest_first_step : drawn.longest_later;
      step_longest = std::max(step_longest, batch.seq_len);
      if (rank == 0) {
        padded += static_cast<double>(batch.seq_len);
        for (int64_t length : batch.lengths) real += static_cast<double>(length);
      }
    }
  }
  drawn.mean_padded = padded / static_cast<double>(drawn.micro_batches);
  drawn.mean_real_tokens = real / static_cast<double>(drawn.micro_batches);
  return drawn;
}

}  // namespace llmctl
