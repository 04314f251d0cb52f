// A BLIP-2 small enough to count by hand, and its trials, for the BLIP-2 estimates' unit tests.
#ifndef LLMCTL_COMMON_ESTIMATE_BLIP2_TEST_SUPPORT_H_
#define LLMCTL_COMMON_ESTIMATE_BLIP2_TEST_SUPPORT_H_

#include <gtest/gtest.h>

#include <initializer_list>
#include <utility>

#include "common/blip2_config.h"
#include "common/trial_config.h"

namespace llmctl::estimate::testing {

// A BLIP-2 small enough to count by hand: a 28 x 28 image in 14 x 14 patches (4 patches and the
// class token), 2 queries, one layer of each stack, 8 wide with 16 in the FFNs, a 10-token OPT.
inline Blip2Config TinyBlip2() {
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

inline TrialConfig Config(std::initializer_list<std::pair<const char*, const char*>> sets) {
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

}  // namespace llmctl::estimate::testing

#endif  // LLMCTL_COMMON_ESTIMATE_BLIP2_TEST_SUPPORT_H_
