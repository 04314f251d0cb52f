// The micro-batches a text trial will draw, before it runs: its dataset tokenized as llm-train
// tokenizes it (the token cache), walked in the order the trial's seed shuffles it, each rank its
// DistributedSampler shard, for the run's steps and accumulation. llm-train pads a micro-batch to
// its longest row, so the longest micro-batch sets the step's peak and the padded lengths its time.
// No LibTorch: `llmctl estimate` reads it.
#ifndef LLMCTL_COMMON_INPUTS_DRAWN_BATCHES_H_
#define LLMCTL_COMMON_INPUTS_DRAWN_BATCHES_H_

#include <cstdint>
#include <map>
#include <vector>

#include "common/blip2_config.h"
#include "common/image/imagefolder.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl {

// The rows a walk draws at most over every rank, unless two epochs of the dataset are more: past
// them a run reshuffles the same examples, so its lengths are those already drawn. It bounds the
// walk's time (about a second) and memory: the run itself may be 2^32 steps of 2^30 rows.
inline constexpr int64_t kMaxDrawnRows = int64_t{1} << 22;

struct DrawnBatches {
  int64_t steps = 0;          // the run's optimizer steps
  int64_t micro_batches = 0;  // the run's, drawn by each rank
  // The first steps drawn by each rank, all of the run's when it is at most kMaxDrawnRows (the
  // last may be part of a step when one step is more); what follows is of those.
  int64_t walked_steps = 0;
  int64_t walked_micro_batches = 0;
  int64_t longest = 0;  // tokens of the longest micro-batch any rank draws
  // The same over the first step's micro-batches and over the later steps': the optimizer's
  // state exists from the first step's end on, so the two peak differently. A later step's first
  // micro-batch runs before any gradient is held and the others beside the gradients of those
  // before them (accumulation), so those two peak differently too (0 without accumulation).
  int64_t longest_first_step = 0;
  int64_t longest_later_opening = 0;
  int64_t longest_later_accumulating = 0;
  // The means over rank 0's micro-batches of the steps after the first (of the first when the walk
  // has no other): the steps whose tokens/s `llmctl report` measures, since the first also does
  // one-time work (controller/cli/report_rows.h, SteadyTokensPerSecond), so the time is predicted
  // at them.
  int64_t timed_micro_batches = 0;
  double mean_padded = 0;       // a micro-batch's mean length (the longest of its rows)
  double mean_real_tokens = 0;  // a micro-batch's mean real (non-padding) tokens
  // How many of those micro-batches are padded to each length: a step's attention grows as the
  // square of its length, so its mean over lengths that spread is more than the mean length's.
  std::map<int64_t, int64_t> timed_padded_lengths;
  // Of those micro-batches, the share whose padded length no earlier micro-batch of rank 0 had: a
  // shape new to the run (a CPU's 16-bit GEMMs build their kernels for each new shape).
  double new_length_share = 0;
  // Each walked step's real tokens over every rank and micro-batch: llm-train's step events'
  // "tokens".
  std::vector<int64_t> step_real_tokens;
};

// Draws the micro-batches of `config`'s run (train.max_steps, else train.epochs over the data) on
// every rank, up to kMaxDrawnRows. Errors as the trainer's preparation of the data (naming the file
// and line), and InvalidArgument for a dataset smaller than one micro-batch of every rank.
StatusOr<DrawnBatches> DrawMicroBatches(const TrialConfig& config);

// The same for a BLIP-2 trial's caption set (data.format imagefolder) on `model`: a row is the
// image's query places and its caption (common/inputs/captions.h), so its length and tokens count
// both, as llm-train's step events do. Errors as the trainer's reading of the set.
StatusOr<DrawnBatches> DrawCaptionBatches(const TrialConfig& config, const Blip2Config& model);
// The same over `images`, the set as ReadTrialImages read it.
StatusOr<DrawnBatches> DrawCaptionBatches(const TrialConfig& config, const Blip2Config& model,
                                          const std::vector<image::CaptionedImage>& images);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_INPUTS_DRAWN_BATCHES_H_
