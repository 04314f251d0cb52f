// A trial's peak memory before it runs: the model state (model_state.h) plus what a training step
// adds on top of it, the activations the forward keeps for backward, the loss' logits and the
// backward's and optimizer step's temporaries, from the trial's config and the model's shapes
// alone. No LibTorch: the CLI (`llmctl estimate`) and the controller use it.
//
// The activations are traced, not guessed: llama_trace.h walks llm-train's own forward
// (trainer/model/llama.cc, projection.cc, loss.cc) op by op and keeps every tensor that autograd
// saves for backward under PyTorch's rule (an op saves an input only when the gradient it computes
// needs it, e.g. a linear layer keeps its input only when its weight is trained), deduplicated by
// storage as the accounting counts them. So LoRA's frozen weights, a frozen embedding, autocast's
// bf16 copies and activation checkpointing change the saved set the way they change the trainer's.
// The peak is then the highest of a few moments of the step, each the bytes alive then:
//   forward  at the loss: everything saved + the logits (and their fp32 copy) + log-softmax;
//   backward at its start: saved + the loss' gradients (B x T x V fp32 twice), and layer by layer
//            as gradients appear and activations are freed, up to the embedding's gradient;
//   optimizer step: params + grads + optimizer state + the step's own temporaries.
// Sequences are assumed full: every micro-batch holds micro_batch_size x data.max_seq_length
// tokens (the trainer pads to the longest row of a micro-batch, so a run on shorter examples peaks
// lower). One rank's figures, as in ModelStateEstimate; fsdp's gathered units are added to the
// model state while a unit is gathered.
#ifndef LLMCTL_COMMON_ESTIMATE_STEP_MEMORY_H_
#define LLMCTL_COMMON_ESTIMATE_STEP_MEMORY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/estimate/matmul_buffers.h"
#include "common/estimate/model_state.h"
#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

// One term of the estimate, for `llmctl estimate --explain`: what it is, its formula with the
// numbers in it, and its bytes.
struct EstimateTerm {
  std::string name;
  std::string formula;
  uint64_t bytes = 0;
};

struct StepMemoryEstimate {
  ModelStateEstimate state;
  int64_t tokens = 0;  // per micro-batch: micro_batch_size x data.max_seq_length
  // Saved for backward at the end of the forward (the logits' log-softmax included): a snapshot's
  // "other" after the forward.
  uint64_t activation_bytes = 0;
  // The step's highest allocated bytes, and the moment it happens ("forward", "backward",
  // "optimizer step").
  uint64_t peak_bytes = 0;
  std::string peak_phase;
  // The terms of the activations and of the peak, in the order --explain prints them.
  std::vector<EstimateTerm> terms;
};

// The step memory of `config` on `model` (the same preconditions as EstimateModelState), on a
// device whose matmul library takes `buffers` while a product runs (its node's probe's; {} where
// none measured them).
StatusOr<StepMemoryEstimate> EstimateStepMemory(const TrialConfig& config, const ModelConfig& model,
                                                const MatmulBuffers& buffers);

// The largest micro-batch whose predicted peak fits `device_bytes`, the search the labs make
// students do by hand, and how it reaches the trial's global batch.
struct MicroBatchFit {
  int64_t micro_batch_size = 0;  // 0: not even one example fits
  uint64_t peak_bytes = 0;       // the predicted peak at micro_batch_size (at 1 when none fits)
  uint64_t next_peak_bytes = 0;  // at one more example, which does not fit
  // The trial's train.global_batch_size as micro_batch x accumulation x ranks: the largest
  // micro-batch that fits and divides it (0 when none does).
  int64_t global_micro_batch_size = 0;
  int64_t accumulation = 0;
};

inline constexpr int64_t kMaxFitMicroBatch = 1 << 16;

// Searches micro-batches 1 to kMaxFitMicroBatch (the peak grows with the micro-batch). A
// micro-batch below the global batch accumulates, so it is estimated with accumulation.
StatusOr<MicroBatchFit> FitMicroBatch(const TrialConfig& config, const ModelConfig& model,
                                      uint64_t device_bytes, const MatmulBuffers& buffers);

// The same search for any model: `peak_of` gives the peak of `config` with train.micro_batch_size
// and train.global_batch_size set; `world_size` is the trial's ranks.
using PeakOf = std::function<StatusOr<uint64_t>(const TrialConfig&)>;
StatusOr<MicroBatchFit> FitMicroBatchWith(const TrialConfig& config, int64_t world_size,
                                          uint64_t device_bytes, const PeakOf& peak_of);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_STEP_MEMORY_H_
