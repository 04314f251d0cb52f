// The micro-batches estimate draws are the ones llm-train trains on, step by step, for a demo run:
// each step's count of real (non-padding) tokens is the one llm-train's step event reports (the
// events count a step's tokens; which tokens they were is not in them).
#include "common/inputs/drawn_batches.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/blip2_config.h"
#include "common/data/batch_iterator.h"
#include "common/data/token_file.h"
#include "common/experiment.h"
#include "common/inputs/token_cache.h"
#include "tests/support/shell_command.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

std::string Source() { return testing::SourceDir().string(); }

// The tokens of each step of llm-train's run of `file` (`trial_flags`: which trial), as its step
// events report them.
std::vector<int64_t> StepTokensOfARun(const std::string& file, const std::string& trial_flags) {
  const fs::path events =
      fs::temp_directory_path() / ("llmctl-drawn-" + std::to_string(::getpid()) + ".jsonl");
  const testing::CommandResult run =
      testing::RunShellCommand((testing::BuildDir() / "trainer/llm-train").string() + " --config " +
                               file + " " + trial_flags + " --events " + events.string());
  EXPECT_EQ(run.exit_code, 0) << run.out;
  std::ifstream in(events);
  std::vector<int64_t> tokens;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json event = nlohmann::json::parse(line);
    if (event["type"] == "step") tokens.push_back(event["tokens"].get<int64_t>());
  }
  fs::remove(events);
  return tokens;
}

TEST(DrawnBatchesTest, TheRunsRealTokensAreTheOnesDrawn) {
  const std::string file = Source() + "/experiments/demo.yaml";
  StatusOr<Experiment> experiment = LoadExperimentFile(file);
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  const TrialConfig& config = experiment->trials.front().config;
  StatusOr<DrawnBatches> drawn = DrawMicroBatches(config);
  ASSERT_TRUE(drawn.ok()) << drawn.status().message();
  EXPECT_EQ(drawn->steps, config.GetInt("train.max_steps"));
  EXPECT_EQ(drawn->micro_batches, drawn->steps * 2);  // global batch 8 of micro-batches of 4
  EXPECT_LE(drawn->longest, config.GetInt("data.max_seq_length"));
  // Every micro-batch is a first step's, a later step's opening one or one accumulating after it.
  EXPECT_EQ(std::max({drawn->longest_first_step, drawn->longest_later_opening,
                      drawn->longest_later_accumulating}),
            drawn->longest);
  EXPECT_GT(drawn->longest_later_accumulating, 0);
  EXPECT_LE(drawn->mean_padded, static_cast<double>(drawn->longest));
  EXPECT_LE(drawn->mean_real_tokens, 4 * drawn->mean_padded);

  EXPECT_EQ(StepTokensOfARun(file, ""), drawn->step_real_tokens);
  // The means are the timed steps': every step's but the first.
  ASSERT_GT(drawn->steps, 1);
  EXPECT_EQ(drawn->timed_micro_batches, drawn->micro_batches - 2);
  // Their padded lengths, each with its micro-batches: as many, at the mean length.
  int64_t by_length = 0;
  double padded = 0;
  for (const auto& [length, micro_batches] : drawn->timed_padded_lengths) {
    EXPECT_LE(length, drawn->longest);
    by_length += micro_batches;
    padded += static_cast<double>(length * micro_batches);
  }
  EXPECT_EQ(by_length, drawn->timed_micro_batches);
  EXPECT_NEAR(padded / static_cast<double>(by_length), drawn->mean_padded, 1e-9);
  EXPECT_GT(drawn->timed_padded_lengths.size(), 1u);
  int64_t timed = 0;
  for (size_t step = 1; step < drawn->step_real_tokens.size(); ++step) {
    timed += drawn->step_real_tokens[step];
  }
  EXPECT_DOUBLE_EQ(static_cast<double>(timed),
                   drawn->mean_real_tokens * static_cast<double>(drawn->timed_micro_batches));
}

// A BLIP-2 trial's micro-batches, drawn from its caption set: a row is the image's query places and
// its caption, and the tokens llm-train's steps count are those of the rows drawn.
TEST(DrawnBatchesTest, ABlip2RunsTokensAreTheCaptionRowsDrawn) {
  const std::string file = Source() + "/experiments/cpu-product.yaml";
  StatusOr<Experiment> experiment = LoadExperimentFile(file);
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  const auto trial = std::find_if(experiment->trials.begin(), experiment->trials.end(),
                                  [](const Trial& t) { return t.name == "reduced-batch"; });
  ASSERT_NE(trial, experiment->trials.end());
  const TrialConfig& config = trial->config;
  StatusOr<std::optional<Blip2Config>> model = ResolveBlip2Model(config.settings().model.name);
  ASSERT_TRUE(model.ok() && model->has_value()) << config.settings().model.name;
  StatusOr<DrawnBatches> drawn = DrawCaptionBatches(config, **model);
  ASSERT_TRUE(drawn.ok()) << drawn.status().message();
  const int64_t queries = (*model)->num_query_tokens;
  const int64_t micro = config.settings().train.micro_batch_size;
  EXPECT_EQ(drawn->steps, config.settings().train.max_steps);
  EXPECT_GT(drawn->longest, queries);
  EXPECT_LE(drawn->longest, queries + config.settings().data.max_seq_length);
  // Every row holds its image's query places, and some caption besides.
  EXPECT_GT(drawn->mean_real_tokens, static_cast<double>(micro * queries));
  EXPECT_LE(drawn->mean_real_tokens, static_cast<double>(micro) * drawn->mean_padded);

  EXPECT_EQ(StepTokensOfARun(file, "--trial reduced-batch"), drawn->step_real_tokens);
}

// The share of the timed micro-batches at a padded length no earlier micro-batch had (each then
// builds its GEMM kernels anew on a CPU that does so per shape), walked here batch by batch as
// llm-train draws them; none when every row is cut to data.max_seq_length.
TEST(DrawnBatchesTest, NewLengthsAreThoseNoEarlierMicroBatchHad) {
  const std::string file = Source() + "/experiments/demo.yaml";
  StatusOr<Experiment> experiment = LoadExperimentFile(file);
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  TrialConfig config = experiment->trials.front().config;
  StatusOr<DrawnBatches> drawn = DrawMicroBatches(config);
  ASSERT_TRUE(drawn.ok()) << drawn.status().message();
  StatusOr<std::string> tokens = PrepareTokens(config);
  ASSERT_TRUE(tokens.ok()) << tokens.status().message();
  StatusOr<std::unique_ptr<data::TokenFile>> token_file = data::TokenFile::Open(*tokens);
  ASSERT_TRUE(token_file.ok());
  const TrainSettings& train = config.settings().train;
  StatusOr<data::BatchIterator> batches =
      data::BatchIterator::Create(**token_file, data::BatchOptionsFor(train, 0, 1));
  ASSERT_TRUE(batches.ok());
  const int64_t accumulation = train.global_batch_size / train.micro_batch_size;
  std::set<int64_t> seen;
  int64_t fresh = 0;
  for (int64_t i = 0; i < drawn->micro_batches; ++i) {
    const bool new_length = seen.insert(batches->Next().seq_len).second;
    if (i >= accumulation && new_length) ++fresh;
  }
  EXPECT_GT(fresh, 0);
  EXPECT_DOUBLE_EQ(drawn->new_length_share,
                   static_cast<double>(fresh) / static_cast<double>(drawn->timed_micro_batches));
  // Every row cut to 8 tokens: one length, the first step's.
  ASSERT_TRUE(config.SetFromText("data.max_seq_length", "8").ok());
  StatusOr<DrawnBatches> cut = DrawMicroBatches(config);
  ASSERT_TRUE(cut.ok()) << cut.status().message();
  EXPECT_EQ(cut->longest, 8);
  EXPECT_EQ(cut->new_length_share, 0);
}

// A run of 2^20 steps of 8 rows is walked for its first kMaxDrawnRows rows (the 2^32 steps llmctl
// takes were walked whole: 34 GB and 40 minutes); the peak is still the longest drawn.
TEST(DrawnBatchesTest, ALongRunIsWalkedForItsFirstRowsOnly) {
  StatusOr<Experiment> experiment = LoadExperimentFile(Source() + "/experiments/demo.yaml");
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  TrialConfig config = experiment->trials.front().config;
  ASSERT_TRUE(config.SetFromText("train.max_steps", std::to_string(1 << 20)).ok());
  StatusOr<DrawnBatches> drawn = DrawMicroBatches(config);
  ASSERT_TRUE(drawn.ok()) << drawn.status().message();
  EXPECT_EQ(drawn->steps, 1 << 20);
  EXPECT_EQ(drawn->walked_steps, kMaxDrawnRows / 8);
  EXPECT_EQ(drawn->walked_micro_batches, kMaxDrawnRows / 4);
  EXPECT_EQ(drawn->step_real_tokens.size(), static_cast<size_t>(drawn->walked_steps));
  EXPECT_EQ(drawn->timed_micro_batches, drawn->walked_micro_batches - 2);
  EXPECT_EQ(std::max({drawn->longest_first_step, drawn->longest_later_opening,
                      drawn->longest_later_accumulating}),
            drawn->longest);
}

// A step of more than kMaxDrawnRows rows is walked in part, and its micro-batches are the ones
// timed.
TEST(DrawnBatchesTest, AWalkWithinTheFirstStepTimesIt) {
  StatusOr<Experiment> experiment = LoadExperimentFile(Source() + "/experiments/demo.yaml");
  ASSERT_TRUE(experiment.ok()) << experiment.status().message();
  TrialConfig config = experiment->trials.front().config;
  ASSERT_TRUE(
      config.SetFromText("train.global_batch_size", std::to_string(2 * kMaxDrawnRows)).ok());
  ASSERT_TRUE(config.SetFromText("train.max_steps", "2").ok());
  StatusOr<DrawnBatches> drawn = DrawMicroBatches(config);
  ASSERT_TRUE(drawn.ok()) << drawn.status().message();
  EXPECT_EQ(drawn->walked_steps, 1);
  EXPECT_EQ(drawn->walked_micro_batches, kMaxDrawnRows / 4);
  EXPECT_EQ(drawn->timed_micro_batches, drawn->walked_micro_batches);
  EXPECT_GT(drawn->mean_padded, 0);
  EXPECT_EQ(drawn->longest_later_opening, 0);
}

}  // namespace
}  // namespace llmctl
