// The reference trial's steps among `llm-train --probe`'s rounds (rate_probe.cc): the trial of
// common/estimate/reference_step.h trained as TrialRun trains one, timed beside the rates that
// calibrate it. Internal to trainer/train/: not part of its API.
#ifndef LLMCTL_TRAINER_TRAIN_REFERENCE_STEPS_H_
#define LLMCTL_TRAINER_TRAIN_REFERENCE_STEPS_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/estimate/rate_probe.h"
#include "common/estimate/reference_step.h"
#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/train/optimizer.h"
#include "trainer/train/probe_rounds.h"
#include "trainer/train/trained_model.h"

namespace llmctl::trainer {

// The reference trial of one matmul class (common/estimate/reference_step.h) on the CPU, built
// once; each Step() trains one step as TrialRun does: every micro-batch's loss (full rows of random
// tokens) and backward, the clip and the optimizer's update.
class ReferenceTrainer {
 public:
  static StatusOr<std::unique_ptr<ReferenceTrainer>> Make(estimate::MatmulClass matmul_class);

  // With `new_lengths`, step k's micro-batches run at kReferenceTokens -/+ d, d = 1 + k mod
  // kReferenceLengthSpread: shapes no recent step had. Without, every micro-batch runs at
  // kReferenceTokens, a shape every step since the first had (the same tokens a step).
  void Step(bool new_lengths);

 private:
  ReferenceTrainer() = default;

  TrialConfig config_;
  ModelConfig model_ = estimate::ReferenceModel();
  std::unique_ptr<TrainedModel> trained_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<Optimizer> optimizer_;
  bool chunked_ = false;
  int64_t new_length_steps_ = 0;
};

// Both classes' reference steps among the rounds (a CPU's; none on a GPU: rate_probe.h), so each is
// the median over the same seconds the rates are: a machine whose speed drifts while the probe
// runs slows both alike, and their ratio, the node's factor, keeps. Returns the trainers, which the
// caller keeps until the rounds have run.
StatusOr<std::vector<std::unique_ptr<ReferenceTrainer>>> AddReferenceSteps(
    ProbeRounds& rounds, estimate::RateProbe& probe);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_REFERENCE_STEPS_H_
