// Model-state memory of a trial before it runs: what llm-train's memory accounting
// (trainer/memory/accounting.h) will count as params, grads, optimizer state and comm buckets,
// computed from the trial's config and the model's shapes alone, to the byte. No LibTorch: the CLI
// (`llmctl estimate`) and the controller use it.
//
// The figures are one rank's, as its `snapshot` events report them after an optimizer step
// (phase3_after_opt_step), when the model state is all there: the optimizer's state exists from
// the first step on, and the gradients are held until the next step starts. Activations, the loss'
// logits, temporaries and fsdp's gathered parameters ("other" and "gathered" in a snapshot) are
// not predicted here: they depend on the micro-batch, the sequence length and the kernels.
//
// How llm-train lays the model state out, and so how each category is counted:
//   params: every model weight in the precision's parameter dtype (fp32 for 32-true, bf16-mixed and
//     16-mixed, whose fp32 parameters are the master weights; bf16 for bf16-true); with QLoRA the
//     decoder projections' weights are NF4 instead (trainer/quant: two codes per byte, a fp32
//     absmax per 64 values, or with double quantisation a uint8 code per 64 values plus a fp32
//     absmax per 256 of those and one fp32 offset); LoRA adapters A (r x in) and B (out x r) in the
//     parameter dtype. Tied embeddings count once.
//   grads: one per trainable parameter, in its dtype; none held after the step with
//     optimizer_in_backward (each is freed once applied) or offload: optimizer (each moves to the
//     host as backward produces it).
//   optimizer: AdamW two moments in the parameter dtype plus a shared fp32 step count (4 B);
//     SGD none, or with momentum one buffer per parameter; adamw_8bit per tensor of n >= 4096
//     values two uint8 codes and two fp32 absmax per 256 (2n + 8 ceil(n / 256) B), smaller tensors
//     two fp32 moments (8n B), plus the step count and two 256-entry fp32 code maps (4 + 2048 B);
//     offload: optimizer keeps fp32 master weights, both moments and a gradient buffer on the host
//     (16 B per trainable parameter + 4 B), nothing on the device.
//   comm: ddp's buckets hold every trainable gradient once (their total does not depend on
//     ddp.bucket_size), fsdp's gradient buffer is its largest unit's padded flat size (on cuda also
//     a 1 / N-size reduce-scatter output); both add the two float64 slots the ranks' sums use
//     (16 B).
//   fsdp: every decoder layer is a unit, the rest (embeddings, final norm, output head) the root
//     unit; a unit's flat parameter is zero-padded to a multiple of the world size N and each rank
//     keeps 1 / N of it, so params, grads and optimizer state are the padded shards' bytes. Under
//     adamw_8bit the trainable flats are aligned to its 256-value state blocks and its state is
//     per piece of a parameter that a shard holds, by the parameter's size (common/flat_layout.h):
//     the ranks' states differ by which pieces they hold.
#ifndef LLMCTL_COMMON_ESTIMATE_MODEL_STATE_H_
#define LLMCTL_COMMON_ESTIMATE_MODEL_STATE_H_

#include <cstdint>

#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

struct ModelStateEstimate {
  // Ranks of the trial (devices x nodes under ddp and fsdp, else 1); every byte figure is one
  // rank's: all ranks hold the same, but for 8-bit AdamW's state on fsdp shards (above).
  int64_t world_size = 1;
  // What llm-train's `start` event reports as parameters_total and parameters_trainable (NF4
  // weights count their values, not their bytes).
  int64_t parameters_total = 0;
  int64_t parameters_trainable = 0;

  uint64_t params_bytes = 0;
  uint64_t grads_bytes = 0;
  uint64_t optim_device_bytes = 0;
  uint64_t optim_host_bytes = 0;
  uint64_t comm_bytes = 0;

  // fsdp: the padded flat sizes (values) of the root unit (embeddings, final norm, output head),
  // which stays gathered from the forward until backward has passed it, and of the largest decoder
  // layer; 0 otherwise. How many layers the step holds gathered at once (prefetch,
  // fsdp.reshard_after_forward) is step_memory.cc's.
  int64_t fsdp_root_values = 0;
  int64_t fsdp_layer_values = 0;
  // The buffers those units gather besides (QLoRA's NF4 codes and scales), in bytes.
  int64_t fsdp_root_buffer_bytes = 0;
  int64_t fsdp_layer_buffer_bytes = 0;

  // params + grads + device optimizer state + comm: the training device's model state.
  uint64_t device_bytes() const {
    return params_bytes + grads_bytes + optim_device_bytes + comm_bytes;
  }
};

// The model state of `config` on `model`. `config` must be complete (every key at its effective
// value, as an experiment's trial or llm-train's --set leave it); a config llm-train would refuse
// is refused with ValidateTrialConfig's InvalidArgument message. InvalidArgument also for a model
// too large to count in 64 bits. The figures are rank `rank`'s; -1: the largest any rank holds.
StatusOr<ModelStateEstimate> EstimateModelState(const TrialConfig& config, const ModelConfig& model,
                                                int64_t rank = -1);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_MODEL_STATE_H_
