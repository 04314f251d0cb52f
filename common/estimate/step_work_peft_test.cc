// The work of a step with LoRA or QLoRA adapters (step_work.h), by hand on the small LLaMA of
// step_work_test.cc: the adapters' matmuls and dropout, QLoRA's compute dtype, its conversions and
// dequantisation, and autocast's casts of the stream the adapters read.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/estimate/step_time.h"
#include "common/estimate/step_work.h"
#include "common/estimate/step_work_test_support.h"

namespace llmctl::estimate {
namespace {

using nlohmann::json;
using test_support::kAttention;
using test_support::kHeadWeights;
using test_support::kLayerWeights;
using test_support::kTokens;
using test_support::SmallConfig;
using test_support::SmallModel;

// QLoRA's NF4 projections run in its compute dtype; the head (never quantised), the adapters and
// attention in the activations' dtype: fp32 in a 32-true step. The step's class, whose factor
// calibrates it, is the projections'. bf16-true runs all of it in bf16, a 32-true LoRA in fp32.
TEST(StepWorkTest, AQloraStepsProjectionsRunInTheComputeDtypeAndTheRestInTheActivations) {
  auto classes = [](const StepWork& w) {
    std::map<std::pair<int64_t, int64_t>, MatmulClass> by_weight;
    for (const MatmulShape& s : w.matmul_shapes) by_weight[{s.in, s.out}] = ShapeClass(w, s);
    return by_weight;
  };
  const auto qlora = {std::pair{"peft.method", "qlora"},
                      {"peft.r", "4"},
                      {"peft.targets", "[q_proj]"},
                      {"peft.compute_dtype", "bf16"}};
  StatusOr<StepWork> fp32 = EstimateStepWork(SmallConfig(qlora), SmallModel());
  ASSERT_TRUE(fp32.ok()) << fp32.status().message();
  EXPECT_EQ(fp32->matmul_class, MatmulClass::kBf16);
  EXPECT_EQ(AttentionClass(*fp32), MatmulClass::kFp32);
  const auto fp32_classes = classes(*fp32);
  for (const auto& weight : {std::pair<int64_t, int64_t>{64, 64}, {64, 32}, {64, 256}, {256, 64}}) {
    EXPECT_EQ(fp32_classes.at(weight), MatmulClass::kBf16) << weight.first << "x" << weight.second;
  }
  for (const auto& weight : {std::pair<int64_t, int64_t>{64, 1000}, {64, 4}, {4, 64}}) {
    EXPECT_EQ(fp32_classes.at(weight), MatmulClass::kFp32) << weight.first << "x" << weight.second;
  }
  TrialConfig bf16_config = SmallConfig(qlora);
  ASSERT_TRUE(bf16_config.SetFromText("precision", "bf16-true").ok());
  StatusOr<StepWork> bf16 = EstimateStepWork(bf16_config, SmallModel());
  ASSERT_TRUE(bf16.ok()) << bf16.status().message();
  EXPECT_EQ(AttentionClass(*bf16), MatmulClass::kBf16);
  for (const auto& [weight, c] : classes(*bf16)) EXPECT_EQ(c, MatmulClass::kBf16);
  StatusOr<StepWork> lora = EstimateStepWork(
      SmallConfig({{"peft.method", "lora"}, {"peft.r", "4"}, {"peft.targets", "[q_proj]"}}),
      SmallModel());
  ASSERT_TRUE(lora.ok()) << lora.status().message();
  EXPECT_EQ(lora->matmul_class, MatmulClass::kFp32);
  EXPECT_EQ(AttentionClass(*lora), MatmulClass::kFp32);
  for (const auto& [weight, c] : classes(*lora)) EXPECT_EQ(c, MatmulClass::kFp32);
}

// An NF4 projection whose compute dtype is not the activations' converts, per token, its input and
// output forward and their gradients backward: 6 bytes a value (read fp32, write bf16 or the
// reverse), again for checkpointing's second forward. SmallModel's seven projections a layer take
// 7 x 64 + 2 x 64 + 2 x 32 + 3 x 256 = 1,408 values in and out; a micro-batch has 2 x 32 tokens.
TEST(StepWorkTest, AQloraProjectionConvertsToAndFromItsComputeDtype) {
  const auto at = [](const char* precision, const char* compute, const char* checkpointing) {
    StatusOr<StepWork> w =
        EstimateStepWork(SmallConfig({{"peft.method", "qlora"},
                                      {"precision", precision},
                                      {"peft.compute_dtype", compute},
                                      {"activation_checkpointing", checkpointing}}),
                         SmallModel());
    EXPECT_TRUE(w.ok()) << w.status().message();
    return w.ok() ? w->memory_bytes : 0.0;
  };
  const double converted = 64 * 2 * 1408 * 6.0;  // tokens x layers x values x bytes, one pass
  // The same bytes are the work's casts, which `--explain` names; fp32 compute converts nothing.
  const auto casts = [](const char* compute) {
    StatusOr<StepWork> w = EstimateStepWork(
        SmallConfig({{"peft.method", "qlora"}, {"peft.compute_dtype", compute}}), SmallModel());
    EXPECT_TRUE(w.ok()) << w.status().message();
    return w.ok() ? w->cast_memory_bytes : -1.0;
  };
  EXPECT_DOUBLE_EQ(casts("bf16"), 2 * converted);
  EXPECT_EQ(casts("fp32"), 0);
  EXPECT_DOUBLE_EQ(at("32-true", "bf16", "false") - at("32-true", "fp32", "false"), 2 * converted);
  EXPECT_DOUBLE_EQ(at("32-true", "bf16", "true") - at("32-true", "fp32", "true"), 3 * converted);
  EXPECT_DOUBLE_EQ(at("bf16-true", "fp32", "false") - at("bf16-true", "bf16", "false"),
                   2 * converted);
}

// Under autocast every projection or adapter that reads the fp32 residual stream casts it to bf16,
// t x h values at 6 bytes a value, and backward casts its gradient back; o_proj reads attention's
// bf16 output. SmallModel's q_proj and o_proj are both 64 x 64, so their adapters differ only in
// that cast: 2 x 32 tokens x 64 wide x 6 B, in 2 layers, forward and backward (again for
// checkpointing's second forward). bf16-true casts nothing.
TEST(StepWorkTest, AutocastCastsTheStreamForEachAdapterThatReadsIt) {
  const auto at = [](const char* precision, const char* target, const char* checkpointing) {
    StatusOr<StepWork> w =
        EstimateStepWork(SmallConfig({{"peft.method", "lora"},
                                      {"peft.r", "4"},
                                      {"peft.dropout", "0"},
                                      {"peft.targets", target},
                                      {"precision", precision},
                                      {"activation_checkpointing", checkpointing}}),
                         SmallModel());
    EXPECT_TRUE(w.ok()) << w.status().message();
    return w.ok() ? w->memory_bytes : 0.0;
  };
  const double cast = 64 * 64 * 6.0 * 2;  // tokens x hidden x bytes x layers
  EXPECT_DOUBLE_EQ(at("bf16-mixed", "[q_proj]", "false") - at("bf16-mixed", "[o_proj]", "false"),
                   2 * cast);
  EXPECT_DOUBLE_EQ(at("bf16-mixed", "[q_proj]", "true") - at("bf16-mixed", "[o_proj]", "true"),
                   3 * cast);
  EXPECT_DOUBLE_EQ(at("bf16-true", "[q_proj]", "false"), at("bf16-true", "[o_proj]", "false"));
}

// LoRA's adapter dropout draws a mask over each adapted projection's input, every forward
// (checkpointing's rerun draws again): on the CPU t x in values a projection a layer, timed at the
// dropout rate; on CUDA none (its draws are the masks' memory traffic). No dropout, no draws.
TEST(StepWorkTest, AdapterDropoutDrawsAMaskOverEachAdaptedInputOnTheCpu) {
  const auto lora = {std::pair{"peft.method", "lora"},
                     {"peft.r", "4"},
                     {"peft.targets", "[q_proj, down_proj]"},
                     {"peft.dropout", "0.05"}};
  StatusOr<StepWork> cpu = EstimateStepWork(SmallConfig(lora), SmallModel());
  ASSERT_TRUE(cpu.ok()) << cpu.status().message();
  // q_proj's input is 64 wide, down_proj's 256; two layers.
  EXPECT_DOUBLE_EQ(cpu->dropout_values, kTokens * 2 * (64 + 256));
  TrialConfig checkpointed = SmallConfig(lora);
  ASSERT_TRUE(checkpointed.SetFromText("activation_checkpointing", "true").ok());
  StatusOr<StepWork> rerun = EstimateStepWork(checkpointed, SmallModel());
  ASSERT_TRUE(rerun.ok()) << rerun.status().message();
  EXPECT_DOUBLE_EQ(rerun->dropout_values, 2 * cpu->dropout_values);
  TrialConfig gpu = SmallConfig(lora);
  ASSERT_TRUE(gpu.SetFromText("device", "cuda").ok());
  StatusOr<StepWork> cuda = EstimateStepWork(gpu, SmallModel());
  ASSERT_TRUE(cuda.ok()) << cuda.status().message();
  EXPECT_EQ(cuda->dropout_values, 0);
  StatusOr<StepWork> none = EstimateStepWork(SmallConfig({{"peft.method", "lora"},
                                                          {"peft.r", "4"},
                                                          {"peft.targets", "[q_proj]"},
                                                          {"peft.dropout", "0"}}),
                                             SmallModel());
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(none->dropout_values, 0);
  // A work stored before dropout was counted reads with none.
  json old = cpu->ToJson();
  old.erase("dropout_values");
  StatusOr<StepWork> read = StepWork::FromJson(old);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->dropout_values, 0);
}

TEST(StepWorkTest, LoraSkipsTheFrozenWeightsGradientsAndAddsItsAdapters) {
  StatusOr<StepWork> lora = EstimateStepWork(
      SmallConfig({{"peft.method", "lora"}, {"peft.r", "4"}, {"peft.targets", "[q_proj]"}}),
      SmallModel());
  ASSERT_TRUE(lora.ok()) << lora.status().message();
  // Frozen weights: forward and the input's gradient (4 t W); q_proj's adapter 6 t r (in + out).
  const double adapters = 2 * 6 * kTokens * 4 * (64 + 64);
  EXPECT_DOUBLE_EQ(lora->matmul_flops, 4 * kTokens * (2 * kLayerWeights + kHeadWeights) +
                                           2 * 3 * kAttention + adapters);
}

TEST(StepWorkTest, PrecisionSetsTheMatmulClassAndQloraItsDequantisation) {
  StatusOr<StepWork> bf16 =
      EstimateStepWork(SmallConfig({{"precision", "bf16-true"}}), SmallModel());
  ASSERT_TRUE(bf16.ok());
  EXPECT_EQ(bf16->matmul_class, MatmulClass::kBf16);
  StatusOr<StepWork> lora = EstimateStepWork(
      SmallConfig({{"peft.method", "lora"}, {"device", "cuda"}, {"precision", "bf16-true"}}),
      SmallModel());
  StatusOr<StepWork> qlora = EstimateStepWork(
      SmallConfig({{"peft.method", "qlora"}, {"device", "cuda"}, {"precision", "bf16-true"}}),
      SmallModel());
  ASSERT_TRUE(lora.ok() && qlora.ok()) << lora.status().message() << qlora.status().message();
  // Every projection's weight dequantised for the forward and again for the input's gradient.
  EXPECT_DOUBLE_EQ(qlora->memory_bytes - lora->memory_bytes, 2 * 2 * kLayerWeights * 22.5);
}

// QLoRA's NF4 dequantisation: every NF4 weight dequantised for its forward and again for its
// input's gradient (again in forward under checkpointing), on the CPU counted as values at their
// own rate, on CUDA as 22.5 B of memory traffic a value.
TEST(StepWorkTest, Nf4DequantisationIsItsOwnWorkOnTheCpuAndMemoryOnCuda) {
  const std::initializer_list<std::pair<const char*, const char*>> qlora = {
      {"peft.method", "qlora"}, {"peft.targets", "[q_proj, v_proj]"}};
  StatusOr<StepWork> cpu = EstimateStepWork(SmallConfig(qlora), SmallModel());
  StatusOr<StepWork> checkpointed =
      EstimateStepWork(SmallConfig({{"peft.method", "qlora"},
                                    {"peft.targets", "[q_proj, v_proj]"},
                                    {"activation_checkpointing", "true"}}),
                       SmallModel());
  StatusOr<StepWork> cuda = EstimateStepWork(
      SmallConfig(
          {{"peft.method", "qlora"}, {"peft.targets", "[q_proj, v_proj]"}, {"device", "cuda"}}),
      SmallModel());
  ASSERT_TRUE(cpu.ok() && checkpointed.ok() && cuda.ok());
  // Every projection of both layers is NF4: forward and the input's gradient, one micro-batch.
  EXPECT_DOUBLE_EQ(cpu->nf4_dequant_values, 2 * kLayerWeights * 2);
  EXPECT_DOUBLE_EQ(checkpointed->nf4_dequant_values, 2 * kLayerWeights * 3);
  EXPECT_EQ(cuda->nf4_dequant_values, 0);
  // CUDA's is memory: the CPU work's bytes and 22.5 B a value, and its loss' bytes (the CPU
  // work's are logits).
  EXPECT_DOUBLE_EQ(cuda->memory_bytes - cpu->memory_bytes,
                   2 * kLayerWeights * 2 * 22.5 + cpu->loss_logits * LossBytesPerLogit(true, 4));
  const TimeEstimate time = EstimateTime(*cpu, CpuSpeed(), Calibration{}, 0);
  double dequant = -1;
  for (const TimeTerm& term : time.terms) {
    if (term.name == "NF4 dequant") dequant = term.seconds;
  }
  EXPECT_DOUBLE_EQ(dequant, 2 * kLayerWeights * 2 / 0.75e9);  // the sheet's rate
  StatusOr<StepWork> back = StepWork::FromJson(cpu->ToJson());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->nf4_dequant_values, cpu->nf4_dequant_values);
  json stored = cpu->ToJson();
  stored.erase("nf4_dequant_values");  // a work stored before it: none
  EXPECT_EQ(StepWork::FromJson(stored)->nf4_dequant_values, 0);
}

}  // namespace
}  // namespace llmctl::estimate
