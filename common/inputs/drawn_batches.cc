#include "common/inputs/drawn_batches.h"

#include <algorithm>
#include <memory>
#include <set>

#include "common/data/batch_iterator.h"
#include "common/data/token_file.h"
#include "common/inputs/captions.h"
#include "common/inputs/token_cache.h"

namespace llmctl {

namespace {

// The micro-batches of `config`'s run drawn from the token file at `path`, as llm-train's
// OpenTokenFileBatches draws them.
StatusOr<DrawnBatches> DrawFromTokenFile(const TrialConfig& config, const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<data::TokenFile> file, data::TokenFile::Open(path));
  const TrainSettings& train = config.settings().train;
  const int64_t micro = train.micro_batch_size;
  const int64_t ranks = DataParallelRanks(config);
  const int64_t accumulation = std::max<int64_t>(1, train.global_batch_size / (micro * ranks));
  RETURN_IF_ERROR(data::CheckOneMicroBatchPerRank(config.settings(), file->num_examples(), ranks));
  DrawnBatches drawn;
  drawn.steps = data::TotalSteps(train, file->num_examples(), micro * accumulation * ranks);
  drawn.micro_batches = drawn.steps * accumulation;
  const int64_t walked_rows = std::max(kMaxDrawnRows, 2 * file->num_examples());
  drawn.walked_micro_batches =
      std::min(drawn.micro_batches, std::max<int64_t>(1, walked_rows / (micro * ranks)));
  drawn.walked_steps = (drawn.walked_micro_batches + accumulation - 1) / accumulation;
  // A walk within the first step times that step's micro-batches: it has no others.
  const bool first_step_only = drawn.walked_micro_batches <= accumulation;
  double padded = 0;
  double real = 0;
  int64_t new_lengths = 0;
  std::set<int64_t> lengths_seen;  // rank 0's padded lengths so far
  drawn.step_real_tokens.assign(static_cast<size_t>(drawn.walked_steps), 0);
  for (int64_t rank = 0; rank < ranks; ++rank) {
    // As llm-train's OpenTokenFileBatches draws them.
    ASSIGN_OR_RETURN(data::BatchIterator iterator,
                     data::BatchIterator::Create(*file, data::BatchOptionsFor(train, rank, ranks)));
    for (int64_t i = 0; i < drawn.walked_micro_batches; ++i) {
      const data::Batch batch = iterator.Next();
      drawn.longest = std::max(drawn.longest, batch.seq_len);
      int64_t& step_longest = i < accumulation        ? drawn.longest_first_step
                              : i % accumulation == 0 ? drawn.longest_later_opening
                                                      : drawn.longest_later_accumulating;
      step_longest = std::max(step_longest, batch.seq_len);
      for (int64_t length : batch.lengths) {
        drawn.step_real_tokens[static_cast<size_t>(i / accumulation)] += length;
      }
      const bool new_length = rank == 0 && lengths_seen.insert(batch.seq_len).second;
      if (rank == 0 && (i >= accumulation || first_step_only)) {
        ++drawn.timed_micro_batches;
        new_lengths += new_length ? 1 : 0;
        padded += static_cast<double>(batch.seq_len);
        ++drawn.timed_padded_lengths[batch.seq_len];
        for (int64_t length : batch.lengths) real += static_cast<double>(length);
      }
    }
  }
  drawn.mean_padded = padded / static_cast<double>(drawn.timed_micro_batches);
  drawn.mean_real_tokens = real / static_cast<double>(drawn.timed_micro_batches);
  drawn.new_length_share =
      static_cast<double>(new_lengths) / static_cast<double>(drawn.timed_micro_batches);
  return drawn;
}

}  // namespace

StatusOr<DrawnBatches> DrawMicroBatches(const TrialConfig& config) {
  // Read once here: a token cache that cannot be used is no reason to fail (a temporary file).
  ASSIGN_OR_RETURN(const TokenFileRef file, PrepareTokensToRead(config));
  return DrawFromTokenFile(config, file.path());
}

StatusOr<DrawnBatches> DrawCaptionBatches(const TrialConfig& config, const Blip2Config& model) {
  ASSIGN_OR_RETURN(const std::vector<image::CaptionedImage> images, ReadTrialImages(config));
  return DrawCaptionBatches(config, model, images);
}

StatusOr<DrawnBatches> DrawCaptionBatches(const TrialConfig& config, const Blip2Config& model,
                                          const std::vector<image::CaptionedImage>& images) {
  ASSIGN_OR_RETURN(const TokenFileRef file, PrepareCaptionTokensToRead(config, model, images));
  return DrawFromTokenFile(config, file.path());
}

}  // namespace llmctl
