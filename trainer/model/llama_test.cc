// Parity with Hugging Face transformers (fixtures made by scripts/fixtures/make_parity_models.py), and
// activation checkpointing's gradients.
#include "trainer/model/llama.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/model_config.h"
#include "trainer/model/activation_checkpointing.h"
#include "trainer/model/weights.h"
#include "common/safetensors/safetensors.h"
#include "trainer/testing/trial_runner.h"

namespace llmctl::trainer {
namespace {

std::string ModelDir(const std::string& name) {
  return testing::SourceDir() + "/tests/fixtures/models/" + name;
}

// (fixture, kernels): the fused ops give transformers' logits and loss too.
class ParityTest : public ::testing::TestWithParam<std::tuple<std::string, Kernels>> {};

TEST_P(ParityTest, LogitsAndLossMatchTransformersInFp32) {
  const std::string dir = ModelDir(std::get<0>(GetParam()));
  LlamaOptions options;
  options.kernels = std::get<1>(GetParam());
  auto config = LoadHfConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  auto model = BuildModel(*config, "pretrained", dir, torch::kFloat32, torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  (*model)->eval();
  auto expected = safetensors::SafetensorsFile::Open(dir + "/expected.safetensors");
  ASSERT_TRUE(expected.ok()) << expected.status().ToString();
  const torch::Tensor input_ids = TensorFromView(*(*expected)->Find("input_ids")).clone();
  const torch::Tensor labels = TensorFromView(*(*expected)->Find("labels")).clone();
  const torch::Tensor mask = TensorFromView(*(*expected)->Find("attention_mask")).to(torch::kBool);
  const torch::Tensor want_logits = TensorFromView(*(*expected)->Find("logits"));
  const double want_loss = TensorFromView(*(*expected)->Find("loss")).item<double>();

  torch::NoGradGuard no_grad;
  const torch::Tensor logits = (*model)->Logits((*model)->Hidden(input_ids, options));
  ASSERT_EQ(logits.sizes(), want_logits.sizes());
  // Padded positions differ by construction (transformers masks padding keys); compare real tokens.
  const torch::Tensor difference = (logits - want_logits).abs().index({mask});
  EXPECT_LE(difference.max().item<double>(), 1e-4);
  EXPECT_NEAR(CausalLmLoss(logits, labels).item<double>(), want_loss, 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ParityTest,
                         ::testing::Combine(::testing::Values("tiny-llama", "tiny-llama3",
                                                              "tiny-qwen2"),
                                            ::testing::Values(Kernels::kAten, Kernels::kFused)),
                         [](const auto& info) {
                           std::string name =
                               std::get<0>(info.param) +
                               (std::get<1>(info.param) == Kernels::kFused ? "_fused" : "_aten");
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(CheckpointTest, GradientsEqualThePlainRun) {
  const ModelConfig* preset = FindPreset("llmctl-demo");
  ASSERT_NE(preset, nullptr);
  auto grads_with = [&](bool checkpointing) {
    torch::manual_seed(7);
    LlamaForCausalLM model(*preset);
    model->InitializeRandom();
    torch::manual_seed(8);
    const torch::Tensor ids = torch::randint(0, preset->vocab_size, {2, 32}, torch::kInt64);
    LlamaOptions options;
    options.activation_checkpointing = checkpointing;
    CausalLmLoss(model->Logits(model->Hidden(ids, options)), ids).backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return grads;
  };
  const auto plain = grads_with(false);
  const auto checkpointed = grads_with(true);
  ASSERT_EQ(plain.size(), checkpointed.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_TRUE(torch::allclose(plain[i], checkpointed[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

// CheckpointTensors (common/, no LibTorch) is what `llmctl submit` checks a model directory's
// headers against: it must be exactly the model's parameters, by name and shape, in every variant.
TEST(WeightsTest, ParametersAreTheCheckpointTensors) {
  std::vector<ModelConfig> configs;
  for (const char* name : {"tiny-llama", "tiny-qwen2", "tiny-llama3"}) {
    auto config = LoadHfConfig(ModelDir(name));
    ASSERT_TRUE(config.ok()) << name;
    configs.push_back(*config);
  }
  ModelConfig every_bias = configs.front();
  every_bias.tie_word_embeddings = false;
  every_bias.attention_qkv_bias = every_bias.attention_output_bias = every_bias.mlp_bias = true;
  configs.push_back(every_bias);
  for (const ModelConfig& config : configs) {
    LlamaForCausalLM model(config, std::nullopt);
    std::map<std::string, std::vector<int64_t>> parameters;
    for (const auto& item : model->named_parameters()) {
      // A tied head is the embedding itself, not a tensor of its own.
      if (config.tie_word_embeddings && item.key() == "lm_head.weight") continue;
      parameters[item.key()] = item.value().sizes().vec();
    }
    std::map<std::string, std::vector<int64_t>> listed;
    for (const CheckpointTensor& tensor : CheckpointTensors(config)) listed[tensor.name] = tensor.shape;
    EXPECT_EQ(parameters, listed);
    EXPECT_EQ(static_cast<int64_t>(listed.size()), CheckpointTensorCount(config));
  }
}

TEST(WeightsTest, MissingTensorNamesTheFileAndTheTensor) {
  const std::string dir = ModelDir("tiny-llama");
  auto config = LoadHfConfig(dir);
  ASSERT_TRUE(config.ok());
  ModelConfig more_layers = *config;
  more_layers.num_hidden_layers += 1;
  auto model = BuildModel(more_layers, "pretrained", dir, torch::kFloat32, torch::kCPU);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("model.layers.2."), std::string::npos) << model.status().message();
  EXPECT_NE(model.status().message().find("missing"), std::string::npos);
}

TEST(WeightsTest, MisShapedTensorIsReported) {
  const std::string dir = ModelDir("tiny-llama");
  auto config = LoadHfConfig(dir);
  ASSERT_TRUE(config.ok());
  ModelConfig wider = *config;
  wider.intermediate_size += 8;
  auto model = BuildModel(wider, "pretrained", dir, torch::kFloat32, torch::kCPU);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("has shape"), std::string::npos) << model.status().message();
}

TEST(WeightsTest, LoadsIntoBf16WithoutKeepingAnFp32Copy) {
  const std::string dir = ModelDir("tiny-llama");
  auto config = LoadHfConfig(dir);
  ASSERT_TRUE(config.ok());
  auto model = BuildModel(*config, "pretrained", dir, torch::kBFloat16, torch::kCPU);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  for (const auto& p : (*model)->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
}

}  // namespace
}  // namespace llmctl::trainer
