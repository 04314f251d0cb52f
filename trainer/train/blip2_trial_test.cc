// BLIP-2 trials end to end: the captions' micro-batches against the labs' pipeline (transformers'
// tokenizer and Blip2Processor's layout, tests/fixtures/blip2/opt-tiny-captioning/expected.json),
// the loss of a batch against transformers', and llm-train's trial loop with the labs' techniques.
// The rows of experiments/cpu-lab-blip2.yaml run through llm-train in the estimate's test
// (common/estimate/blip2_peak_test.cc, CpuLabBlip2RowTest), where each run serves every check.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/blip2_config.h"
#include "common/trial_config.h"
#include "trainer/testing/caption_trials.h"
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

TrialConfig CaptionTrial(const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
  return testing::CaptionTrial(ModelDir(), overrides);
}

Blip2Config FixtureConfig() { return testing::FixtureBlip2Config(ModelDir()); }

using Blip2TrialTest = testing::CaptionTrialTest;

TEST_F(Blip2TrialTest, MicroBatchesAreTheLabsPlaceholdersCaptionsAndLabels) {
  testing::ExpectMicroBatchesAreTheLabs(ModelDir());
}

TEST_F(Blip2TrialTest, LossOfEachMicroBatchIsTransformers) {
  testing::ExpectMicroBatchLossesAreTransformers(ModelDir());
}

TEST_F(Blip2TrialTest, TrialTrainsAndAccountsEveryPart) {
  testing::ExpectTrialTrainsAndAccountsEveryPart(ModelDir());
}

TEST_F(Blip2TrialTest, FrozenVisionEncoderHasNoGradientsOrOptimizerState) {
  const TrialRecord run = RunAndRecord(CaptionTrial({{"freeze", "[vision_model]"}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const Blip2ParameterCounts counts = CountBlip2Parameters(FixtureConfig());
  const int64_t trainable = counts.total() - counts.vision;
  EXPECT_EQ(run.OfType("start").at(0)["parameters_trainable"], trainable);
  EXPECT_EQ(run.Snapshot(0, 1, "phase2_after_bwd")["grads_bytes"], trainable * 4);
  EXPECT_EQ(run.Snapshot(0, 1, "phase3_after_opt_step")["optim_device_bytes"],
            2 * trainable * 4 + 4);
}

TEST_F(Blip2TrialTest, TechniquesOfTheLabRun) {
  testing::ExpectEachTrialRunsToFiniteLosses(
      ModelDir(),
      {
          {{"precision", "bf16-true"}},
          {{"precision", "bf16-mixed"}},
          {{"activation_checkpointing", "true"}},
          {{"optimizer", "sgd"}},
          {{"optimizer", "adamw_8bit"}},
          {{"loss", "chunked_ce"}},
          {{"offload", "optimizer"}},
          {{"peft.method", "lora"}, {"peft.r", "4"}, {"peft.targets", "[q_proj, v_proj]"}},
          {{"peft.method", "qlora"}, {"peft.r", "4"}, {"peft.compute_dtype", "fp32"}},
      });
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
  TrialRecord run =
      RunAndRecord(CaptionTrial({{"peft.method", "lora"}, {"peft.targets", "[o_proj]"}}));
  EXPECT_TRUE(run.result.invalid_input);
  EXPECT_NE(run.result.error.find("no projection named o_proj"), std::string::npos)
      << run.result.error;
  EXPECT_NE(run.result.error.find("out_proj"), std::string::npos) << run.result.error;

  // A LLaMA model on images, and BLIP-2 on text records.
  run = RunAndRecord(
      CaptionTrial({{"model", "llmctl-demo"}, {"init", "random"}, {"tokenizer", ModelDir()}}));
  EXPECT_TRUE(run.result.invalid_input);
  EXPECT_NE(run.result.error.find("LLaMA-family text model"), std::string::npos)
      << run.result.error;

  // An image that does not decode is named.
  const std::string folder = testing::FreshTempDir("blip2-broken-captions");
  std::filesystem::copy(
      testing::CaptionsDir(), folder,
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  std::ofstream(folder + "/images/00004.png", std::ios::trunc) << "not a png";
  run = RunAndRecord(CaptionTrial({{"data.path", folder}}));
  EXPECT_TRUE(run.result.invalid_input);
  EXPECT_NE(run.result.error.find("images/00004.png"), std::string::npos) << run.result.error;
}

// Data parallelism over BLIP-2: 2 ranks of 2 images each against one process of 4, the same losses
// and, gradients averaged, the same weights after each step: ddp, and fsdp with a unit per block of
// the three stacks. Without dropout: a rank's masks over its 2 rows cannot be the one process's
// over 4 (as under PyTorch's DDP).
TEST_F(Blip2TrialTest, TwoDdpOrFsdpRanksTrainLikeOneProcess) {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    SCOPED_TRACE(strategy);
    testing::ExpectDataParallelTrainsLikeOneProcess(
        ModelDir(),
        {"qformer_config.hidden_dropout_prob", "qformer_config.attention_probs_dropout_prob",
         "text_config.dropout"},
        strategy);
  }
}

// fsdp over BLIP-2 with frozen parts: the vision encoder frozen, LoRA on OPT's attention (PEFT
// freezes everything else), and QLoRA there: each block's frozen weights shard as a frozen flat
// parameter beside its trainable one (and its NF4 buffers as their own), and 2 ranks still train as
// one process does; and 8-bit AdamW on every block's shards.
TEST_F(Blip2TrialTest, FsdpWithFrozenPartsLoraAndQloraTrainsLikeOneProcess) {
  const std::vector<std::string> dropout = {"qformer_config.hidden_dropout_prob",
                                            "qformer_config.attention_probs_dropout_prob",
                                            "text_config.dropout"};
  testing::ExpectDataParallelTrainsLikeOneProcess(ModelDir(), dropout, "fsdp", nullptr,
                                                  {"freeze=[vision_model]"}, "-frozen");
  testing::ExpectDataParallelTrainsLikeOneProcess(
      ModelDir(), dropout, "fsdp", nullptr,
      {"peft.method=lora", "peft.targets=[q_proj,v_proj]", "train.lr=5e-3"}, "-lora");
  // QLoRA: OPT's attention projections are NF4 buffers, sharded in their own dtypes.
  testing::ExpectDataParallelTrainsLikeOneProcess(ModelDir(), dropout, "fsdp", nullptr,
                                                  {"peft.method=qlora", "peft.compute_dtype=fp32",
                                                   "peft.targets=[q_proj,v_proj]", "train.lr=5e-3"},
                                                  "-qlora");
  // 8-bit AdamW stepping the blocks' shards.
  testing::ExpectDataParallelTrainsLikeOneProcess(ModelDir(), dropout, "fsdp", nullptr,
                                                  {"optimizer=adamw_8bit"}, "-adamw-8bit",
                                                  testing::kEightBitStrayFraction);
}

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
  // A frozen part's blocks shard as frozen flat parameters.
  EXPECT_TRUE(ValidateTrialConfig(config, nullptr).ok()) << "BLIP-2 shards block by block";
  ASSERT_TRUE(config.SetFromText("freeze", "[]").ok());

  // What the model's family allows, for the callers that know it.
  EXPECT_FALSE(FindModelFamilyProblem(config, /*blip2=*/true).has_value());
  std::optional<ConfigProblem> family = FindModelFamilyProblem(config, /*blip2=*/false);
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
