// The work of one optimizer step of a BLIP-2 trial (step_work.h's StepWork), from its config and
// the model's shapes alone: the image batch through the ViT (one class token and (image / patch)^2
// patches an image), the Q-Former's learned queries with cross-attention to the image every
// cross_attention_frequency layers, the language projection, and OPT (queries and caption in one
// sequence) or Flan-T5 (encoder over queries and caption, decoder over the caption).
//
// Backward runs through a part when it is trained or holds adapters, or when a part before it is
// trained: a frozen image side under a trained language model costs only its forward. Each linear
// layer's input gradient is formed when backward runs through its part, its weight's gradient when
// it is trained; checkpointing reruns the forward of the parts backward runs through. Element-wise
// traffic is counted per layer (two LayerNorms, the activation, dropout in training, the
// residuals, attention's layout copies), as for the LLaMA family.
#ifndef LLMCTL_COMMON_ESTIMATE_BLIP2_WORK_H_
#define LLMCTL_COMMON_ESTIMATE_BLIP2_WORK_H_

#include <cstdint>
#include <optional>

#include "common/blip2_config.h"
#include "common/estimate/step_work.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

// The work of one optimizer step of `config` on `model`, with captions of `caption_tokens` tokens
// (the longest of the caption set, as EstimateBlip2StepMemory takes it), else of
// data.max_seq_length (the preconditions and errors of EstimateBlip2ModelState).
StatusOr<StepWork> EstimateBlip2StepWork(const TrialConfig& config, const Blip2Config& model,
                                         std::optional<int64_t> caption_tokens = std::nullopt);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_BLIP2_WORK_H_
