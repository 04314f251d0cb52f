// strategy: ddp, PyTorch DistributedDataParallel's algorithm over trainer/dist's c10d process
// group.
//
// Every rank holds the whole model and optimizer. Rank 0's initial weights are broadcast to the
// others; each rank trains on its own shard of the data (BatchOptions' rank and world_size); while
// the last backward of a step runs, each parameter's post-accumulate-grad hook marks its gradient
// ready, and a flat bucket (about ddp.bucket_size, parameters in reverse order, as backward
// produces them) is copied in and its all-reduce started as soon as all of its gradients are ready,
// so the communication overlaps the rest of backward. Earlier micro-batches of an accumulated step
// only accumulate locally (DDP's no_sync). FinishGradients waits for the buckets and copies the
// averaged gradients back before the optimizer steps.
//
// The buckets are allocated once and kept for the run (DDP's, without gradient_as_bucket_view):
// memory accounting counts them as their own category, "comm buckets", together with the float64
// slots the ranks' sums are reduced in (trainer/dist/rank_sums.h says why those are kept too).
#ifndef LLMCTL_TRAINER_PARALLEL_DDP_H_
#define LLMCTL_TRAINER_PARALLEL_DDP_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/dist/process_group.h"
#include "trainer/dist/rank_env.h"
#include "trainer/parallel/rank_group.h"
#include "trainer/parallel/replicated.h"

namespace llmctl::trainer {

class DataParallel final : public ReplicatedParallelism {
 public:
  // Joins the process group `env` describes on `device`'s backend: Gloo for cpu, NCCL for cuda.
  // Gradients travel in buckets of about `bucket_bytes` (ddp.bucket_size).
  static StatusOr<std::unique_ptr<DataParallel>> Join(const dist::RankEnv& env,
                                                      torch::Device device, uint64_t bucket_bytes);

  int rank() const override { return group_.rank(); }
  int64_t world_size() const override { return group_.world_size(); }

  // Makes every rank's state rank 0's, lays the trainable parameters (in model order) out in
  // buckets and registers the gradient hooks.
  Status BeginTraining(const ModelTensors& tensors) override;

  StatusOr<StepAgreement> BeginStep(int64_t label_tokens, StopRequest asked) override {
    return group_.AgreeOnStep(label_tokens, asked);
  }
  bool StopsBetweenMicroBatches() const override { return false; }
  // DDP's no_sync: only the step's last backward all-reduces.
  void BeforeBackward(bool last) override { sync_ = last; }
  // After the step's last backward: starts the buckets no hook started (a rank whose last
  // micro-batch had no label tokens ran no backward), waits for all of them, and writes the
  // averaged gradients back into the parameters' .grad.
  Status FinishGradients() override;

  StatusOr<std::vector<double>> SumAcrossRanks(const std::vector<double>& values) override {
    return group_.Sum(values);
  }
  // The flat bucket tensors and the sums' slots.
  std::vector<torch::Tensor> CommTensors() const override;

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params_, in the order they fill the bucket
    std::vector<int64_t> offsets;  // each one's first element in the flat tensor
    size_t pending = 0;            // gradients not yet ready in this step
    std::optional<dist::PendingCollective> work;
  };

  DataParallel(RankGroup group, uint64_t bucket_bytes)
      : group_(std::move(group)), bucket_bytes_(bucket_bytes) {}
  void Attach(const std::vector<torch::Tensor>& params);
  void OnGradientReady(size_t param);
  // Starts every bucket from next_bucket_ on whose gradients are all ready, in bucket order: every
  // rank must issue the collectives in the same order.
  void StartReadyBuckets(bool all);
  torch::Tensor View(size_t bucket, size_t slot);

  RankGroup group_;
  uint64_t bucket_bytes_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> bucket_tensors_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // params_ index → bucket
  size_t next_bucket_ = 0;
  bool sync_ = true;
  Status error_;  // the first failure inside a hook, reported by FinishGradients
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_PARALLEL_DDP_H_
