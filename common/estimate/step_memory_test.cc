// The step's peak with a device's matmul buffers (matmul_buffers.h): the chunked loss' moments
// hold the buffer of the head product running then, of the products' dtype, and no other moment
// does.
// Against the real trainer the peaks are checked in peak_test.cc.
#include "common/estimate/step_memory.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/estimate/blip2_memory.h"
#include "common/estimate/blip2_test_support.h"

namespace llmctl::estimate {
namespace {

using Sets = std::vector<std::pair<std::string, std::string>>;

// demo.yaml's trial (the llmctl-demo preset, micro-batch 4 x 128) with `sets` applied.
TrialConfig DemoTrial(const Sets& sets) {
  TrialConfig config;
  Sets all = {{"model", "llmctl-demo"},
              {"data.path", "train.jsonl"},
              {"train.micro_batch_size", "4"},
              {"train.global_batch_size", "4"},
              {"data.max_seq_length", "128"}};
  all.insert(all.end(), sets.begin(), sets.end());
  for (const auto& [key, value] : all) {
    const Status status = config.SetFromText(key, value);
    EXPECT_TRUE(status.ok()) << key << ": " << status.message();
  }
  ApplyLabSpellings(config);
  return config;
}

StepMemoryEstimate Estimate(const Sets& sets, const MatmulBuffers& buffers) {
  StatusOr<StepMemoryEstimate> estimate =
      EstimateStepMemory(DemoTrial(sets), *FindPreset("llmctl-demo"), buffers);
  EXPECT_TRUE(estimate.ok()) << estimate.status().message();
  return estimate.ok() ? *estimate : StepMemoryEstimate{};
}

// The demo model's head is 2,048 words wide: its figures are the 2,048-wide ones.
const MatmulBuffers& Buffers() {
  static const MatmulBuffers buffers = {
      .fp32 = {{.vocab = 2048, .logits = 700, .input_gradient = 800, .weight_gradient = 1000}},
      .bf16 = {
          {.vocab = 2048, .logits = 165'504, .input_gradient = 394'880, .weight_gradient = 460'544},
          {.vocab = 16384,
           .logits = 3'000'000,
           .input_gradient = 3'000'000,
           .weight_gradient = 3'000'000}}};
  return buffers;
}

// A head's buffers are the narrowest measured head's at least as wide, else the widest's.
TEST(StepMemoryBuffersTest, AHeadTakesTheNarrowestMeasuredHeadAtLeastAsWide) {
  EXPECT_EQ(Buffers().At(true, 512).weight_gradient, 460'544u);
  EXPECT_EQ(Buffers().At(true, 2048).weight_gradient, 460'544u);
  EXPECT_EQ(Buffers().At(true, 2049).weight_gradient, 3'000'000u);
  EXPECT_EQ(Buffers().At(true, 128'256).weight_gradient, 3'000'000u);
  EXPECT_EQ(Buffers().At(false, 128'256).weight_gradient, 1000u);
  EXPECT_EQ(MatmulBuffers{}.At(true, 2048).logits, 0u);
}

// The row peaks in the chunked loss' first chunk, during the head's weight gradient (measured,
// docs/estimate.md), where that product's buffer is added to the byte and named.
TEST(StepMemoryBuffersTest, TheChunkedLossMomentHoldsItsProductsBuffer) {
  const StepMemoryEstimate without = Estimate({{"precision", "bf16-true"}}, {});
  const StepMemoryEstimate with = Estimate({{"precision", "bf16-true"}}, Buffers());
  ASSERT_EQ(without.peak_phase, "forward");
  EXPECT_EQ(with.peak_phase, "forward");
  EXPECT_EQ(with.peak_bytes, without.peak_bytes + 460'544);
  EXPECT_EQ(with.activation_bytes, without.activation_bytes);
  ASSERT_FALSE(with.terms.empty());
  EXPECT_NE(
      with.terms.back().formula.find("the head GEMM's buffers 449.75 KiB (measured by the probe)"),
      std::string::npos)
      << with.terms.back().formula;
  EXPECT_EQ(without.terms.back().formula.find("buffers"), std::string::npos);
}

// fp32's products take the fp32 buffers.
TEST(StepMemoryBuffersTest, Fp32ProductsTakeTheFp32Buffers) {
  const StepMemoryEstimate without = Estimate({}, {});
  const StepMemoryEstimate with = Estimate({}, Buffers());
  ASSERT_EQ(without.peak_phase, "forward");
  EXPECT_EQ(with.peak_bytes, without.peak_bytes + 1000);
}

// A frozen head (LoRA) forms no weight gradient: only the logits' and the hidden states'
// gradient's products run, and the largest of their buffers is what its chunks hold.
TEST(StepMemoryBuffersTest, AFrozenHeadTakesNoWeightGradientsBuffer) {
  const Sets lora = {{"precision", "bf16-true"}, {"peft.method", "lora"}};
  const MatmulBuffers weight_gradient_only = {
      .bf16 = {{.vocab = 2048, .weight_gradient = 1 << 24}}};
  const StepMemoryEstimate without = Estimate(lora, {});
  EXPECT_EQ(Estimate(lora, weight_gradient_only).peak_bytes, without.peak_bytes);
  const MatmulBuffers input_gradient_only = {.bf16 = {{.vocab = 2048, .input_gradient = 1 << 24}}};
  const StepMemoryEstimate with = Estimate(lora, input_gradient_only);
  EXPECT_EQ(with.peak_phase, "forward");
  EXPECT_GT(with.peak_bytes, without.peak_bytes);
  EXPECT_LE(with.peak_bytes, without.peak_bytes + (1 << 24));
}

// An adapter on the head runs each chunk through autograd: its peak is in the chunk's float32
// copies, where no product runs, so a buffer smaller than that moment's excess over a product's
// (two logits-sized tensors beside the buffer) leaves the peak where it was (measured on the Zen 4
// at 16 threads, the demo model's QLoRA row with an adapter on the head: 2.3 MB of buffers, none
// in its peak), and a larger one shows by the bytes it exceeds it.
TEST(StepMemoryBuffersTest, AnAdaptedHeadPeaksInItsFloatCopiesUnlessAProductsBufferIsLarger) {
  const Sets adapted = {{"precision", "bf16-true"},
                        {"peft.method", "lora"},
                        {"peft.targets", "[q_proj, v_proj, lm_head]"}};
  const StepMemoryEstimate without = Estimate(adapted, {});
  ASSERT_EQ(without.peak_phase, "forward");
  // A 256-token chunk's bf16 logits; its moment without a product is three float32 ones.
  const uint64_t logits = 256 * 2048 * 2;
  const uint64_t headroom = 3 * 2 * logits - 2 * logits;
  for (const MatmulBuffers& below :
       {MatmulBuffers{.bf16 = {{.vocab = 2048, .logits = headroom}}},
        MatmulBuffers{.bf16 = {{.vocab = 2048, .input_gradient = headroom}}},
        MatmulBuffers{.bf16 = {{.vocab = 2048, .weight_gradient = headroom}}}}) {
    EXPECT_EQ(Estimate(adapted, below).peak_bytes, without.peak_bytes);
  }
  const MatmulBuffers above = {.bf16 = {{.vocab = 2048, .input_gradient = headroom + 4321}}};
  EXPECT_EQ(Estimate(adapted, above).peak_bytes, without.peak_bytes + 4321);
}

// Autocast's products are bf16, and bf16-mixed's first chunk then widens its bf16 weight gradient
// into the float32 sum (V x C x 4 B) with no product running: the buffer shows only where it is
// larger than that sum.
TEST(StepMemoryBuffersTest, BfloatMixedPeaksWhereItsGradientIsWidenedUnlessTheBufferIsLarger) {
  const ModelConfig& model = *FindPreset("llmctl-demo");
  const uint64_t sum = 4 * static_cast<uint64_t>(model.vocab_size * model.hidden_size);
  const StepMemoryEstimate without = Estimate({{"precision", "bf16-mixed"}}, {});
  ASSERT_EQ(without.peak_phase, "forward");
  ASSERT_LT(Buffers().At(true, model.vocab_size).weight_gradient, sum);
  EXPECT_EQ(Estimate({{"precision", "bf16-mixed"}}, Buffers()).peak_bytes, without.peak_bytes);
  const MatmulBuffers large = {.bf16 = {{.vocab = 2048, .weight_gradient = sum + 12'345}}};
  EXPECT_EQ(Estimate({{"precision", "bf16-mixed"}}, large).peak_bytes, without.peak_bytes + 12'345);
}

// ATen's loss runs its head as one product outside any chunk moment, and 16-mixed's fp16 buffers
// are not measured: neither peak moves.
TEST(StepMemoryBuffersTest, NoChunkedLossOrNoMeasuredDtypeNoBuffer) {
  for (const Sets& sets : std::vector<Sets>{{{"precision", "bf16-true"}, {"kernels", "aten"}},
                                            {{"precision", "16-mixed"}}}) {
    const StepMemoryEstimate without = Estimate(sets, {});
    const StepMemoryEstimate with = Estimate(sets, Buffers());
    EXPECT_EQ(with.peak_bytes, without.peak_bytes) << sets[0].second;
    EXPECT_EQ(with.peak_phase, without.peak_phase) << sets[0].second;
  }
}

// --fit's search takes the buffers too: a device that holds the peak of micro-batch 4 without them
// to the byte (accumulating, as the search estimates a micro-batch below the global batch) does
// not hold it with them.
TEST(StepMemoryBuffersTest, FitTakesTheBuffers) {
  const Sets sets = {{"precision", "bf16-true"}, {"train.global_batch_size", "64"}};
  const StepMemoryEstimate four =
      Estimate({{"precision", "bf16-true"}, {"train.global_batch_size", "8"}}, {});
  ASSERT_EQ(four.peak_phase, "forward");
  const TrialConfig config = DemoTrial(sets);
  const ModelConfig& model = *FindPreset("llmctl-demo");
  const StatusOr<MicroBatchFit> bare = FitMicroBatch(config, model, four.peak_bytes, {});
  ASSERT_TRUE(bare.ok()) << bare.status().message();
  const StatusOr<MicroBatchFit> buffered = FitMicroBatch(config, model, four.peak_bytes, Buffers());
  ASSERT_TRUE(buffered.ok()) << buffered.status().message();
  EXPECT_EQ(bare->micro_batch_size, 4);
  EXPECT_EQ(buffered->micro_batch_size, 3);
}

// BLIP-2's chunked loss holds its head products' buffers as the LLaMA family's does: a buffer
// large enough to make the chunk's moment the step's peak moves it byte for byte, and without the
// chunked loss (the ATen kernels) nothing moves.
TEST(StepMemoryBuffersTest, Blip2sChunkedLossHoldsItsHeadProductsBuffer) {
  auto peak = [](const TrialConfig& config, const MatmulBuffers& buffers) {
    StatusOr<StepMemoryEstimate> estimate =
        EstimateBlip2StepMemory(config, testing::TinyBlip2(), std::nullopt, buffers);
    EXPECT_TRUE(estimate.ok()) << estimate.status().message();
    return estimate.ok() ? estimate->peak_bytes : 0;
  };
  const MatmulBuffers large = {.bf16 = {{.vocab = 2048, .logits = uint64_t{1} << 28}}};
  const MatmulBuffers larger = {.bf16 = {{.vocab = 2048, .logits = (uint64_t{1} << 28) + 4321}}};
  const TrialConfig fused = testing::Config({{"precision", "bf16-true"}, {"kernels", "fused"}});
  EXPECT_GT(peak(fused, large), uint64_t{1} << 28);
  EXPECT_EQ(peak(fused, larger), peak(fused, large) + 4321);
  // fp32's products take the fp32 buffers, none here.
  EXPECT_EQ(peak(testing::Config({{"kernels", "fused"}}), large),
            peak(testing::Config({{"kernels", "fused"}}), {}));
  const TrialConfig aten = testing::Config({{"precision", "bf16-true"}, {"kernels", "aten"}});
  EXPECT_EQ(peak(aten, large), peak(aten, {}));
}

}  // namespace
}  // namespace llmctl::estimate
