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
#ifndef LLMCTL_TRAINER_TRAIN_DDP_H_
#define LLMCTL_TRAINER_TRAIN_DDP_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/dist/process_group.h"
#include "trainer/dist/rank_env.h"
#include "trainer/dist/rank_sums.h"

namespace llmctl::trainer {

class DataParallel {
 public:
  // Joins the process group `env` describes on `device`'s backend: Gloo for cpu, NCCL for cuda.
  static StatusOr<std::unique_ptr<DataParallel>> Join(const dist::RankEnv& env,
                                                      torch::Device device);

  int rank() const { return group_.rank(); }
  int world_size() const { return group_.world_size(); }

  // Makes every rank's `tensors` (parameters and buffers) rank 0's, in place.
  Status BroadcastFromRankZero(const std::vector<torch::Tensor>& tensors);

  // Lays `params` (the trainable parameters, in model order) out in buckets of about
  // `bucket_bytes` and registers the gradient hooks. Once, before the first backward.
  void Attach(const std::vector<torch::Tensor>& params, uint64_t bucket_bytes);

  // Whether the coming backward is the step's last: only then do the hooks all-reduce.
  void SetSync(bool sync) { sync_ = sync; }

  // After the step's last backward: starts the buckets no hook started (a rank whose last
  // micro-batch had no label tokens ran no backward), waits for all of them, and writes the
  // averaged gradients back into the parameters' .grad.
  Status FinishGradients();

  // How many numbers SumAcrossRanks takes at most.
  static constexpr int64_t kMaxSummedValues = dist::RankSums::kMaxValues;

  // The element-wise sum over the ranks of at most kMaxSummedValues numbers (token counts, loss
  // sums).
  StatusOr<std::vector<double>> SumAcrossRanks(const std::vector<double>& values);

  // The flat bucket tensors and the sums' slots, for memory accounting.
  std::vector<torch::Tensor> CommTensors() const;

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params_, in the order they fill the bucket
    std::vector<int64_t> offsets;  // each one's first element in the flat tensor
    size_t pending = 0;            // gradients not yet ready in this step
    std::optional<dist::PendingAllReduce> work;
  };

  DataParallel(dist::ProcessGroup group, torch::Device device)
      : group_(std::move(group)), device_(device), sums_(device) {}
  void OnGradientReady(size_t param);
  // Starts every bucket from next_bucket_ on whose gradients are all ready, in bucket order: every
  // rank must issue the collectives in the same order.
  void StartReadyBuckets(bool all);
  torch::Tensor View(size_t bucket, size_t slot);

  dist::ProcessGroup group_;
  torch::Device device_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> bucket_tensors_;
  dist::RankSums sums_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // params_ index → bucket
  size_t next_bucket_ = 0;
  bool sync_ = true;
  Status error_;  // the first failure inside a hook, reported by FinishGradients
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_DDP_H_
