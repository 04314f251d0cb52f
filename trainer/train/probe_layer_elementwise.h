// The rate probe's cell of a decoder layer's element-wise ops (rate_probe.cc), added to the
// probe's rounds. Internal to trainer/train/: not part of its API.
#ifndef LLMCTL_TRAINER_TRAIN_PROBE_LAYER_ELEMENTWISE_H_
#define LLMCTL_TRAINER_TRAIN_PROBE_LAYER_ELEMENTWISE_H_

#include "common/estimate/rate_probe.h"
#include "trainer/train/probe_rounds.h"

namespace llmctl::trainer {

// One decoder layer of the reference model (reference_step.h) through its element-wise ops alone,
// forward and backward, as trainer/model/llama.cc runs them: both norms, RoPE on q and k, the
// attention output's layout copy, the residual adds and SwiGLU, from leaves standing for the
// projections' and attention's outputs (the GEMMs and SDPA have cells of their own). At each of
// estimate::kProbeLayerTokens, by the dtypes of 32-true, bf16-true and autocast and by kernels
// (estimate::ProbedLayerElementwise). A CPU's.
void AddLayerElementwise(ProbeRounds& rounds, estimate::RateProbe& probe);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_PROBE_LAYER_ELEMENTWISE_H_
