#include "common/estimate/reference_step.h"

#include <string>
#include <utility>

namespace llmctl::estimate {

ModelConfig ReferenceModel() {
  ModelConfig m;
  m.vocab_size = 4096;
  m.hidden_size = 512;
  m.intermediate_size = 1408;
  m.num_hidden_layers = 2;
  m.num_attention_heads = 8;
  m.num_key_value_heads = 8;
  m.head_dim = 64;
  m.max_position_embeddings = 2 * kReferenceTokens;
  m.rms_norm_eps = 1e-5;
  return m;
}

StatusOr<TrialConfig> ReferenceTrial(MatmulClass c) {
  TrialConfig config;
  // Neither path is read: the probe builds ReferenceModel and draws its tokens itself.
  const std::string tokens = std::to_string(kReferenceTokens);
  for (const auto& [key, value] : std::initializer_list<std::pair<const char*, std::string>>{
           {"model", "reference"},
           {"init", "random"},
           {"data.path", "reference.jsonl"},
           {"data.max_seq_length", tokens},
           {"train.micro_batch_size", "2"},
           {"train.global_batch_size", "4"},
           {"optimizer", "adamw"},
           {"device", "cpu"},
           {"precision", c == MatmulClass::kBf16 ? "bf16-true" : "32-true"}}) {
    const Status set = config.SetFromText(key, value);
    if (!set.ok()) return InternalError(std::string("reference trial: ") + set.message());
  }
  return config;
}

}  // namespace llmctl::estimate
