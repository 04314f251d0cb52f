#include "common/data/batch_iterator.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace llmctl::data {
namespace {

// SplitMix64's finalizer: spreads (seed, epoch) so that neighbouring seeds or epochs give unrelated
// mt19937_64 streams.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) by rejection: unbiased, and the same on every standard library.
uint64_t Below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
  while (true) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

std::vector<int64_t> BatchIterator::EpochOrder(int64_t n, uint64_t seed, int64_t epoch,
                                               bool shuffle) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  if (!shuffle) return order;
  std::mt19937_64 rng(Mix(seed ^ Mix(static_cast<uint64_t>(epoch))));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(Below(rng, static_cast<uint64_t>(i) + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

StatusOr<BatchIterator> BatchIterator::Create(const TokenFile& file, const BatchOptions& options) {
  if (options.micro_batch_size < 1) {
    return InvalidArgumentError("micro_batch_size must be at least 1, got " +
                                std::to_string(options.micro_batch_size));
  }
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgumentError("rank " + std::to_string(options.rank) + " is not one of " +
                                std::to_string(options.world_size) + " ranks");
  }
  const int64_t round = options.micro_batch_size * options.world_size;
  if (options.drop_last && round > file.num_examples()) {
    std::string batch = "micro_batch_size " + std::to_string(options.micro_batch_size);
    if (options.world_size > 1) batch += " x " + std::to_string(options.world_size) + " ranks";
    return InvalidArgumentError(batch + " exceeds the " + std::to_string(file.num_examples()) +
                                " examples in " + file.path() +
                                " and drop_last is set: no batch "
                                "would ever be produced");
  }
  int32_t pad_id = options.pad_id;
  if (pad_id < 0) pad_id = file.eos_id() >= 0 ? file.eos_id() : 0;
  return BatchIterator(file, options, pad_id);
}

BatchIterator::BatchIterator(const TokenFile& file, const BatchOptions& options, int32_t pad_id)
    : file_(&file), options_(options), pad_id_(pad_id) {
  StartEpoch(0);
}

void BatchIterator::StartEpoch(int64_t epoch) {
  epoch_ = epoch;
  index_ = 0;
  order_ = EpochOrder(file_->num_examples(), options_.seed, epoch, options_.shuffle);
}

int64_t BatchIterator::batches_per_epoch() const {
  const int64_t n = file_->num_examples(), b = options_.micro_batch_size * options_.world_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

Status BatchIterator::Restore(const BatchPosition& position) {
  const int64_t n = file_->num_examples();
  if (position.epoch < 0 || position.index < 0 || position.index > n) {
    return InvalidArgumentError("batch position (epoch " + std::to_string(position.epoch) +
                                ", index " + std::to_string(position.index) +
                                ") is outside a dataset of " + std::to_string(n) + " examples");
  }
  StartEpoch(position.epoch);
  index_ = position.index;
  return Status::Ok();
}

Batch BatchIterator::Next() {
  const int64_t n = file_->num_examples();
  const int64_t world = options_.world_size;
  const int64_t round = options_.micro_batch_size * world;
  // An epoch is over when nothing is left, or (drop_last) less than a full batch of every rank.
  if (index_ >= n || (options_.drop_last && n - index_ < round)) StartEpoch(epoch_ + 1);

  Batch batch;
  batch.epoch = epoch_;
  const int64_t taken = std::min(round, n - index_);
  for (int64_t i = options_.rank; i < taken; i += world) {
    batch.example_indices.push_back(order_[index_ + i]);
  }
  batch.rows = static_cast<int64_t>(batch.example_indices.size());
  index_ += taken;

  for (int64_t e : batch.example_indices) {
    batch.lengths.push_back(file_->length(e));
    batch.seq_len = std::max(batch.seq_len, file_->length(e));
  }
  const int64_t t_max = batch.seq_len;
  batch.input_ids.assign(batch.rows * t_max, pad_id_);
  batch.labels.assign(batch.rows * t_max, kIgnoreIndex);
  for (int64_t row = 0; row < batch.rows; ++row) {
    const int64_t example = batch.example_indices[row];
    const std::span<const int32_t> ids = file_->input_ids(example);
    const std::span<const uint8_t> mask = file_->label_mask(example);
    int64_t* row_ids = batch.input_ids.data() + row * t_max;
    int64_t* row_labels = batch.labels.data() + row * t_max;
    for (size_t t = 0; t < ids.size(); ++t) {
      row_ids[t] = ids[t];
      if (mask[t]) {
        row_labels[t] = ids[t];
        if (t > 0) ++batch.num_target_tokens;  // the target of position t-1 after the model's shift
      }
    }
  }
  return batch;
}

BatchOptions BatchOptionsFor(const TrainSettings& train, int64_t rank, int64_t world_size) {
  BatchOptions options;
  options.micro_batch_size = train.micro_batch_size;
  options.seed = static_cast<uint64_t>(train.seed);
  options.rank = rank;
  options.world_size = world_size;
  options.drop_last = true;
  return options;
}

Status CheckOneMicroBatchPerRank(const TrialSettings& settings, int64_t examples,
                                 int64_t world_size) {
  const int64_t micro = settings.train.micro_batch_size;
  if (examples >= micro * world_size) return Status::Ok();
  std::string batch = "one micro-batch of " + std::to_string(micro);
  if (world_size > 1) batch += " on each of " + std::to_string(world_size) + " ranks";
  return InvalidArgumentError(settings.data.path + " has " + std::to_string(examples) +
                              " examples, fewer than " + batch);
}

int64_t TotalSteps(const TrainSettings& train, int64_t examples, int64_t global_batch) {
  if (train.max_steps > 0) return train.max_steps;
  const int64_t steps_per_epoch = std::max<int64_t>(1, examples / global_batch);
  return steps_per_epoch * std::max<int64_t>(1, train.epochs);
}

}  // namespace llmctl::data
