#include "common/estimate/blip2_work.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace llmctl::estimate {
namespace {

// A BLIP-2 small enough to count by hand: a 28 x 28 image in 14 x 14 patches (4 patches and the
// class token), 2 queries, one layer of each stack, 8 wide with 16 in the FFNs, a 10-token OPT.
Blip2Config TinyBlip2() {
  Blip2Config m;
  m.vision = {.hidden_size = 8,
              .intermediate_size = 16,
              .num_hidden_layers = 1,
              .num_attention_heads = 2,
              .image_size = 28,
              .patch_size = 14};
  m.qformer = {.hidden_size = 8,
               .intermediate_size = 16,
               .num_hidden_layers = 1,
               .num_attention_heads = 2,
               .cross_attention_frequency = 1,
               .encoder_hidden_size = 8};
  m.text = OptConfig{.vocab_size = 10,
                     .hidden_size = 8,
                     .ffn_dim = 16,
                     .num_hidden_layers = 1,
                     .num_attention_heads = 2};
  m.num_query_tokens = 2;
  return m;
}

TrialConfig Config(std::initializer_list<std::pair<const char*, const char*>> sets) {
  TrialConfig config;
  for (const auto& [key, value] : std::initializer_list<std::pair<const char*, const char*>>{
           {"model", "tiny-blip2"},
           {"data.path", "captions"},
           {"data.format", "imagefolder"},
           {"data.max_seq_length", "3"},
           {"train.micro_batch_size", "1"}}) {
    EXPECT_TRUE(config.SetFromText(key, value).ok()) << key;
  }
  for (const auto& [key, value] : sets) {
    const Status set = config.SetFromText(key, value);
    EXPECT_TRUE(set.ok()) << key << ": " << set.message();
  }
  return config;
}

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
// the sequences most of it runs over, so a CPU takes each at its own probed rate; together they
// are every matmul FLOP but the adapters'.
TEST(Blip2WorkTest, ProjectionsAreCountedByShapeAndAttentionByItsSequences) {
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
  // Attention forward and backward (3x): the ViT's 800 over 5 keys, the Q-Former's 128 over 2
  // and 320 over 5, OPT's 800 over 5; its sequence their FLOP-weighted mean of keys.
  EXPECT_DOUBLE_EQ(full->attention_flops, 3 * (800 + 128 + 320 + 800));
  EXPECT_DOUBLE_EQ(full->attention_seq, (800 * 5 + 128 * 2 + 320 * 5 + 800 * 5) /
                                            static_cast<double>(800 + 128 + 320 + 800));

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

}  // namespace
}  // namespace llmctl::estimate
