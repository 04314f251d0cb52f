// BLIP-2 with Flan-T5's kind of language model, trials end to end: the captions' micro-batches
// against the labs' pipeline (T5's Unigram tokenizer, its </s> kept last by the truncation,
// Blip2Processor's placeholders; tests/fixtures/blip2/t5-tiny-captioning/expected.json), each
// micro-batch's loss against transformers' (T5's decoder predicting the caption), and llm-train's
// trial loop with the labs' techniques for rows 7-14 (bf16-true, SGD, 8-bit AdamW, checkpointing,
// offload, LoRA on q and v, QLoRA).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/blip2_config.h"
#include "common/trial_config.h"
#include "trainer/model/blip2.h"
#include "trainer/parallel/fsdp.h"
#include "trainer/peft/lora.h"
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

std::string ModelDir() { return SourceDir() + "/tests/fixtures/blip2/t5-tiny-captioning"; }

TrialConfig CaptionTrial(const std::vector<std::pair<std::string, std::string>>& overrides = {}) {
  return testing::CaptionTrial(ModelDir(), overrides);
}

Blip2Config FixtureConfig() { return testing::FixtureBlip2Config(ModelDir()); }

using Blip2T5TrialTest = testing::CaptionTrialTest;

TEST_F(Blip2T5TrialTest, MicroBatchesAreTheLabsPlaceholdersCaptionsAndEos) {
  ASSERT_NE(FixtureConfig().t5(), nullptr);
  testing::ExpectMicroBatchesAreTheLabs(ModelDir());
}

TEST_F(Blip2T5TrialTest, LossOfEachMicroBatchIsTransformers) {
  testing::ExpectMicroBatchLossesAreTransformers(ModelDir());
}

// fp32 AdamW over every parameter, T5's own head included.
TEST_F(Blip2T5TrialTest, TrialTrainsAndAccountsEveryPart) {
  testing::ExpectTrialTrainsAndAccountsEveryPart(ModelDir());
}

// The lab's rows 7-14 on Flan-T5, in miniature: each technique runs to finite losses.
TEST_F(Blip2T5TrialTest, TechniquesOfTheLabsFlanT5RowsRun) {
  testing::ExpectEachTrialRunsToFiniteLosses(
      ModelDir(), {
                      {{"precision", "bf16-true"}},
                      {{"precision", "bf16-true"}, {"optimizer", "sgd"}},
                      {{"optimizer", "adamw_8bit"}},
                      {{"optimizer", "adamw_8bit"}, {"activation_checkpointing", "true"}},
                      {{"offload", "optimizer"}},
                      {{"precision", "bf16-mixed"}},
                      {{"loss", "chunked_ce"}},
                      {{"peft.method", "lora"}, {"peft.r", "4"}, {"peft.targets", "[q, v]"}},
                      {{"peft.method", "qlora"},
                       {"peft.r", "4"},
                       {"peft.targets", "[q, v]"},
                       {"peft.compute_dtype", "fp32"}},
                  });
}

TEST_F(Blip2T5TrialTest, LoraAdaptsT5sQAndVAndSavesPeftsAdapter) {
  const std::string out = testing::FreshTempDir("blip2-t5-lora");
  const TrialRecord run = RunAndRecord(CaptionTrial(
      {{"peft.method", "lora"}, {"peft.r", "4"}, {"peft.targets", "[q, v]"}, {"output_dir", out}}));
  ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;
  const T5Config t5 = *FixtureConfig().t5();
  // q and v (C -> H*D) in every self-attention and the decoder's cross-attention: lora_A (r, C) and
  // lora_B (H*D, r) each.
  const int64_t attentions = t5.num_layers + 2 * t5.num_decoder_layers;
  const int64_t adapters = attentions * 2 * (4 * t5.d_model + t5.inner_dim() * 4);
  EXPECT_EQ(run.OfType("start").at(0)["parameters_trainable"], adapters);
  std::ifstream adapter_config(out + "/adapter/adapter_config.json");
  ASSERT_TRUE(adapter_config) << "no PEFT adapter written";
  const nlohmann::json written = nlohmann::json::parse(adapter_config);
  EXPECT_EQ(written["target_modules"], (std::vector<std::string>{"q", "v"}));
}

// Data parallelism over BLIP-2 with T5, 2 ranks of 2 images each against one process of 4: ddp, and
// fsdp with a unit per block (T5's encoder and decoder blocks each one; the relative-position
// biases, read by every block of their stack, in the root). Without dropout: a rank's masks over
// its 2 rows cannot be the one process's over 4.
TEST_F(Blip2T5TrialTest, TwoDdpOrFsdpRanksTrainLikeOneProcess) {
  std::vector<std::string> two;  // the two-rank run's sets
  for (const std::string strategy : {"ddp", "fsdp"}) {
    SCOPED_TRACE(strategy);
    testing::ExpectDataParallelTrainsLikeOneProcess(
        ModelDir(),
        {"qformer_config.hidden_dropout_prob", "qformer_config.attention_probs_dropout_prob",
         "text_config.dropout_rate"},
        strategy, &two);
  }

  // Each fsdp rank holds its half of every unit's flat parameter (padded to even), no more.
  Blip2ForConditionalGeneration built(FixtureConfig());
  std::map<int64_t, int64_t> unit_numel;  // by LayerOf
  for (const auto& item : built->named_parameters()) {
    unit_numel[built->LayerOf(item.key())] += item.value().numel();
  }
  EXPECT_EQ(unit_numel.size(), static_cast<size_t>(1 + 2 + 2 + 2 + 2)) << "root and 8 blocks";
  int64_t shard_numel = 0;
  for (const auto& [unit, numel] : unit_numel) shard_numel += LayOutFlat({numel}, 2, 1).shard();
  const testing::RankedDemoRun fsdp = testing::RunRankedDemo("fsdp", "blip2-t5-shards", 2, two, 1);
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.output;
  for (int rank = 0; rank < 2; ++rank) {
    for (const nlohmann::json& event : fsdp.events[rank]) {
      if (event["type"] != "snapshot") continue;
      EXPECT_EQ(event["params_bytes"], shard_numel * 4) << "rank " << rank;
    }
  }
}

// peft.save_merged for BLIP-2, both language models: the merged directory (config.json written from
// the model's shapes, every adapter merged into its weight, an NF4 base dequantised) loads as a
// model of its own whose loss on a batch is the adapted model's.
TEST_F(Blip2T5TrialTest, MergedModelLoadsAndGivesTheAdaptedModelsLoss) {
  const std::string opt_dir = SourceDir() + "/tests/fixtures/blip2/opt-tiny-captioning";
  for (const auto& [model_dir, peft] :
       {std::pair{ModelDir(),
                  std::vector<std::pair<std::string, std::string>>{
                      {"peft.method", "lora"}, {"peft.targets", "[q, v, wo, lm_head]"}}},
        std::pair{ModelDir(),
                  std::vector<std::pair<std::string, std::string>>{{"peft.method", "qlora"},
                                                                   {"peft.targets", "[q, v]"},
                                                                   {"peft.compute_dtype", "fp32"}}},
        std::pair{opt_dir, std::vector<std::pair<std::string, std::string>>{
                               {"peft.method", "lora"}, {"peft.targets", "[q_proj, fc2]"}}}}) {
    SCOPED_TRACE(model_dir + " " + peft.front().second);
    const std::string out = testing::FreshTempDir("blip2-merged");
    std::vector<std::pair<std::string, std::string>> keys = peft;
    keys.insert(keys.end(), {{"peft.r", "4"}, {"peft.save_merged", "true"}, {"output_dir", out}});
    const TrialConfig trial = testing::CaptionTrial(model_dir, keys);
    const TrialRecord run = RunAndRecord(trial);
    ASSERT_EQ(run.result.outcome, Outcome::kOk) << run.result.error;

    // The adapted model as the trial left it: the base (its NF4 base for QLoRA) and the adapter.
    const Blip2Config base_config = testing::FixtureBlip2Config(model_dir);
    ModelBuildOptions options;
    options.init = "pretrained";
    options.model_dir = model_dir;
    if (trial.GetString("peft.method") == "qlora")
      options.nf4 = Nf4Options{.compute_dtype = torch::kFloat32};
    auto adapted = BuildTrainedModel(TrialModelConfig(base_config), options);
    ASSERT_TRUE(adapted.ok()) << adapted.status().ToString();
    LoraConfig lora;
    lora.options = LoraOptions{.r = 4, .alpha = 8.0, .dropout = 0.0};
    lora.targets = trial.GetStringList("peft.targets");
    ApplyLora((*adapted)->module(), lora);
    ASSERT_TRUE(LoadAdapter((*adapted)->module(), lora, out + "/adapter").ok());

    auto merged_config = ResolveBlip2Model(out + "/merged");
    ASSERT_TRUE(merged_config.ok() && merged_config->has_value())
        << merged_config.status().ToString();
    if (const T5Config* t5 = (*merged_config)->t5()) {
      EXPECT_FALSE(t5->tie_word_embeddings);
    }
    options.model_dir = out + "/merged";
    options.nf4.reset();
    auto merged = BuildTrainedModel(TrialModelConfig(**merged_config), options);
    ASSERT_TRUE(merged.ok()) << merged.status().ToString();

    (*adapted)->module().eval();
    (*merged)->module().eval();
    auto batches = OpenCaptionBatches(trial, base_config, 0, 1);
    ASSERT_TRUE(batches.ok()) << batches.status().ToString();
    const MicroBatch batch = (*batches)->Next(2, torch::kCPU);
    torch::NoGradGuard no_grad;
    const double want = (*adapted)->Loss(batch, false).item<double>();
    EXPECT_NEAR((*merged)->Loss(batch, false).item<double>(), want, 1e-5 * want);
    // The trained adapters move the loss well past that tolerance: a merge that dropped them fails.
    options.model_dir = model_dir;
    auto base = BuildTrainedModel(TrialModelConfig(base_config), options);
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    (*base)->module().eval();
    EXPECT_GT(std::abs((*base)->Loss(batch, false).item<double>() - want), 1e-4 * want);
  }
}

TEST_F(Blip2T5TrialTest, OptsProjectionNamesAreRefusedOnT5) {
  const TrialRecord run =
      RunAndRecord(CaptionTrial({{"peft.method", "lora"}, {"peft.targets", "[q_proj, v_proj]"}}));
  EXPECT_TRUE(run.result.invalid_input);
  EXPECT_NE(run.result.error.find("no projection named q_proj"), std::string::npos)
      << run.result.error;
  EXPECT_NE(run.result.error.find("wi_0"), std::string::npos) << run.result.error;
}

}  // namespace
}  // namespace llmctl::trainer
