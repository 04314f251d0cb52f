// BLIP-2 with a T5 language model (Flan-T5's kind) against transformers'
// Blip2ForConditionalGeneration in float32, on the tiny random fixtures
// scripts/fixtures/make_blip2_t5_fixtures.py writes: the captioning loss (T5's encoder over the
// image's features and the caption, its decoder predicting the caption) before and after one AdamW
// step, T5 v1.0's tied and scaled head, PEFT's LoRA on q and v, the relative-position buckets, and
// activation checkpointing of both stacks.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/blip2_config.h"
#include "common/files.h"
#include "trainer/model/blip2.h"
#include "trainer/model/loss.h"
#include "trainer/model/t5.h"
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

Blip2Config FixtureConfig(const std::string& name) {
  auto text = ReadFileToString(FixtureDir(name) + "/config.json");
  EXPECT_TRUE(text.ok());
  auto config = ParseBlip2Config(nlohmann::json::parse(*text), name + "/config.json");
  EXPECT_TRUE(config.ok()) << config.status().ToString();
  return *config;
}

Blip2ForConditionalGeneration LoadedModel(const std::string& name) {
  Blip2ForConditionalGeneration model(FixtureConfig(name));
  auto checkpoint = safetensors::ShardedCheckpoint::Open(FixtureDir(name));
  EXPECT_TRUE(checkpoint.ok()) << checkpoint.status().ToString();
  const Status loaded = LoadBlip2Weights(model, **checkpoint, name);
  EXPECT_TRUE(loaded.ok()) << loaded.ToString();
  model->eval();
  return model;
}

torch::Tensor Expected(const std::string& name, const std::string& fixture = "t5-tiny") {
  auto file = safetensors::SafetensorsFile::Open(FixtureDir(fixture) + "/expected.safetensors");
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  return TensorFromView(*(*file)->Find(name)).clone();
}

// The captioning loss, the image in `dtype` (the model's parameters' dtype).
torch::Tensor Loss(Blip2ForConditionalGeneration& model, bool chunked = false,
                   torch::Dtype dtype = torch::kFloat32) {
  return model->Loss(Expected("pixel_values").to(dtype), Expected("input_ids"),
                     Expected("attention_mask").to(torch::kBool), Expected("row_labels"), chunked);
}

TEST(Blip2T5Test, FixtureIsFlanT5sKind) {
  const Blip2Config config = FixtureConfig("t5-tiny");
  ASSERT_NE(config.t5(), nullptr);
  EXPECT_TRUE(config.t5()->gated_gelu);
  EXPECT_FALSE(config.t5()->tie_word_embeddings);
  EXPECT_EQ(config.t5()->num_decoder_layers, 3);
}

// Encoder over [the image's features; the caption and </s>] with the padding masked, decoder over
// the caption shifted right, unshifted cross-entropy: transformers' loss, and after one torch AdamW
// step on every parameter (the relative-position bias and the untied head included) its loss again,
// within what a reversed first step of the gradients that are zero up to rounding can move it
// (trainer/testing/adam_step_bound.h: the fixture was written on another CPU).
TEST(Blip2T5Test, CaptioningLossAndOneAdamWStepMatchTransformersInFp32) {
  constexpr double kLr = 1e-3;
  Blip2ForConditionalGeneration model = LoadedModel("t5-tiny");
  const torch::Tensor loss = Loss(model);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(loss.item<double>(), Expected("loss").item<double>(), 1e-5);
  loss.backward();
  for (const auto& item : model->named_parameters()) {
    SCOPED_TRACE(item.key());
    EXPECT_TRUE(item.value().grad().defined()) << "every parameter takes part in the loss";
  }

  Blip2ForConditionalGeneration reference = LoadedModel("t5-tiny");
  reference->to(torch::kFloat64);
  Loss(reference, /*chunked=*/false, torch::kFloat64).backward();
  const std::vector<torch::Tensor> grads64 = testing::GradientsOf(reference->parameters());

  const testing::AdamWFirstStep step = testing::TakeAdamWFirstStep(
      model->parameters(), grads64, kLr, /*weight_decay=*/0.01, [&] { return Loss(model); });
  testing::ExpectLossAfterFirstStep(loss.item<double>(), Expected("loss").item<double>(),
                                    step.loss_after,
                                    Expected("loss_after_adamw_step").item<double>(), step.bound);
}

TEST(Blip2T5Test, ChunkedLossIsThePlainOne) {
  Blip2ForConditionalGeneration model = LoadedModel("t5-tiny");
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(Loss(model, /*chunked=*/true).item<double>(), Loss(model).item<double>(), 1e-5);
}

// kernels: fused (the norms and the gated-GELU as fused_ops.h's ops) with the chunked loss, as a
// trial runs them by default: transformers' loss in fp32, and every gradient the ATen
// composition's with the full logits, within fp32 sums in another order (relative to each
// gradient's largest element; the attention key biases' gradients are zero but for rounding, as
// softmax ignores a constant added to a query's logits: noise of about 1e-10 on both sides).
TEST(Blip2T5Test, FusedKernelsAndChunkedLossMatchTransformersInFp32) {
  Blip2ForConditionalGeneration aten = LoadedModel("t5-tiny");
  Blip2ForConditionalGeneration fused = LoadedModel("t5-tiny");
  fused->SetKernels(Kernels::kFused);
  const torch::Tensor fused_loss = Loss(fused, /*chunked=*/true);
  EXPECT_NEAR(fused_loss.item<double>(), Expected("loss").item<double>(), 1e-5);
  fused_loss.backward();
  Loss(aten).backward();
  const auto fused_params = fused->named_parameters();
  for (const auto& item : aten->named_parameters()) {
    SCOPED_TRACE(item.key());
    const torch::Tensor expected = item.value().grad();
    const torch::Tensor actual = fused_params[item.key()].grad();
    ASSERT_TRUE(actual.defined());
    const double scale = expected.abs().max().item<double>();
    EXPECT_LE((actual - expected).abs().max().item<double>(), 1e-5 * scale + 1e-9);
  }
}

// T5 v1.0: ReLU FFN (wi, wo) and the head tied to the shared embedding, the decoder's output scaled
// by d_model^-0.5 first.
TEST(Blip2T5Test, V10ReluAndTiedScaledHeadMatchTransformers) {
  Blip2ForConditionalGeneration model = LoadedModel("t5-tiny-v10");
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(Loss(model).item<double>(), Expected("loss", "t5-tiny-v10").item<double>(), 1e-5);
  int64_t values = 0;
  for (const torch::Tensor& p : model->parameters()) values += p.numel();
  EXPECT_EQ(values, CountBlip2Parameters(FixtureConfig("t5-tiny-v10")).total());
}

TEST(Blip2T5Test, ParametersAreWhatTheConfigCounts) {
  const Blip2Config config = FixtureConfig("t5-tiny");
  Blip2ForConditionalGeneration model(config);
  int64_t values = 0;
  for (const torch::Tensor& p : model->parameters()) values += p.numel();
  EXPECT_EQ(values, CountBlip2Parameters(config).total());
}

// Flan-T5's 32 buckets up to distance 128, for 300 positions: every exact and logarithmic bucket
// and the clamp beyond max_distance, both ways.
TEST(Blip2T5Test, RelativePositionBucketsAreTransformers) {
  for (const bool bidirectional : {true, false}) {
    SCOPED_TRACE(bidirectional ? "encoder" : "decoder");
    const torch::Tensor buckets =
        RelativePositionBuckets(300, 300, bidirectional, 32, 128, torch::kCPU);
    const torch::Tensor want =
        Expected(bidirectional ? "buckets_bidirectional" : "buckets_causal").to(torch::kLong);
    EXPECT_TRUE(torch::equal(buckets, want));
  }
}

// PEFT's LoRA on T5's q and v (r 4, alpha 8, random lora_B): the same adapters by name, the same
// trainable parameters, the same loss.
TEST(Blip2T5Test, PeftLoraAdapterOnQAndVLoadsAndGivesTransformersLoss) {
  Blip2ForConditionalGeneration model = LoadedModel("t5-tiny");
  LoraConfig lora;
  lora.options = LoraOptions{.r = 4, .alpha = 8.0, .dropout = 0.0};
  lora.targets = {"q", "v"};
  ASSERT_TRUE(CheckLoraTargets(*model, lora).ok());
  ApplyLora(*model, lora);
  const Status loaded = LoadAdapter(*model, lora, FixtureDir("t5-tiny-lora"));
  ASSERT_TRUE(loaded.ok()) << loaded.ToString();
  int64_t trainable = 0;
  for (const torch::Tensor& p : model->parameters()) trainable += p.requires_grad() ? p.numel() : 0;
  EXPECT_EQ(trainable, Expected("trainable_parameters", "t5-tiny-lora").item<int64_t>());
  torch::NoGradGuard no_grad;
  const double loss = Loss(model).item<double>();
  EXPECT_NEAR(loss, Expected("loss", "t5-tiny-lora").item<double>(), 1e-5);
  EXPECT_GT(std::abs(loss - Expected("loss").item<double>()), 1e-3)
      << "the adapter changes nothing";
}

TEST(Blip2T5Test, LoraTargetsAreCheckedAgainstT5sNames) {
  Blip2ForConditionalGeneration model = LoadedModel("t5-tiny");
  LoraConfig lora;
  lora.targets = {"q_proj"};
  const Status status = CheckLoraTargets(*model, lora);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("(its projections: q, k, v, o, wi_0, wi_1, wo, lm_head)"),
            std::string::npos)
      << status.ToString();
}

// Checkpointing every block of the vision encoder, the Q-Former and T5's two stacks recomputes them
// in backward, in training mode (T5's dropout everywhere draws masks, which the rerun redraws
// alike): the same loss and the same gradient for every parameter, the relative-position bias's and
// the encoder's (which reach it through the decoder's checkpointed cross-attention) included.
TEST(Blip2T5Test, ActivationCheckpointingGivesThePlainRunsGradients) {
  auto gradients = [](bool checkpointing) {
    Blip2ForConditionalGeneration model = LoadedModel("t5-tiny");
    model->train();
    model->SetActivationCheckpointing(checkpointing);
    torch::manual_seed(11);
    const torch::Tensor loss = Loss(model);
    loss.backward();
    std::map<std::string, torch::Tensor> grads;
    for (const auto& item : model->named_parameters()) grads[item.key()] = item.value().grad();
    return std::make_pair(loss.item<double>(), grads);
  };
  const auto [plain_loss, plain] = gradients(false);
  const auto [checkpointed_loss, checkpointed] = gradients(true);
  EXPECT_DOUBLE_EQ(checkpointed_loss, plain_loss);
  EXPECT_GT(std::abs(plain_loss - Expected("loss").item<double>()), 1e-4)
      << "dropout drew no masks";
  ASSERT_EQ(checkpointed.size(), plain.size());
  for (const auto& [name, grad] : plain) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(grad.defined());
    ASSERT_TRUE(checkpointed.at(name).defined());
    // The encoder's gradient sums the decoder blocks' parts in another order: float32 rounding,
    // relative to the gradient's size.
    const double scale = 1.0 + grad.abs().max().item<double>();
    EXPECT_LE((checkpointed.at(name) - grad).abs().max().item<double>(), 1e-6 * scale);
  }
}

}  // namespace
}  // namespace llmctl::trainer
