// Micro-batches from a token file: seeded per-epoch shuffling, right padding, HF-aligned labels.
//
// The order is a pure function of (seed, epoch), so a run resumed from a checkpoint that saved
// position() sees exactly the batches the uninterrupted run would have seen. The shuffle uses only
// std::mt19937_64 (whose output the standard fixes) and our own Fisher–Yates and bounded sampling:
// std::shuffle and std::uniform_int_distribution differ between standard libraries, which would
// make the order depend on the compiler.
#ifndef LLMCTL_COMMON_DATA_BATCH_ITERATOR_H_
#define LLMCTL_COMMON_DATA_BATCH_ITERATOR_H_

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/trial_settings.h"
#include "common/data/token_file.h"

namespace llmctl::data {

struct BatchOptions {
  int64_t micro_batch_size = 1;
  uint64_t seed = 0;
  bool shuffle = true;     // false: file order every epoch
  bool drop_last = false;  // true: skip an epoch's final, smaller batch
  int32_t pad_id = -1;     // < 0: the file's EOS id, or 0 when the tokenizer has none
  // Data parallelism as PyTorch's DistributedSampler shards it: the ranks walk the same epoch order
  // together, world_size * micro_batch_size examples at a time, and rank r takes every
  // world_size-th of them from the r-th on, so each example of an epoch goes to exactly one rank. A
  // rank's batch is then a slice of the batch one process with world_size times the micro-batch
  // would see.
  int64_t rank = 0;
  int64_t world_size = 1;
};

// A trial's micro-batches as llm-train draws them (train.micro_batch_size, shuffled with its seed),
// as rank `rank` of `world_size` data-parallel ranks; whole micro-batches only, so accumulation's
// weights and shapes stay uniform. The pad id stays the file's.
BatchOptions BatchOptionsFor(const TrainSettings& train, int64_t rank, int64_t world_size);

// InvalidArgument, naming the trial's data.path, when `examples` are fewer than one micro-batch on
// each of `world_size` ranks.
Status CheckOneMicroBatchPerRank(const TrialSettings& settings, int64_t examples,
                                 int64_t world_size);

// The optimizer steps of a trial's run over `examples` examples of `global_batch` a step:
// train.max_steps, else train.epochs whole passes (at least one step each).
int64_t TotalSteps(const TrainSettings& train, int64_t examples, int64_t global_batch);

// A micro-batch as plain row-major vectors; the trainer wraps them in tensors.
struct Batch {
  int64_t rows = 0;                // B: micro_batch_size, or fewer at an epoch's end
  int64_t seq_len = 0;             // T: the longest example in this batch, not max_seq_length
  std::vector<int64_t> input_ids;  // [B, T], right-padded with pad_id
  std::vector<int64_t> labels;     // [B, T], aligned with input_ids; -100 on prompt and padding
  std::vector<int64_t> lengths;    // [B], real tokens per row (the attention mask's extent)
  std::vector<int64_t> example_indices;  // [B], indices into the token file
  // Positions t < length-1 whose next-token target labels[t+1] is not -100: the denominator of the
  // mean cross-entropy over the micro-batch (Hugging Face's definition). Can be 0 when every target
  // was cut off by max_seq_length; the trainer must not divide by it then.
  int64_t num_target_tokens = 0;
  int64_t epoch = 0;  // epoch these rows belong to
};

// Where the iterator stands: the next batch starts at example order[index] of `epoch`'s
// permutation (the ranks' shared index: the same on every rank). Saved with a checkpoint and given
// back to Restore.
struct BatchPosition {
  int64_t epoch = 0;
  int64_t index = 0;
  bool operator==(const BatchPosition&) const = default;
};

class BatchIterator {
 public:
  // Borrows `file`, which must outlive the iterator. Fails on micro_batch_size < 1, a rank outside
  // [0, world_size), or drop_last with fewer examples than one batch of every rank.
  static StatusOr<BatchIterator> Create(const TokenFile& file, const BatchOptions& options);

  // The next micro-batch. Never runs out: after an epoch's last batch comes the first batch of the
  // next epoch, in that epoch's order.
  Batch Next();

  BatchPosition position() const { return {epoch_, index_}; }
  // Continues from a saved position; fails when the position cannot belong to this file and
  // options.
  Status Restore(const BatchPosition& position);

  int64_t batches_per_epoch() const;
  int32_t pad_id() const { return pad_id_; }
  // Example indices of the current epoch, in the order they are served.
  const std::vector<int64_t>& epoch_order() const { return order_; }

  // The permutation of [0, n) used for `epoch` (identity without shuffle). Exposed for tests and
  // tools.
  static std::vector<int64_t> EpochOrder(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

 private:
  BatchIterator(const TokenFile& file, const BatchOptions& options, int32_t pad_id);
  void StartEpoch(int64_t epoch);

  const TokenFile* file_;
  BatchOptions options_;
  int32_t pad_id_;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace llmctl::data

#endif  // LLMCTL_COMMON_DATA_BATCH_ITERATOR_H_
