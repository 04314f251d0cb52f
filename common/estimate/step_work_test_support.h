// A small LLaMA and its trial for the step work's and the step time's tests, whose FLOPs those
// tests count by hand.
#ifndef LLMCTL_COMMON_ESTIMATE_STEP_WORK_TEST_SUPPORT_H_
#define LLMCTL_COMMON_ESTIMATE_STEP_WORK_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <initializer_list>
#include <utility>

#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate::test_support {

// A small LLaMA whose FLOPs are counted by hand below.
inline ModelConfig SmallModel() {
  ModelConfig m;
  m.vocab_size = 1000;
  m.hidden_size = 64;
  m.intermediate_size = 256;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 16;
  m.max_position_embeddings = 128;
  return m;
}

// One micro-batch of `SmallModel` with t tokens: the projections' weights per layer, h x (q + 2 kv)
// + q x h + 3 x h x i, and the head h x V.
inline constexpr double kTokens = 64;
inline constexpr double kLayerWeights = 64.0 * (64 + 2 * 32) + 64.0 * 64 + 3 * 64.0 * 256;
inline constexpr double kHeadWeights = 64.0 * 1000;
inline constexpr double kAttention = 4 * kTokens * 32 * 64;  // 4 t T (heads x head_dim), forward

inline TrialConfig SmallConfig(std::initializer_list<std::pair<const char*, const char*>> sets) {
  TrialConfig config;
  EXPECT_TRUE(config.SetFromText("data.path", "train.jsonl").ok());
  EXPECT_TRUE(config.SetFromText("model", "small").ok());
  EXPECT_TRUE(config.SetFromText("train.micro_batch_size", "2").ok());
  EXPECT_TRUE(config.SetFromText("data.max_seq_length", "32").ok());
  EXPECT_TRUE(config.SetFromText("train.global_batch_size", "2").ok());
  for (const auto& [key, value] : sets) {
    const Status set = config.SetFromText(key, value);
    EXPECT_TRUE(set.ok()) << key << ": " << set.message();
  }
  return config;
}

}  // namespace llmctl::estimate::test_support

#endif  // LLMCTL_COMMON_ESTIMATE_STEP_WORK_TEST_SUPPORT_H_
