// The ranks a trial runs on: one process, or strategy ddp's or fsdp's process group. What the
// trainer asks of either strategy alike (rank, world size, sums over the ranks, the buffers memory
// accounting names) is answered here, so the training loop holds no strategy switch of its own.
#ifndef LLMCTL_TRAINER_TRAIN_RANKS_H_
#define LLMCTL_TRAINER_TRAIN_RANKS_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/dist/rank_env.h"
#include "trainer/train/ddp.h"
#include "trainer/train/fsdp.h"

namespace llmctl::trainer {

class Ranks {
 public:
  // One process: rank 0 of 1.
  Ranks() = default;

  // Joins the process group `env` describes when the trial has strategy ddp or fsdp over more than
  // one device (one rank per device, nodes x devices in all); otherwise one process. Fails, saying
  // how to start the ranks, when such a trial has no rank environment.
  static StatusOr<Ranks> Join(const TrialConfig& config, const std::optional<dist::RankEnv>& env,
                              torch::Device device);

  DataParallel* ddp() const { return ddp_.get(); }                // null unless strategy ddp
  FullyShardedDataParallel* fsdp() const { return fsdp_.get(); }  // null unless strategy fsdp
  bool distributed() const { return ddp_ || fsdp_; }
  int rank() const;
  int64_t world_size() const;

  // The element-wise sum of `values` over the ranks; throws std::runtime_error on a failed
  // collective (the training loop's way to fail a step).
  std::vector<double> SumAcrossRanks(const std::vector<double>& values);

  // Memory accounting's "comm buckets" and "gathered params" (empty for one process).
  std::vector<torch::Tensor> CommTensors() const;
  std::vector<torch::Tensor> GatheredTensors() const;

 private:
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<FullyShardedDataParallel> fsdp_;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_RANKS_H_
