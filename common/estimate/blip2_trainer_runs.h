// Test support for BLIP-2's estimate tests (blip2_peak_test.cc, blip2_exact_test.cc): a
// configuration of experiments/cpu-lab-blip2.yaml with its model, the long captions that fill every
// micro-batch, and the model-state check on llm-train's smallest run of a configuration.
#ifndef LLMCTL_COMMON_ESTIMATE_BLIP2_TRAINER_RUNS_H_
#define LLMCTL_COMMON_ESTIMATE_BLIP2_TRAINER_RUNS_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/blip2_config.h"
#include "common/estimate/trainer_runs.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate::testing {

// experiments/data/captions' images, each caption said eight times, written under `dir`: longer
// than any data.max_seq_length here once tokenized, so every micro-batch is full.
std::filesystem::path WriteLongCaptions(const std::filesystem::path& dir);

// LoadCaseConfig's config and its BLIP-2 model.
struct Blip2Case {
  TrialConfig config;
  Blip2Config model;
};
StatusOr<Blip2Case> LoadBlip2Case(const Case& c, const Sets& common);

// Runs each of `cases` through llm-train under `dir` (events numbered from `first_index`) for one
// step of one micro-batch of at most `images` images (0: the case's own;
// testing::AtMostMicroBatches), no device budget, and expects its model state after the step to
// equal EstimateBlip2ModelState of the case's config byte for byte on every rank. The run checks
// the case's: the state holds the same tensors however many micro-batches a step accumulates, and
// for any batch of two or more images (one image differs: the class embedding's gradient then keeps
// a whole (1, P, C) storage), and the run's estimate must equal the case's in every figure. The
// one-rank runs share one llm-train process, each data-parallel run has its own
// (RunLlmTrainCases). Prints the runs' wall and CPU seconds.
void ExpectBlip2StatesExact(const std::vector<Case>& cases, const std::filesystem::path& dir,
                            int first_index, int64_t images);

}  // namespace llmctl::estimate::testing

#endif  // LLMCTL_COMMON_ESTIMATE_BLIP2_TRAINER_RUNS_H_
