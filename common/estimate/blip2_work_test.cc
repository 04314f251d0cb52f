#include "common/estimate/blip2_work.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>

#include "common/estimate/blip2_test_support.h"

namespace llmctl::estimate {
namespace {

using testing::Config;
using testing::TinyBlip2;

// Forward matmul FLOPs of one example, by hand (2 x tokens x in x out a linear layer; attention
// 4 x queries x keys x width):
//   vision: the patch embedding 2 x 4 x 588 x 8 = 37,632 (outside the block); its layer over 5
//     tokens: qkv, projection, fc1, fc2 = 2 x 5 x (192 + 64 + 128 + 128) = 5,120, attention
//     4 x 5 x 5 x 8 = 800.
//   Q-Former over 2 queries: self-attention 4 x 2 x 2 x 64 = 1,024 and 4 x 2 x 2 x 8 = 128;
//     cross-attention q and o 2 x 2 x 2 x 64 = 512, k and v over the 5 image tokens 2 x 2 x 5 x
//     64 = 1,280, attention 4 x 2 x 5 x 8 = 320; FFN 2 x 2 x 2 x 128 = 1,024.
constexpr double kVisionBlock = 5120 + 800;
constexpr double kVisionPatches = 37632;
constexpr double kQFormerBlock = 1024 + 128 + 512 + 1280 + 320 + 1024;

TEST(Blip2WorkTest, AFrozenImageSideRunsOnlyItsForward) {
  StatusOr<StepWork> full = EstimateBlip2StepWork(Config({}), TinyBlip2());
  StatusOr<StepWork> frozen =
      EstimateBlip2StepWork(Config({{"freeze", "[vision_model, qformer]"}}), TinyBlip2());
  ASSERT_TRUE(full.ok()) << full.status().message();
  ASSERT_TRUE(frozen.ok()) << frozen.status().message();
  // Trained, their backward forms every input's and weight's gradient (2x each linear layer's
  // forward) and attention's (2x its forward).
  EXPECT_DOUBLE_EQ(full->matmul_flops - frozen->matmul_flops,
                   2 * (kVisionBlock + kVisionPatches + kQFormerBlock));
  EXPECT_LT(frozen->memory_bytes, full->memory_bytes);
  // What llm-train counts as tokens: the queries' places and the caption.
  EXPECT_EQ(full->tokens, 2 + 3);
}

TEST(Blip2WorkTest, CheckpointingRerunsTheBlocksOfThePartsBackwardRunsThrough) {
  StatusOr<StepWork> frozen =
      EstimateBlip2StepWork(Config({{"freeze", "[vision_model, qformer]"}}), TinyBlip2());
  StatusOr<StepWork> recomputed = EstimateBlip2StepWork(
      Config({{"freeze", "[vision_model, qformer]"}, {"activation_checkpointing", "true"}}),
      TinyBlip2());
  ASSERT_TRUE(frozen.ok() && recomputed.ok());
  // OPT's one block over 5 tokens: q, k, v, o 2 x 5 x 4 x 64 = 2,560, attention 4 x 5 x 5 x 8 =
  // 800, fc1 and fc2 2 x 5 x 2 x 128 = 2,560; the frozen image side is not rerun, nor the head.
  EXPECT_DOUBLE_EQ(recomputed->matmul_flops - frozen->matmul_flops, 2560 + 800 + 2560);
}

// Each projection is counted at its shape (a micro-batch's rows, its weight), attention apart at
// each part's sequences and heads, so a CPU takes each at its own probed rate; together they are
// every matmul FLOP but the adapters'.
TEST(Blip2WorkTest, ProjectionsAreCountedByShapeAndAttentionByItsParts) {
  StatusOr<StepWork> full = EstimateBlip2StepWork(Config({}), TinyBlip2());
  ASSERT_TRUE(full.ok()) << full.status().message();
  double shaped = 0;
  for (const MatmulShape& shape : full->matmul_shapes) shaped += shape.flops;
  EXPECT_NEAR(shaped + full->attention_flops, full->matmul_flops, 1e-9 * full->matmul_flops);
  // The ViT's patch embedding: 4 patch rows through 588 x 8, forward and both gradients.
  const auto patches = std::find_if(full->matmul_shapes.begin(), full->matmul_shapes.end(),
                                    [](const MatmulShape& s) { return s.in == 588; });
  ASSERT_NE(patches, full->matmul_shapes.end());
  EXPECT_EQ(patches->rows, 4);
  EXPECT_DOUBLE_EQ(patches->flops, 3 * kVisionPatches);
  // Attention forward and backward (3x), by shape, every head 4 wide: the ViT's 800 (5 tokens
  // over 5) with OPT's 800 (2 queries' places and 3 caption tokens, over 5), the Q-Former's 128
  // (2 queries over 2) and its cross-attention's 320 (2 queries over the image's 5).
  EXPECT_DOUBLE_EQ(full->attention_flops, 3 * (800 + 128 + 320 + 800));
  ASSERT_EQ(full->attention_shapes.size(), 3u);
  const std::vector<std::array<double, 4>> expected = {
      {5, 5, 4, 3 * (800 + 800)}, {2, 2, 4, 3 * 128}, {2, 5, 4, 3 * 320}};
  for (size_t i = 0; i < expected.size(); ++i) {
    const AttentionShape& shape = full->attention_shapes[i];
    EXPECT_EQ((std::array<double, 4>{shape.queries, shape.keys, shape.head_width, shape.flops}),
              expected[i])
        << i;
  }

  // Adapters' FLOPs are no projection's shape: they take the micro-batch's rate.
  StatusOr<StepWork> lora = EstimateBlip2StepWork(
      Config({{"peft.method", "lora"}, {"peft.targets", "[q_proj, v_proj]"}}), TinyBlip2());
  ASSERT_TRUE(lora.ok()) << lora.status().message();
  shaped = 0;
  for (const MatmulShape& shape : lora->matmul_shapes) shaped += shape.flops;
  EXPECT_LT(shaped + lora->attention_flops, lora->matmul_flops * (1 - 1e-9));
}

// Under a 32-true QLoRA the language model's NF4 projections run in the compute dtype; the ViT,
// the Q-Former, the projection, the head and attention in fp32, the elements' dtype.
TEST(Blip2WorkTest, AQloraStepRunsOnlyItsNf4ProjectionsInTheComputeDtype) {
  StatusOr<StepWork> qlora = EstimateBlip2StepWork(
      // A 4-token caption: OPT's rows (2 queries and 4 tokens) are not the ViT's 5.
      Config({{"peft.method", "qlora"},
              {"peft.targets", "[q_proj, v_proj]"},
              {"peft.compute_dtype", "bf16"},
              {"data.max_seq_length", "4"}}),
      TinyBlip2());
  ASSERT_TRUE(qlora.ok()) << qlora.status().message();
  EXPECT_EQ(qlora->matmul_class, MatmulClass::kBf16);
  EXPECT_EQ(AttentionClass(*qlora), MatmulClass::kFp32);
  auto class_at = [&](int64_t rows, int64_t in, int64_t out) {
    for (const MatmulShape& s : qlora->matmul_shapes) {
      if (s.rows == rows && s.in == in && s.out == out) return ShapeClass(*qlora, s);
    }
    ADD_FAILURE() << rows << " x " << in << " x " << out << " not counted";
    return MatmulClass::kBf16;
  };
  EXPECT_EQ(class_at(4, 588, 8), MatmulClass::kFp32);  // the ViT's patch embedding
  EXPECT_EQ(class_at(5, 8, 24), MatmulClass::kFp32);   // the ViT's qkv
  EXPECT_EQ(class_at(5, 8, 8), MatmulClass::kFp32);    // the ViT's projection
  EXPECT_EQ(class_at(6, 8, 8), MatmulClass::kBf16);    // OPT's q, k, v, o: NF4
  EXPECT_EQ(class_at(6, 8, 16), MatmulClass::kBf16);   // OPT's fc1: NF4
  EXPECT_EQ(class_at(6, 8, 10), MatmulClass::kFp32);   // OPT's head, never quantised
  StatusOr<StepWork> bf16 = EstimateBlip2StepWork(Config({{"peft.method", "qlora"},
                                                          {"peft.targets", "[q_proj, v_proj]"},
                                                          {"precision", "bf16-true"}}),
                                                  TinyBlip2());
  ASSERT_TRUE(bf16.ok()) << bf16.status().message();
  EXPECT_EQ(AttentionClass(*bf16), MatmulClass::kBf16);
  for (const MatmulShape& s : bf16->matmul_shapes)
    EXPECT_EQ(ShapeClass(*bf16, s), MatmulClass::kBf16);
}

TEST(Blip2WorkTest, CaptionsOfTheLongestExampleShortenTheStep) {
  StatusOr<StepWork> full = EstimateBlip2StepWork(Config({}), TinyBlip2());
  StatusOr<StepWork> shorter = EstimateBlip2StepWork(Config({}), TinyBlip2(), 1);
  ASSERT_TRUE(full.ok() && shorter.ok());
  EXPECT_EQ(shorter->tokens, 2 + 1);
  EXPECT_LT(shorter->matmul_flops, full->matmul_flops);
}

// A CPU step draws every dropout mask of the model's own, a value at a time (step_work.h's
// dropout_values), counted by hand for the tiny BLIP-2 with transformers' defaults: the Q-Former's
// hidden and attention-probability dropout 0.1, OPT's 0.1 on its outputs (none on its
// probabilities), none in the ViT.
TEST(Blip2WorkTest, ACpuStepDrawsTheModelsDropoutMasks) {
  // The Q-Former (2 query rows, 8 wide, 2 heads): its embeddings' 16 outside the blocks; in its
  // block the self-attention's probabilities 2 x 2 x 2 and output 16, the cross-attention's 2 x 2
  // x 5 and 16, the FFN's output 16. OPT's block: 2 outputs of 5 rows x 8.
  constexpr double kUnblocked = 16, kQFormer = 8 + 16 + 20 + 16 + 16, kOpt = 2 * 5 * 8;
  StatusOr<StepWork> step = EstimateBlip2StepWork(Config({}), TinyBlip2());
  ASSERT_TRUE(step.ok()) << step.status().message();
  EXPECT_DOUBLE_EQ(step->dropout_values, kUnblocked + kQFormer + kOpt);
  // Checkpointing redraws the blocks' masks in its rerun.
  StatusOr<StepWork> checkpointed =
      EstimateBlip2StepWork(Config({{"activation_checkpointing", "true"}}), TinyBlip2());
  ASSERT_TRUE(checkpointed.ok()) << checkpointed.status().message();
  EXPECT_DOUBLE_EQ(checkpointed->dropout_values, kUnblocked + 2 * (kQFormer + kOpt));
  // The ViT's attention dropout, where its config sets one: 2 heads x 5 x 5.
  Blip2Config vit_dropout = TinyBlip2();
  vit_dropout.vision.attention_dropout = 0.1;
  StatusOr<StepWork> vit = EstimateBlip2StepWork(Config({}), vit_dropout);
  ASSERT_TRUE(vit.ok()) << vit.status().message();
  EXPECT_DOUBLE_EQ(vit->dropout_values - step->dropout_values, 2 * 5 * 5);
  // Flan-T5 in its place (8 wide, 2 heads 4 wide, a 16-wide gated FFN, a layer each): each
  // stack's embeddings and final output, 2 x (5 + 3) x 8, outside the blocks; the encoder's
  // layer over the 2 queries and 3 caption tokens, its probabilities 2 x 5 x 5, output 5 x 8 and
  // FFN 5 x (16 + 8); the decoder's over the caption, self 2 x 3 x 3 and 3 x 8, cross 2 x 3 x 5
  // and 3 x 8, FFN 3 x (16 + 8).
  Blip2Config t5 = TinyBlip2();
  t5.text = T5Config{.vocab_size = 10,
                     .d_model = 8,
                     .d_kv = 4,
                     .d_ff = 16,
                     .num_layers = 1,
                     .num_decoder_layers = 1,
                     .num_heads = 2};
  StatusOr<StepWork> flan = EstimateBlip2StepWork(Config({}), t5);
  ASSERT_TRUE(flan.ok()) << flan.status().message();
  EXPECT_DOUBLE_EQ(flan->dropout_values, kUnblocked + kQFormer + 2 * (5 + 3) * 8 +
                                             (50 + 40 + 5 * 24) + (18 + 24 + 30 + 24 + 3 * 24));
  // A CUDA step's draws are memory traffic, not counted here.
  StatusOr<StepWork> cuda = EstimateBlip2StepWork(Config({{"device", "cuda"}}), TinyBlip2());
  ASSERT_TRUE(cuda.ok()) << cuda.status().message();
  EXPECT_EQ(cuda->dropout_values, 0);
}

}  // namespace
}  // namespace llmctl::estimate
