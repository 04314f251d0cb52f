// BLIP-2 trials end to end: the captions' micro-batches against the labs' pipeline (transformers'
// tokenizer and Blip2Processor's layout, tests/fixtures/blip2/opt-tiny-captioning/expected.json),
// the loss of a batch against transformers', and llm-train's trial loop with the labs' techniques.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/blip2_config.h"
#include "common/experiment.h"
#include "common/trial_config.h"
#include "trainer/testing/ranked_demo.h"
#include "trainer/testing/trial_runner.h"
#include "trainer/train/caption_batches.h"
#include "trainer/train/trained_model.h"

namespace llmctl::trainer {
namespace {

using testing::RunAndRecord;
using testing::SourceDir;
using testing::TrialRecord;

std::string ModelDir() { return SourceDir() + "/tests/fixtures/blip2/opt-tiny-captioning"; }
std::string CaptionsDir() { return SourceDir() + "/tests/fixtures/blip2/captions"; }

nlohmann::json Expected() {
  std::ifstream in(ModelDir() + "/expected.json");
  return nlohmann::json::parse(in);
}

// A trial of the tiny BLIP-2 on the fixture's captions, each step 2 micro-batches of 2.
TrialConfig CaptionTrial(const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
  TrialConfig config;
  const std::vector<std::pair<std::string, std::string>> base = {
      {"model", ModelDir()},
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

Blip2Config FixtureConfig() {
  auto config = ResolveBlip2Model(ModelDir());
  EXPECT_TRUE(config.ok() && config->has_value()) << config.status().ToString();
  return config.ok() && config->has_value() ? **config : Blip2Config();
}

class Blip2TrialTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The captions' token file goes into a cache of this test's own.
    setenv("LLMCTL_CACHE_DIR", testing::FreshTempDir("blip2-trial-cache").c_str(), 1);
  }
};

TEST_F(Blip2TrialTest, MicroBatchesAreTheLabsPlaceholdersCaptionsAndLabels) {
  const Blip2Config model = FixtureConfig();
  const nlohmann::json expected = Expected();
  auto batches = OpenCaptionBatches(CaptionTrial(), model, 0, 1);
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
        const int64_t id = batch.input_ids[row][t].item<int64_t>();
        const int64_t label = batch.labels[row][t].item<int64_t>();
        if (t < length) {
          EXPECT_EQ(id, ids[t]) << "example " << example << " position " << t;
          EXPECT_EQ(label, t < model.num_query_tokens ? -100 : ids[t]);
        } else {
          EXPECT_EQ(id, model.opt()->pad_token_id);  // OPT's <pad>
          EXPECT_EQ(label, -100);
        }
      }
      label_tokens += expected["examples"][example]["label_tokens"].get<int64_t>();
    }
    EXPECT_EQ(batch.label_tokens, label_tokens);
  }
  EXPECT_EQ(seen.size(), 6u) << "an epoch visits every image once";
}

TEST_F(Blip2TrialTest, LossOfEachMicroBatchIsTransformers) {
  const Blip2Config model_config = FixtureConfig();
  const nlohmann::json expected = Expected();
  ModelBuildOptions options;
  options.init = "pretrained";
  options.model_dir = ModelDir();
  auto model = BuildTrainedModel(TrialModelConfig(model_config), options);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  (*model)->module().eval();
  auto batches = OpenCaptionBatches(CaptionTrial(), model_config, 0, 1);
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

TEST_F(Blip2TrialTest, TrialTrainsAndAccountsEveryPart) {
  const TrialRecord run = RunAndRecord(CaptionTrial());
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const Blip2ParameterCounts counts = CountBlip2Parameters(FixtureConfig());
  const nlohmann::json start = run.OfType("start").at(0);
  EXPECT_EQ(start["parameters_total"], counts.total());
  EXPECT_EQ(start["parameters_trainable"], counts.total());
  EXPECT_EQ(start["examples"], 6);
  const std::vector<double> losses = run.Losses();
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_LT(losses[1], losses[0]) << "one AdamW step at lr 1e-3 lowers the captions' loss";
  // fp32 AdamW: parameters, as much again in gradients after backward, twice that in state (and
  // the step count the moments share, one float32).
  const int64_t param_bytes = counts.total() * 4;
  EXPECT_EQ(run.Snapshot(0, 0, "phase0_before_fwd")["params_bytes"], param_bytes);
  EXPECT_EQ(run.Snapshot(0, 1, "phase2_after_bwd")["grads_bytes"], param_bytes);
  EXPECT_EQ(run.Snapshot(0, 1, "phase3_after_opt_step")["optim_device_bytes"], 2 * param_bytes + 4);
}

TEST_F(Blip2TrialTest, FrozenVisionEncoderHasNoGradientsOrOptimizerState) {
  const TrialRecord run = RunAndRecord(CaptionTrial({{"freeze", "[vision_model]"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const Blip2ParameterCounts counts = CountBlip2Parameters(FixtureConfig());
  const int64_t trainable = counts.total() - counts.vision;
  EXPECT_EQ(run.OfType("start").at(0)["parameters_trainable"], trainable);
  EXPECT_EQ(run.Snapshot(0, 1, "phase2_after_bwd")["grads_bytes"], trainable * 4);
  EXPECT_EQ(run.Snapshot(0, 1, "phase3_after_opt_step")["optim_device_bytes"], 2 * trainable * 4 + 4);
}

TEST_F(Blip2TrialTest, TechniquesOfTheLabRun) {
  struct Row {
    std::vector<std::pair<std::string, std::string>> keys;
  };
  const std::vector<Row> rows = {
      {{{"precision", "bf16-true"}}},
      {{{"precision", "bf16-mixed"}}},
      {{{"activation_checkpointing", "true"}}},
      {{{"optimizer", "sgd"}}},
      {{{"optimizer", "adamw_8bit"}}},
      {{{"loss", "chunked_ce"}}},
      {{{"offload", "optimizer"}}},
      {{{"peft.method", "lora"}, {"peft.r", "4"}, {"peft.targets", "[q_proj, v_proj]"}}},
      {{{"peft.method", "qlora"}, {"peft.r", "4"}, {"peft.compute_dtype", "fp32"}}},
  };
  for (const Row& row : rows) {
    std::string name;
    for (const auto& [key, value] : row.keys) name += key + "=" + value + " ";
    SCOPED_TRACE(name);
    const TrialRecord run = RunAndRecord(CaptionTrial(row.keys));
    ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
    for (double loss : run.Losses()) EXPECT_TRUE(std::isfinite(loss));
  }
}

TEST_F(Blip2TrialTest, LoraAdaptsTheLanguageModelsProjectionsOnly) {
  const std::string out = testing::FreshTempDir("blip2-lora");
  const TrialRecord run = RunAndRecord(CaptionTrial({{"peft.method", "lora"},
                                                     {"peft.r", "4"},
                                                     {"peft.targets", "[q_proj, v_proj]"},
                                                     {"output_dir", out}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const Blip2Config config = FixtureConfig();
  // Per OPT layer, q_proj and v_proj: lora_A (r, C) and lora_B (C, r).
  const int64_t adapters = config.opt()->num_hidden_layers * 2 * 2 * 4 * config.opt()->hidden_size;
  EXPECT_EQ(run.OfType("start").at(0)["parameters_trainable"], adapters);
  std::ifstream adapter_config(out + "/adapter/adapter_config.json");
  ASSERT_TRUE(adapter_config) << "no PEFT adapter written";
  const nlohmann::json written = nlohmann::json::parse(adapter_config);
  EXPECT_TRUE(written["task_type"].is_null());
  EXPECT_EQ(written["target_modules"], (std::vector<std::string>{"q_proj", "v_proj"}));
}

TEST_F(Blip2TrialTest, WrongInputsAreRefusedBeforeTraining) {
  // LLaMA's projection name on OPT.
  TrialRecord run = RunAndRecord(CaptionTrial({{"peft.method", "lora"}, {"peft.targets", "[o_proj]"}}));
  EXPECT_TRUE(run.result.invalid_input);
  EXPECT_NE(run.result.error.find("no projection named o_proj"), std::string::npos)
      << run.result.error;
  EXPECT_NE(run.result.error.find("out_proj"), std::string::npos) << run.result.error;

  // A LLaMA model on images, and BLIP-2 on text records.
  run = RunAndRecord(CaptionTrial({{"model", "llmctl-demo"}, {"init", "random"},
                                   {"tokenizer", ModelDir()}}));
  EXPECT_TRUE(run.result.invalid_input);
  EXPECT_NE(run.result.error.find("LLaMA-family text model"), std::string::npos)
      << run.result.error;

  // An image that does not decode is named.
  const std::string folder = testing::FreshTempDir("blip2-broken-captions");
  std::filesystem::copy(CaptionsDir(), folder, std::filesystem::copy_options::recursive |
                                                   std::filesystem::copy_options::overwrite_existing);
  std::ofstream(folder + "/images/00004.png", std::ios::trunc) << "not a png";
  run = RunAndRecord(CaptionTrial({{"data.path", folder}}));
  EXPECT_TRUE(run.result.invalid_input);
  EXPECT_NE(run.result.error.find("images/00004.png"), std::string::npos) << run.result.error;
}

// Data parallelism over BLIP-2: 2 ddp ranks of 2 images each against one process of 4, the same
// losses and, gradients averaged, the same weights after each step. Without dropout: a rank's masks
// over its 2 rows cannot be the one process's over 4 (as under PyTorch's DDP).
TEST_F(Blip2TrialTest, TwoDdpRanksTrainLikeOneProcess) {
  const std::string model = testing::FreshTempDir("blip2-no-dropout");
  std::filesystem::copy(ModelDir(), model,
                        std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(ModelDir() + "/config.json"));
  config["qformer_config"]["hidden_dropout_prob"] = 0.0;
  config["qformer_config"]["attention_probs_dropout_prob"] = 0.0;
  config["text_config"]["dropout"] = 0.0;
  std::ofstream(model + "/config.json", std::ios::trunc) << config.dump();
  const std::vector<std::string> blip2 = {
      "model=" + model,            "init=pretrained",         "tokenizer=" + model,
      "data.path=" + CaptionsDir(), "data.format=imagefolder", "data.max_seq_length=12"};
  std::vector<std::string> one = blip2, two = blip2;
  one.insert(one.end(), {"train.micro_batch_size=4", "train.global_batch_size=4"});
  two.insert(two.end(), {"train.micro_batch_size=2", "train.global_batch_size=4"});
  testing::ExpectTwoRanksTrainLikeOneProcess("ddp", "blip2-ddp", one, two, 2);
}

// FSDP over BLIP-2, a unit per block of the three stacks: 2 ranks of 2 images each against one
// process of 4, the same losses and weights after each step (without dropout, as for ddp).
TEST_F(Blip2TrialTest, TwoFsdpRanksTrainLikeOneProcess) {
  const std::string model = testing::FreshTempDir("blip2-fsdp-no-dropout");
  std::filesystem::copy(ModelDir(), model,
                        std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(ModelDir() + "/config.json"));
  config["qformer_config"]["hidden_dropout_prob"] = 0.0;
  config["qformer_config"]["attention_probs_dropout_prob"] = 0.0;
  config["text_config"]["dropout"] = 0.0;
  std::ofstream(model + "/config.json", std::ios::trunc) << config.dump();
  const std::vector<std::string> blip2 = {
      "model=" + model,            "init=pretrained",         "tokenizer=" + model,
      "data.path=" + CaptionsDir(), "data.format=imagefolder", "data.max_seq_length=12"};
  std::vector<std::string> one = blip2, two = blip2;
  one.insert(one.end(), {"train.micro_batch_size=4", "train.global_batch_size=4"});
  two.insert(two.end(), {"train.micro_batch_size=2", "train.global_batch_size=4"});
  testing::ExpectTwoRanksTrainLikeOneProcess("fsdp", "blip2-fsdp", one, two, 2);
}

// experiments/cpu-lab-blip2.yaml: each row of the labs' BLIP-2 table in miniature ends as the file
// expects (the lab's: the OPT baseline and Flan-T5-XXL's AdamW rows out of memory, the rest fitting)
// under its 280 MiB device. One test
// per row, so that ctest spreads the bf16 rows' minutes over its jobs.
class CpuLabBlip2RowTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    setenv("LLMCTL_CACHE_DIR", testing::FreshTempDir("cpu-lab-blip2-cache").c_str(), 1);
  }
};

TEST_P(CpuLabBlip2RowTest, EndsAsTheFileExpects) {
  auto experiment = LoadExperimentFile(SourceDir() + "/experiments/cpu-lab-blip2.yaml");
  ASSERT_TRUE(experiment.ok()) << experiment.status().ToString();
  for (const Trial& trial : experiment->trials) {
    if (trial.name != GetParam()) continue;
    const TrialRecord run = RunAndRecord(trial.config);
    EXPECT_EQ(OutcomeName(run.result.outcome), trial.expect) << run.result.error;
    return;
  }
  FAIL() << "no trial " << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Blip2TrialTest, CpuLabBlip2RowTest,
                         ::testing::Values("baseline", "reduced-batch", "grad-accumulation",
                                           "bf16-true", "bf16-mixed", "larger-model",
                                           "even-larger", "xxl-smallest-batch", "sgd",
                                           "adam-8bit", "activation-checkpointing",
                                           "cpu-offload", "lora", "qlora"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(Blip2TrialConfigTest, ImagefolderKeysAreChecked) {
  TrialConfig config;
  ASSERT_TRUE(config.SetFromText("data.path", "captions").ok());
  ASSERT_TRUE(config.SetFromText("data.format", "imagefolder").ok());
  ASSERT_TRUE(config.SetFromText("freeze", "[vision_encoder]").ok());
  Status status = ValidateTrialConfig(config, nullptr);
  EXPECT_NE(status.message().find("unknown part 'vision_encoder'"), std::string::npos)
      << status.ToString();
  ASSERT_TRUE(config.SetFromText("freeze", "[vision_model]").ok());
  ASSERT_TRUE(config.SetFromText("strategy", "fsdp").ok());
  ASSERT_TRUE(config.SetFromText("devices", "2").ok());
  ASSERT_TRUE(config.SetFromText("train.global_batch_size", "2").ok());
  status = ValidateTrialConfig(config, nullptr);
  EXPECT_NE(status.message().find("fsdp shards trainable parameters only, and freeze keeps "
                                  "vision_model frozen"),
            std::string::npos)
      << status.ToString();
  ASSERT_TRUE(config.SetFromText("freeze", "[]").ok());
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok()) << "BLIP-2 shards block by block";

  // What the model's family allows, for the callers that know it.
  ASSERT_TRUE(config.SetFromText("peft.save_merged", "true").ok());
  std::optional<ConfigProblem> family = FindModelFamilyProblem(config, /*blip2=*/true);
  ASSERT_TRUE(family.has_value());
  EXPECT_EQ(family->keys.front(), "peft.save_merged");
  family = FindModelFamilyProblem(config, /*blip2=*/false);
  ASSERT_TRUE(family.has_value());
  EXPECT_NE(family->message.find("LLaMA-family text model"), std::string::npos) << family->message;

  TrialConfig text;
  ASSERT_TRUE(text.SetFromText("data.path", "train.jsonl").ok());
  ASSERT_TRUE(text.SetFromText("freeze", "[vision_model]").ok());
  status = ValidateTrialConfig(text, nullptr);
  EXPECT_NE(status.message().find("freeze names BLIP-2's parts"), std::string::npos)
      << status.ToString();
}

}  // namespace
}  // namespace llmctl::trainer
