// What the BLIP-2 trial tests share, whichever language model their fixture has (OPT or T5): a
// caption trial of a fixture model, its resolved config, and the checks that read the fixture's
// expected.json (the ids, labels and losses transformers gives each example).
#ifndef LLMCTL_TRAINER_TESTING_CAPTION_TRIALS_H_
#define LLMCTL_TRAINER_TESTING_CAPTION_TRIALS_H_

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/blip2_config.h"
#include "common/trial_config.h"

namespace llmctl::trainer::testing {

// A test whose trials write the captions' token file into a cache of its own.
class CaptionTrialTest : public ::testing::Test {
 protected:
  void SetUp() override;
};

// tests/fixtures/blip2/captions: 6 captioned images.
std::string CaptionsDir();

// A trial of the fixture model in `model_dir` (its weights and tokenizer) on CaptionsDir(),
// captions cut at 12 tokens, each step 2 micro-batches of 2, 2 steps at lr 1e-3; then `overrides`.
TrialConfig CaptionTrial(const std::string& model_dir,
                         const std::vector<std::pair<std::string, std::string>>& overrides = {});

// `model_dir`'s config.json, resolved.
Blip2Config FixtureBlip2Config(const std::string& model_dir);

// CaptionTrial(model_dir) trains on the 6 examples, every parameter trainable, its second step's
// loss below its first, and accounts fp32 AdamW's bytes: the parameters, as much again in
// gradients after backward, twice that in optimizer state (and the step count the moments share).
void ExpectTrialTrainsAndAccountsEveryPart(const std::string& model_dir);

// CaptionTrial(model_dir, row) for each of `rows` (a technique of the lab's each) runs to finite
// losses.
void ExpectEachTrialRunsToFiniteLosses(
    const std::string& model_dir,
    const std::vector<std::vector<std::pair<std::string, std::string>>>& rows);

// Three micro-batches of 2 from the trial's batches: each row's ids are expected.json's (the
// placeholders, then the caption as the tokenizer frames it), its labels the ids with -100 on the
// placeholders, the rest the language model's pad id with label -100 and attention mask false; each
// micro-batch's label tokens the sum of its examples'; the epoch visits every image once.
void ExpectMicroBatchesAreTheLabs(const std::string& model_dir);

// Each of three micro-batches' loss (plain and chunked) is the mean transformers gives its
// examples.
void ExpectMicroBatchLossesAreTransformers(const std::string& model_dir);

// 2 ranks of `strategy` with 2 images each against one process of 4, on 4 of the images (one
// global batch, so that the third run of ExpectTwoRanksTrainLikeOneProcess draws the same
// examples) and a copy of `model_dir` without dropout (`dropout_keys`: config.json's "section.key"
// probabilities set to 0): the same losses and final weights within the summation orders' bound
// (ExpectTwoRanksTrainLikeOneProcess, with its `stray_fraction`).
// `sets` (key=value) apply to both runs, `variant` names them. The sets the two-rank run used go to
// `two_rank_sets` when given.
void ExpectDataParallelTrainsLikeOneProcess(const std::string& model_dir,
                                            const std::vector<std::string>& dropout_keys,
                                            const std::string& strategy,
                                            std::vector<std::string>* two_rank_sets = nullptr,
                                            const std::vector<std::string>& sets = {},
                                            const std::string& variant = "",
                                            double stray_fraction = 0.0);

}  // namespace llmctl::trainer::testing

#endif  // LLMCTL_TRAINER_TESTING_CAPTION_TRIALS_H_
