// BLIP-2's image side against transformers' Blip2ForConditionalGeneration in float32 (fixtures made by
// scripts/fixtures/make_blip2_fixtures.py): the vision encoder, the Q-Former's query output and the
// projected image features, loaded from the checkpoint by Hugging Face name.
#include "trainer/model/blip2.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/blip2_config.h"
#include "common/files.h"
#include "trainer/model/llama.h"
#include "trainer/model/weights.h"
#include "trainer/peft/lora.h"
#include "common/safetensors/safetensors.h"
#include "trainer/testing/adam_step_bound.h"
#include "trainer/testing/trial_runner.h"

namespace llmctl::trainer {
namespace {

std::string FixtureDir(const std::string& name) {
  return testing::SourceDir() + "/tests/fixtures/blip2/" + name;
}

Blip2Config FixtureConfig() {
  auto text = ReadFileToString(FixtureDir("opt-tiny") + "/config.json");
  EXPECT_TRUE(text.ok());
  auto config = ParseBlip2Config(nlohmann::json::parse(*text), "opt-tiny/config.json");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return *config;
}

Blip2ForConditionalGeneration LoadedModel(const std::string& name) {
  Blip2ForConditionalGeneration encoder(FixtureConfig());
  auto checkpoint = safetensors::ShardedCheckpoint::Open(FixtureDir(name));
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  const Status loaded = LoadBlip2Weights(encoder, **checkpoint, name);
  EXPECT_TRUE(loaded.ok()) << loaded.ToString();
  encoder->eval();
  return encoder;
}

torch::Tensor Expected(const std::string& name) {
  static auto file = safetensors::SafetensorsFile::Open(FixtureDir("opt-tiny") + "/expected.safetensors");
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  return TensorFromView(*(*file)->Find(name)).clone();
}

double MaxDifference(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a - b).abs().max().item<double>();
}

TEST(Blip2Test, ImageSideMatchesTransformersInFp32) {
  Blip2ForConditionalGeneration encoder = LoadedModel("opt-tiny");
  torch::NoGradGuard no_grad;
  const torch::Tensor pixels = Expected("pixel_values");  // (2, 3, 28, 28)
  const torch::Tensor image = encoder->vision_model(pixels);
  EXPECT_LE(MaxDifference(image, Expected("vision_last_hidden_state")), 1e-5);
  const torch::Tensor queries =
      encoder->qformer(encoder->query_tokens.expand({2, -1, -1}), image);  // (2, 4, 32)
  EXPECT_LE(MaxDifference(queries, Expected("query_output")), 1e-5);
  EXPECT_LE(MaxDifference(encoder->ImageFeatures(pixels), Expected("image_features")), 1e-5);
}

// The captioning loss of Blip2ForConditionalGeneration(pixel_values, input_ids, labels): the image
// features in the placeholders' places, OPT's logits (the real tokens: transformers also masks the
// padding keys, which right padding keeps out of every real token's view), the shifted mean
// cross-entropy; and the loss after one torch AdamW step on every parameter, within what a reversed
// first step of the gradients that are zero up to rounding can move it
// (trainer/testing/adam_step_bound.h: the fixture was written on another CPU).
TEST(Blip2Test, CaptioningLossAndOneAdamWStepMatchTransformersInFp32) {
  constexpr double kLr = 1e-3;
  Blip2ForConditionalGeneration model = LoadedModel("opt-tiny");
  const torch::Tensor pixels = Expected("pixel_values");
  const torch::Tensor input_ids = Expected("input_ids");
  const torch::Tensor labels = Expected("labels");
  const torch::Tensor real = Expected("attention_mask").to(torch::kBool);  // (B, T)
  torch::Tensor logits = model->Logits(pixels, input_ids);
  const torch::Tensor want = Expected("logits");
  ASSERT_EQ(logits.sizes(), want.sizes());
  EXPECT_LE((logits - want).abs().index({real}).max().item<double>(), 1e-4);
  torch::Tensor loss = CausalLmLoss(logits, labels);
  EXPECT_NEAR(loss.item<double>(), Expected("loss").item<double>(), 1e-5);
  loss.backward();

  Blip2ForConditionalGeneration reference = LoadedModel("opt-tiny");
  reference->to(torch::kFloat64);
  CausalLmLoss(reference->Logits(pixels.to(torch::kFloat64), input_ids), labels).backward();
  const std::vector<torch::Tensor> grads64 = testing::GradientsOf(reference->parameters());

  const auto loss_here = [&] { return CausalLmLoss(model->Logits(pixels, input_ids), labels); };
  const testing::AdamWFirstStep step = testing::TakeAdamWFirstStep(
      model->parameters(), grads64, kLr, /*weight_decay=*/0.01, loss_here);
  testing::ExpectLossAfterFirstStep(loss.item<double>(), Expected("loss").item<double>(),
                                    step.loss_after,
                                    Expected("loss_after_adamw_step").item<double>(), step.bound);
}

TEST(Blip2Test, TransformersFourNamesLoadToTheSameOutputs) {
  Blip2ForConditionalGeneration encoder = LoadedModel("opt-tiny-v4-names");
  torch::NoGradGuard no_grad;
  EXPECT_LE(MaxDifference(encoder->ImageFeatures(Expected("pixel_values")), Expected("image_features")), 1e-5);
}

// PEFT's LoRA on the language model's q_proj and v_proj (r 4, alpha 8, random lora_B): the same
// adapters by name, the same trainable parameters, the same loss.
TEST(Blip2Test, PeftLoraAdapterOnTheLanguageModelLoadsAndGivesTransformersLoss) {
  Blip2ForConditionalGeneration model = LoadedModel("opt-tiny");
  LoraConfig lora;
  lora.options = LoraOptions{.r = 4, .alpha = 8.0, .dropout = 0.0};
  lora.targets = {"q_proj", "v_proj"};
  ApplyLora(*model, lora);
  const Status loaded = LoadAdapter(*model, lora, FixtureDir("opt-tiny-lora"));
  ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  auto expected =
      safetensors::SafetensorsFile::Open(FixtureDir("opt-tiny-lora") + "/expected.safetensors");
  ASSERT_TRUE(expected.ok());
  int64_t trainable = 0;
  for (const torch::Tensor& p : model->parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  EXPECT_EQ(trainable, TensorFromView(*(*expected)->Find("trainable_parameters")).item<int64_t>());
  torch::NoGradGuard no_grad;
  const double loss =
      CausalLmLoss(model->Logits(Expected("pixel_values"), Expected("input_ids")), Expected("labels"))
          .item<double>();
  EXPECT_NEAR(loss, TensorFromView(*(*expected)->Find("loss")).item<double>(), 1e-5);
  EXPECT_GT(std::abs(loss - Expected("loss").item<double>()), 1e-3) << "the adapter changes nothing";
}

// Checkpointing every block of the three stacks recomputes them in backward: the same loss and the
// same gradient for every parameter (the Q-Former's image input gets its gradient through the
// checkpoint, so the vision encoder's are complete too).
// In training mode, so the Q-Former's and OPT's dropout draw masks: the rerun in backward draws the
// forward's (the checkpoint restores the generator's state), or the gradients would differ.
TEST(Blip2Test, ActivationCheckpointingGivesThePlainRunsGradients) {
  auto gradients = [](bool checkpointing) {
    Blip2ForConditionalGeneration model = LoadedModel("opt-tiny");
    model->train();
    model->SetActivationCheckpointing(checkpointing);
    torch::manual_seed(11);
    const torch::Tensor loss = CausalLmLoss(
        model->Logits(Expected("pixel_values"), Expected("input_ids")), Expected("labels"));
    loss.backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& item : model->named_parameters()) grads[item.key()] = item.value().grad();
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto [plain_loss, plain] = gradients(false);
  const auto [checkpointed_loss, checkpointed] = gradients(true);
  EXPECT_DOUBLE_EQ(checkpointed_loss, plain_loss);
  ASSERT_EQ(checkpointed.size(), plain.size());
  for (const auto& [name, grad] : plain) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(grad.defined());
    ASSERT_TRUE(checkpointed.at(name).defined());
    EXPECT_LE((checkpointed.at(name) - grad).abs().max().item<double>(), 1e-6);
  }
}

// Dropout as transformers places it, in training only: the Q-Former's (0.1 on its embeddings, its
// attention probabilities and outputs) and OPT's (0.1 on each block's outputs) change the loss; in
// eval mode, or with every probability 0, the output is the deterministic one.
TEST(Blip2Test, DropoutActsInTrainingOnly) {
  Blip2ForConditionalGeneration model = LoadedModel("opt-tiny");
  auto loss = [&] {
    torch::NoGradGuard no_grad;
    return CausalLmLoss(model->Logits(Expected("pixel_values"), Expected("input_ids")),
                        Expected("labels"))
        .item<double>();
  };
  const double eval_loss = loss();
  EXPECT_NEAR(eval_loss, Expected("loss").item<double>(), 1e-5);
  model->train();
  torch::manual_seed(1);
  const double first = loss();
  torch::manual_seed(2);
  EXPECT_NE(loss(), first) << "other masks, another loss";
  torch::manual_seed(1);
  EXPECT_EQ(loss(), first) << "the same seed, the same masks";

  Blip2Config without = FixtureConfig();
  without.qformer.hidden_dropout_prob = 0.0;
  without.qformer.attention_probs_dropout_prob = 0.0;
  std::get<OptConfig>(without.text).dropout = 0.0;
  Blip2ForConditionalGeneration deterministic(without);
  auto checkpoint = safetensors::ShardedCheckpoint::Open(FixtureDir("opt-tiny"));
  ASSERT_TRUE(checkpoint.ok());
  ASSERT_TRUE(LoadBlip2Weights(deterministic, **checkpoint, "opt-tiny").ok());
  deterministic->train();
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(CausalLmLoss(deterministic->Logits(Expected("pixel_values"), Expected("input_ids")),
                           Expected("labels"))
                  .item<double>(),
              eval_loss, 1e-6);
}

// The module holds what common/blip2_config counts (the estimate's figure) and the checkpoint holds.
TEST(Blip2Test, ParametersAreWhatTheConfigCounts) {
  const Blip2Config config = FixtureConfig();
  Blip2ForConditionalGeneration model(config);
  int64_t values = 0;
  for (const torch::Tensor& p : model->parameters()) values += p.numel();
  EXPECT_EQ(values, CountBlip2Parameters(config).total());
}

TEST(Blip2Test, AMissingTensorIsNamed) {
  Blip2Config config = FixtureConfig();
  config.qformer.num_hidden_layers = 4;  // one layer more than the checkpoint has
  Blip2ForConditionalGeneration encoder(config);
  auto checkpoint = safetensors::ShardedCheckpoint::Open(FixtureDir("opt-tiny"));
  ASSERT_TRUE(checkpoint.ok());
  const Status loaded = LoadBlip2Weights(encoder, **checkpoint, "opt-tiny");
  EXPECT_EQ(loaded.code(), StatusCode::kDataLoss);
  EXPECT_NE(loaded.message().find("qformer.encoder.layer.3."), std::string::npos)
      << loaded.ToString();
}

}  // namespace
}  // namespace llmctl::trainer
