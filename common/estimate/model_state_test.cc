#include "common/estimate/model_state.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace llmctl::estimate {
namespace {

// A complete trial of `model` with `sets` applied as llm-train's --set would.
TrialConfig Trial(const std::vector<std::pair<std::string, std::string>>& sets) {
  TrialConfig config;
  EXPECT_TRUE(config.SetFromText("data.path", "train.jsonl").ok());
  for (const auto& [key, value] : sets) {
    const Status status = config.SetFromText(key, value);
    EXPECT_TRUE(status.ok()) << status.message();
  }
  ApplyLabSpellings(config);
  return config;
}

ModelStateEstimate Estimate(const std::string& model,
                            const std::vector<std::pair<std::string, std::string>>& sets) {
  std::vector<std::pair<std::string, std::string>> all = {{"model", model}};
  all.insert(all.end(), sets.begin(), sets.end());
  StatusOr<ModelStateEstimate> estimate = EstimateModelState(Trial(all), *FindPreset(model));
  EXPECT_TRUE(estimate.ok()) << estimate.status().message();
  return estimate.ok() ? *estimate : ModelStateEstimate{};
}

constexpr uint64_t kTinyLlamaParameters = 1'100'048'384;

// The docs' worked example: 16 bytes per parameter before activations.
TEST(EstimateModelStateTest, TinyLlamaFullFineTuneInFp32WithAdamWIs16BytesPerParameter) {
  const ModelStateEstimate e = Estimate("tinyllama-1.1b", {});
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.parameters_total, static_cast<int64_t>(kTinyLlamaParameters));
  EXPECT_EQ(e.parameters_trainable, e.parameters_total);
  EXPECT_EQ(e.params_bytes, 4 * kTinyLlamaParameters);
  EXPECT_EQ(e.grads_bytes, 4 * kTinyLlamaParameters);
  EXPECT_EQ(e.optim_device_bytes, 8 * kTinyLlamaParameters + 4);  // + the step count
  EXPECT_EQ(e.optim_host_bytes, 0u);
  EXPECT_EQ(e.comm_bytes, 0u);
  EXPECT_EQ(e.device_bytes(), 16 * kTinyLlamaParameters + 4);
}

TEST(EstimateModelStateTest, PrecisionSetsTheParameterDtypeMixedModesKeepFp32) {
  EXPECT_EQ(Estimate("tinyllama-1.1b", {{"precision", "bf16-true"}}).device_bytes(),
            8 * kTinyLlamaParameters + 4);
  EXPECT_EQ(Estimate("tinyllama-1.1b", {{"precision", "bf16-mixed"}}).device_bytes(),
            16 * kTinyLlamaParameters + 4);
}

TEST(EstimateModelStateTest, SgdKeepsStateOnlyWithMomentum) {
  EXPECT_EQ(Estimate("tinyllama-1.1b", {{"optimizer", "sgd"}}).optim_device_bytes, 0u);
  EXPECT_EQ(Estimate("tinyllama-1.1b", {{"optimizer", "sgd"}, {"train.momentum", "0.9"}})
                .optim_device_bytes,
            4 * kTinyLlamaParameters);
}

TEST(EstimateModelStateTest, OffloadKeepsSixteenBytesPerParameterOnTheHostAndNoGradients) {
  const ModelStateEstimate e = Estimate("tinyllama-1.1b", {{"offload", "optimizer"}});
  EXPECT_EQ(e.grads_bytes, 0u);
  EXPECT_EQ(e.optim_device_bytes, 0u);
  EXPECT_EQ(e.optim_host_bytes, 16 * kTinyLlamaParameters + 4);
}

TEST(EstimateModelStateTest, OptimizerInBackwardHoldsNoGradients) {
  const ModelStateEstimate e = Estimate("tinyllama-1.1b", {{"optimizer_in_backward", "true"},
                                                           {"train.global_batch_size", "1"},
                                                           {"train.micro_batch_size", "1"}});
  EXPECT_EQ(e.grads_bytes, 0u);
  EXPECT_EQ(e.optim_device_bytes, 8 * kTinyLlamaParameters + 4);
}

// llmctl-demo: vocab 2048, hidden 128, 4 heads of 32, 2 KV heads, MLP 352, 4 layers, tied.
constexpr int64_t kDemoRoot = 2048 * 128 + 128;  // embeddings (= the tied head) and final norm
constexpr int64_t kDemoLayer = 2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 352 + 2 * 128;

TEST(EstimateModelStateTest, AdamW8bitQuantisesLargeTensorsAndKeepsSmallOnesInFp32) {
  const ModelStateEstimate e = Estimate("llmctl-demo", {{"optimizer", "adamw_8bit"}});
  // Per layer: q, o (16384), k, v (8192), gate, up, down (45056) in 8 bits; the norms (128) fp32.
  auto eight_bit = [](uint64_t n) { return 2 * n + 8 * ((n + 255) / 256); };
  const uint64_t layer =
      2 * eight_bit(16384) + 2 * eight_bit(8192) + 3 * eight_bit(45056) + 2 * 8 * 128;
  const uint64_t root = eight_bit(2048 * 128) + 8 * 128;
  EXPECT_EQ(e.optim_device_bytes, 4 * layer + root + 4 + 2048);
}

TEST(EstimateModelStateTest, LoraAddsTrainableAdaptersAndFreezesTheBase) {
  const ModelStateEstimate e =
      Estimate("llmctl-demo",
               {{"peft.method", "lora"}, {"peft.r", "4"}, {"peft.targets", "[v_proj, lm_head]"}});
  // v (64, 128): A 4 x 128, B 64 x 4; the tied head (2048, 128): A 4 x 128, B 2048 x 4.
  const int64_t adapters = 4 * (4 * 128 + 64 * 4) + 4 * 128 + 2048 * 4;
  EXPECT_EQ(e.parameters_trainable, adapters);
  EXPECT_EQ(e.parameters_total, kDemoRoot + 4 * kDemoLayer + adapters);
  EXPECT_EQ(e.params_bytes, 4 * static_cast<uint64_t>(e.parameters_total));
  EXPECT_EQ(e.grads_bytes, 4 * static_cast<uint64_t>(adapters));
  EXPECT_EQ(e.optim_device_bytes, 8 * static_cast<uint64_t>(adapters) + 4);
}

TEST(EstimateModelStateTest, QloraHoldsTheDecoderProjectionsAsNf4) {
  // Per layer q, o: 16384 values = 8192 packed bytes and 256 blocks of 64; k, v: 4096 and 128;
  // gate, up, down: 22528 and 704.
  auto nf4 = [](uint64_t packed, uint64_t blocks, bool double_quant) {
    return double_quant ? packed + blocks + 4 * ((blocks + 255) / 256) + 4 : packed + 4 * blocks;
  };
  for (bool double_quant : {true, false}) {
    const ModelStateEstimate e = Estimate(
        "llmctl-demo",
        {{"peft.method", "qlora"}, {"peft.double_quant", double_quant ? "true" : "false"}});
    const uint64_t layer = 2 * nf4(8192, 256, double_quant) + 2 * nf4(4096, 128, double_quant) +
                           3 * nf4(22528, 704, double_quant) + 4 * 2 * 128;
    const uint64_t adapters = (8 * 128 + 128 * 8) + (8 * 128 + 64 * 8);  // q and v, r 8
    EXPECT_EQ(e.params_bytes, 4 * layer + 4 * kDemoRoot + 4 * 4 * adapters) << double_quant;
    EXPECT_EQ(e.parameters_total, kDemoRoot + 4 * kDemoLayer + 4 * static_cast<int64_t>(adapters));
  }
}

TEST(EstimateModelStateTest, DdpAddsBucketsHoldingEveryGradientAndTheSumsSlots) {
  const ModelStateEstimate e = Estimate(
      "llmctl-demo", {{"strategy", "ddp"}, {"devices", "2"}, {"train.global_batch_size", "8"}});
  const uint64_t params = 4 * static_cast<uint64_t>(kDemoRoot + 4 * kDemoLayer);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.params_bytes, params);
  EXPECT_EQ(e.comm_bytes, params + 16);
}

TEST(EstimateModelStateTest, FsdpShardsEachUnitPaddedToAMultipleOfTheWorldSize) {
  // Three ranks: a layer's 184576 values pad to 184578, 61526 per rank; the root's 262272 do not.
  const ModelStateEstimate e = Estimate("llmctl-demo", {{"strategy", "fsdp"},
                                                        {"devices", "3"},
                                                        {"train.micro_batch_size", "1"},
                                                        {"train.global_batch_size", "3"}});
  static_assert(kDemoLayer == 184576 && kDemoRoot == 262272);
  const uint64_t shard = 262272 / 3 + 4 * 61526;
  EXPECT_EQ(e.params_bytes, 4 * shard);
  EXPECT_EQ(e.grads_bytes, 4 * shard);
  EXPECT_EQ(e.optim_device_bytes, 8 * shard + 4);
  EXPECT_EQ(e.comm_bytes, 4 * 262272 + 16u);  // the largest unit, the root, whole
  // NCCL's reduce-scatter output besides, a rank's share of the largest unit.
  const ModelStateEstimate cuda = Estimate("llmctl-demo", {{"strategy", "fsdp"},
                                                           {"devices", "3"},
                                                           {"train.micro_batch_size", "1"},
                                                           {"train.global_batch_size", "3"},
                                                           {"device", "cuda"}});
  EXPECT_EQ(cuda.comm_bytes, 4 * (262272 + 262272 / 3) + 16u);
}

TEST(EstimateModelStateTest, RefusesWhatTheTrainerRefusesWithValidationsMessage) {
  const TrialConfig config = Trial(
      {{"model", "llmctl-demo"}, {"strategy", "fsdp"}, {"devices", "2"}, {"peft.method", "lora"}});
  const StatusOr<ModelStateEstimate> estimate =
      EstimateModelState(config, *FindPreset("llmctl-demo"));
  ASSERT_FALSE(estimate.ok());
  EXPECT_EQ(estimate.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(estimate.status().message(), ValidateTrialConfig(config, nullptr).message());
}

TEST(EstimateModelStateTest, RefusesAModelTooLargeToCount) {
  ModelConfig huge = *FindPreset("llmctl-demo");
  huge.num_hidden_layers = int64_t{1} << 40;
  const StatusOr<ModelStateEstimate> estimate = EstimateModelState(Trial({}), huge);
  ASSERT_FALSE(estimate.ok());
  // The shape's bound (common/model_bounds.h) names it before its parameters are counted.
  EXPECT_NE(
      estimate.status().message().find("'num_hidden_layers' is 1099511627776, more than 1024"),
      std::string::npos)
      << estimate.status().message();
}

}  // namespace
}  // namespace llmctl::estimate
