#include "trainer/testing/caption_trials.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "trainer/testing/ranked_demo.h"
#include "trainer/testing/trial_runner.h"
#include "trainer/train/caption_batches.h"
#include "trainer/train/trained_model.h"

namespace llmctl::trainer::testing {
namespace {

nlohmann::json Expected(const std::string& model_dir) {
  std::ifstream in(model_dir + "/expected.json");
  return nlohmann::json::parse(in);
}

}  // namespace

void CaptionTrialTest::SetUp() {
  setenv("LLMCTL_CACHE_DIR", FreshTempDir("caption-trial-cache").c_str(), 1);
}

std::string CaptionsDir() { return SourceDir() + "/tests/fixtures/blip2/captions"; }

TrialConfig CaptionTrial(const std::string& model_dir,
                         const std::vector<std::pair<std::string, std::string>>& overrides) {
  TrialConfig config;
  const std::vector<std::pair<std::string, std::string>> base = {
      {"model", model_dir},
      {"init", "pretrained"},
      {"data.path", CaptionsDir()},
      {"data.format", "imagefolder"},
      {"data.max_seq_length", "12"},
      {"train.micro_batch_size", "2"},
      {"train.global_batch_size", "4"},
      {"train.max_steps", "2"},
      {"train.lr", "1e-3"},
      {"seed", "3"},
  };
  for (const auto& list : {base, overrides}) {
    for (const auto& [key, value] : list) {
      const Status status = config.SetFromText(key, value);
      EXPECT_TRUE(status.ok()) << key << "=" << value << ": " << status.ToString();
    }
  }
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok())
      << ValidateTrialConfig(config, nullptr).ToString();
  return config;
}

Blip2Config FixtureBlip2Config(const std::string& model_dir) {
  auto config = ResolveBlip2Model(model_dir);
  EXPECT_TRUE(config.ok() && config->has_value()) << config.status().ToString();
  return config.ok() && config->has_value() ? **config : Blip2Config();
}

void ExpectTrialTrainsAndAccountsEveryPart(const std::string& model_dir) {
  const TrialRecord run = RunAndRecord(CaptionTrial(model_dir));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const Blip2ParameterCounts counts = CountBlip2Parameters(FixtureBlip2Config(model_dir));
  const nlohmann::json start = run.OfType("start").at(0);
  EXPECT_EQ(start["parameters_total"], counts.total());
  EXPECT_EQ(start["parameters_trainable"], counts.total());
  EXPECT_EQ(start["examples"], 6);
  const std::vector<double> losses = run.Losses();
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_LT(losses[1], losses[0]) << "one AdamW step at lr 1e-3 lowers the captions' loss";
  const int64_t param_bytes = counts.total() * 4;
  EXPECT_EQ(run.Snapshot(0, 0, "phase0_before_fwd")["params_bytes"], param_bytes);
  EXPECT_EQ(run.Snapshot(0, 1, "phase2_after_bwd")["grads_bytes"], param_bytes);
  EXPECT_EQ(run.Snapshot(0, 1, "phase3_after_opt_step")["optim_device_bytes"], 2 * param_bytes + 4);
}

void ExpectEachTrialRunsToFiniteLosses(
    const std::string& model_dir,
    const std::vector<std::vector<std::pair<std::string, std::string>>>& rows) {
  for (const auto& keys : rows) {
    std::string name;
    for (const auto& [key, value] : keys) name += key + "=" + value + " ";
    SCOPED_TRACE(name);
    const TrialRecord run = RunAndRecord(CaptionTrial(model_dir, keys));
    ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
    for (double loss : run.Losses()) EXPECT_TRUE(std::isfinite(loss));
  }
}

void ExpectMicroBatchesAreTheLabs(const std::string& model_dir) {
  const Blip2Config model = FixtureBlip2Config(model_dir);
  const nlohmann::json expected = Expected(model_dir);
  auto batches = OpenCaptionBatches(CaptionTrial(model_dir), model, 0, 1);
  ASSERT_TRUE(batches.ok()) << batches.status().ToString();
  EXPECT_EQ((*batches)->num_examples(), 6);
  std::set<int64_t> seen;
  for (int i = 0; i < 3; ++i) {
    const MicroBatch batch = (*batches)->Next(2, torch::kCPU);
    ASSERT_EQ(batch.example_indices.size(), 2u);
    ASSERT_EQ(batch.pixel_values.sizes(), (std::vector<int64_t>{2, 3, 28, 28}));
    int64_t label_tokens = 0;
    for (int64_t row = 0; row < 2; ++row) {
      const int64_t example = batch.example_indices[row];
      seen.insert(example);
      const std::vector<int64_t> ids = expected["examples"][example]["input_ids"];
      const int64_t length = static_cast<int64_t>(ids.size());
      for (int64_t t = 0; t < batch.input_ids.size(1); ++t) {
        SCOPED_TRACE("example " + std::to_string(example) + " position " + std::to_string(t));
        const int64_t id = batch.input_ids[row][t].item<int64_t>();
        const int64_t label = batch.labels[row][t].item<int64_t>();
        const bool real = batch.attention_mask[row][t].item<bool>();
        if (t < length) {
          EXPECT_EQ(id, ids[t]);
          EXPECT_EQ(label, t < model.num_query_tokens ? -100 : ids[t]);
          EXPECT_TRUE(real);
        } else {
          EXPECT_EQ(id, model.text_pad_token_id());
          EXPECT_EQ(label, -100);
          EXPECT_FALSE(real);
        }
      }
      label_tokens += expected["examples"][example]["label_tokens"].get<int64_t>();
    }
    // What the step's weights divide by: the shifted targets (OPT), the decoder's labels (T5).
    EXPECT_EQ(batch.label_tokens, label_tokens);
  }
  EXPECT_EQ(seen.size(), 6u) << "an epoch visits every image once";
}

void ExpectMicroBatchLossesAreTransformers(const std::string& model_dir) {
  const Blip2Config model_config = FixtureBlip2Config(model_dir);
  const nlohmann::json expected = Expected(model_dir);
  ModelBuildOptions options;
  options.init = "pretrained";
  options.model_dir = model_dir;
  auto model = BuildTrainedModel(TrialModelConfig(model_config), options);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  (*model)->module().eval();
  auto batches = OpenCaptionBatches(CaptionTrial(model_dir), model_config, 0, 1);
  ASSERT_TRUE(batches.ok()) << batches.status().ToString();
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 3; ++i) {
    const MicroBatch batch = (*batches)->Next(2, torch::kCPU);
    double loss_sum = 0.0;
    int64_t tokens = 0;
    for (int64_t example : batch.example_indices) {
      loss_sum += expected["examples"][example]["loss_sum"].get<double>();
      tokens += expected["examples"][example]["label_tokens"].get<int64_t>();
    }
    const double want = loss_sum / static_cast<double>(tokens);
    EXPECT_NEAR((*model)->Loss(batch, /*chunked=*/false).item<double>(), want, 1e-5 * want);
    EXPECT_NEAR((*model)->Loss(batch, /*chunked=*/true).item<double>(), want, 1e-5 * want);
  }
}

void ExpectDataParallelTrainsLikeOneProcess(const std::string& model_dir,
                                            const std::vector<std::string>& dropout_keys,
                                            const std::string& strategy,
                                            std::vector<std::string>* two_rank_sets,
                                            const std::vector<std::string>& sets,
                                            const std::string& variant, double stray_fraction) {
  const std::string model = FreshTempDir("blip2-no-dropout");
  std::filesystem::copy(
      model_dir, model,
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(model_dir + "/config.json"));
  for (const std::string& key : dropout_keys) {
    const size_t dot = key.find('.');
    config[key.substr(0, dot)][key.substr(dot + 1)] = 0.0;
  }
  std::ofstream(model + "/config.json", std::ios::trunc) << config.dump();
  // 4 of the 6 images, one step's worth: every run then draws each step's examples from one
  // epoch. With 6, the sample of the other order (ranked_demo.h: micro-batches of 2, accumulated)
  // takes the first epoch's last 2 and the next epoch's first 2 in its second step, where the one
  // process and the ranks (4 examples a round) drop those 2.
  const std::vector<std::string> blip2 = {"model=" + model,        "init=pretrained",
                                          "tokenizer=" + model,    "data.path=" + CaptionsDir(),
                                          "data.samples=4",        "data.format=imagefolder",
                                          "data.max_seq_length=12"};
  std::vector<std::string> one = blip2, two = blip2;
  one.insert(one.end(), {"train.micro_batch_size=4", "train.global_batch_size=4"});
  two.insert(two.end(), {"train.micro_batch_size=2", "train.global_batch_size=4"});
  one.insert(one.end(), sets.begin(), sets.end());
  two.insert(two.end(), sets.begin(), sets.end());
  ExpectTwoRanksTrainLikeOneProcess(strategy, "blip2-" + strategy + variant, one, two, 2,
                                    stray_fraction);
  if (two_rank_sets != nullptr) *two_rank_sets = two;
}

}  // namespace llmctl::trainer::testing
