// The strategies whose every rank holds the whole model: one process, and strategy ddp (ddp.h).
// What they share: the model's own tensors are the rank's state, its trainable parameters what the
// optimizer steps, rank 0 writes the checkpoint of the whole model that every rank resumes from,
// and the gradient norm is the rank's own (ddp's ranks hold the same averaged gradients).
#ifndef LLMCTL_TRAINER_PARALLEL_REPLICATED_H_
#define LLMCTL_TRAINER_PARALLEL_REPLICATED_H_

#include <torch/torch.h>

#include <string>
#include <vector>

#include "trainer/parallel/parallelism.h"

namespace llmctl::trainer {

class ReplicatedParallelism : public Parallelism {
 public:
  // The model's parameters and buffers (a QLoRA model's NF4 base weights) as state, as a
  // checkpoint holds them; its parameters that require grad as trainable.
  StatusOr<ModelTensors> PrepareModel(TrainedModel& model, torch::Dtype compute_dtype) override;
  Status LoadCheckpoint(const std::string& dir, TrainedModel& model,
                        LoadedCheckpoint& checkpoint) override;
  // Every rank holds the same weights and optimizer state: rank 0's checkpoint is the job's.
  StatusOr<bool> SaveCheckpoint(const std::string& dir, TrainedModel& model,
                                const NamedTensors& optimizer, const TrainingState& state) override;
  StatusOr<double> ClipGradNorm(const std::vector<torch::Tensor>& trainable,
                                double max_norm) override;
  StatusOr<NamedTensors> FullModelState(TrainedModel& model) override {
    return ModelState(model.module());
  }

  Status BeforeForward() override { return Status::Ok(); }
  bool BackwardWithoutLabels() const override { return false; }
  Status AfterBackward() override { return Status::Ok(); }
  std::vector<torch::Tensor> GatheredTensors() const override { return {}; }
};

// One process: rank 0 of 1, with nothing to agree on and nothing to communicate.
class SingleProcess final : public ReplicatedParallelism {
 public:
  int rank() const override { return 0; }
  int64_t world_size() const override { return 1; }
  Status BeginTraining(const ModelTensors&) override { return Status::Ok(); }
  StatusOr<StepAgreement> BeginStep(int64_t label_tokens, StopRequest asked) override;
  // Nothing waits for it: a stop ends the step before the next micro-batch.
  bool StopsBetweenMicroBatches() const override { return true; }
  void BeforeBackward(bool) override {}
  Status FinishGradients() override { return Status::Ok(); }
  StatusOr<std::vector<double>> SumAcrossRanks(const std::vector<double>& values) override {
    return values;
  }
  std::vector<torch::Tensor> CommTensors() const override { return {}; }
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_PARALLEL_REPLICATED_H_
