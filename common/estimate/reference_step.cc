#include "common/estimate/reference_step.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

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

StatusOr<StepWork> ReferenceWork(MatmulClass c) {
  ASSIGN_OR_RETURN(const TrialConfig trial, ReferenceTrial(c));
  return EstimateStepWork(trial, ReferenceModel());
}

StatusOr<std::vector<WeightShape>> NewShapeWeights() {
  ASSIGN_OR_RETURN(const StepWork work, ReferenceWork(MatmulClass::kFp32));
  std::vector<WeightShape> weights = {{128, 128}, {256, 256}, {2048, 4096}};
  for (WeightShape w : WeightShapes(work, MatmulClass::kFp32)) {
    w.rows = 0;  // the probe's cells run at their own rows
    if (std::find(weights.begin(), weights.end(), w) == weights.end()) weights.push_back(w);
  }
  std::stable_sort(weights.begin(), weights.end(), [](const WeightShape& a, const WeightShape& b) {
    return a.values() < b.values();
  });
  return weights;
}

}  // namespace llmctl::estimate
