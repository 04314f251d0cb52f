// The model state of a model given as the list of tensors the trainer allocates for its weights and
// adapters: what model_state.cc computes for the LLaMA family and blip2_memory.cc for BLIP-2, each
// from its own list of the model's tensors.
#ifndef LLMCTL_COMMON_ESTIMATE_WEIGHT_TENSORS_H_
#define LLMCTL_COMMON_ESTIMATE_WEIGHT_TENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/estimate/model_state.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

// One tensor the trainer allocates for a model weight or adapter, in the order the model's
// named_parameters() lists them (fsdp lays its flats out in that order).
struct WeightTensor {
  int64_t numel = 0;
  int64_t unit = -1;  // fsdp's unit: the block, or -1 for the root
  bool trainable = false;
  bool nf4 = false;  // a QLoRA base weight, held as NF4 buffers
};

// Bytes per parameter element of `precision` (the trial key): 2 for bf16-true, else 4 (the mixed
// modes keep fp32 parameters).
uint64_t ParamBytes(trial::Precision precision);

// Bytes of an NF4 weight of `n` values (trainer/quant's EmptyNf4): two codes a byte and its block
// scales, fp32 or (with double quantisation) uint8 with their own fp32 scales and offset.
uint64_t Nf4Bytes(int64_t n, bool double_quant);

// The model state of `tensors` under `config` (already validated), as ModelStateEstimate says; the
// figures are rank `rank`'s, -1: the largest any rank holds.
ModelStateEstimate EstimateStateOfTensors(const TrialConfig& config,
                                          const std::vector<WeightTensor>& tensors, int64_t rank);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_WEIGHT_TENSORS_H_
