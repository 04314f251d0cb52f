// BLIP-2's memory before it runs (Blip2ForConditionalGeneration: the ViT, the Q-Former with its
// learned queries, the language projection and OPT or Flan-T5), as model_state.h and step_memory.h
// give it for the LLaMA family, from the trial's config and the model's shapes alone. No LibTorch.
//
// Model state: the tensors llm-train's BLIP-2 allocates (trainer/model/blip2.cc, opt.cc, t5.cc), in
// its named_parameters() order, then counted by the same rules as the LLaMA family's
// (weight_tensors.h; model_state.h says how each category is counted). What BLIP-2 adds:
//   freeze: a frozen part (vision_model, qformer with the query tokens, language_projection,
//     language_model) keeps its weights and has no gradients and no optimizer state.
//   peft: LoRA freezes every weight, the image side's included, and adapts the language model's
//     projections by PEFT's names (OPT's q_proj, k_proj, v_proj, out_proj, fc1, fc2; T5's q, k, v,
//     o, wi_0, wi_1, wi, wo, lm_head); QLoRA holds OPT's six projections and T5's q, k, v, o, wi_0,
//     wi_1 and wi as NF4 (T5's wo and head stay dense, as transformers keeps them).
//   fsdp: a unit per block of every stack, numbered across them (the vision encoder's, the
//     Q-Former's, then OPT's or T5's encoder's and decoder's); the root unit holds the rest (the
//     embeddings, the norms, the query tokens, the projection, the head and T5's relative-position
//     biases).
#ifndef LLMCTL_COMMON_ESTIMATE_BLIP2_MEMORY_H_
#define LLMCTL_COMMON_ESTIMATE_BLIP2_MEMORY_H_

#include <cstdint>
#include <optional>

#include "common/blip2_config.h"
#include "common/estimate/model_state.h"
#include "common/estimate/step_memory.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

// The model state of `config` on `model`, rank `rank`'s (-1: the largest any rank holds).
// InvalidArgument, as llm-train refuses them, for a config ValidateTrialConfig refuses, text data,
// and peft.targets naming a projection the language model lacks.
StatusOr<ModelStateEstimate> EstimateBlip2ModelState(const TrialConfig& config,
                                                     const Blip2Config& model, int64_t rank = -1);

// The step's memory (step_memory.h's StepMemoryEstimate) of `config` on `model`: the model state
// above, the activations traced from llm-train's own forward (the image batch through the ViT and
// the Q-Former, the captions through OPT or T5; blip2_trace.h) and the peak, the highest of the
// step's moments as for the LLaMA family: the forward's (at the loss, or inside a block while it
// runs), backward's at the loss and block by block as gradients appear and activations are freed
// (a checkpointed block rerun), and the optimizer step's. The language model's micro-batch is the
// queries plus `caption_tokens`, the longest caption it holds with its BOS or EOS (the trainer pads
// a micro-batch to its longest row), at most data.max_seq_length; nullopt: data.max_seq_length, a
// full micro-batch, which any step may draw. `buffers`: what the device's GEMMs take beside the
// chunked loss' head products while they run, as the node's probe measured them ({} where none
// did), as step_memory.h's EstimateStepMemory takes them. Errors as EstimateBlip2ModelState's.
StatusOr<StepMemoryEstimate> EstimateBlip2StepMemory(const TrialConfig& config,
                                                     const Blip2Config& model,
                                                     std::optional<int64_t> caption_tokens,
                                                     const MatmulBuffers& buffers);

// --fit's search (step_memory.h's FitMicroBatchWith) over EstimateBlip2StepMemory's peaks, the
// captions and buffers as above.
StatusOr<MicroBatchFit> FitBlip2MicroBatch(const TrialConfig& config, const Blip2Config& model,
                                           std::optional<int64_t> caption_tokens,
                                           uint64_t device_bytes, const MatmulBuffers& buffers);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_BLIP2_MEMORY_H_
