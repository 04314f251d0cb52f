// What strategies ddp and fsdp share: the c10d process group on the device's backend (Gloo for cpu,
// NCCL for cuda, each rank on its own GPU) and the float64 slots the ranks' sums are reduced in.
#ifndef LLMCTL_TRAINER_PARALLEL_RANK_GROUP_H_
#define LLMCTL_TRAINER_PARALLEL_RANK_GROUP_H_

#include <torch/torch.h>

#include <vector>

#include "common/status.h"
#include "trainer/dist/process_group.h"
#include "trainer/dist/rank_env.h"
#include "trainer/dist/rank_sums.h"
#include "trainer/parallel/parallelism.h"

namespace llmctl::trainer {

class RankGroup {
 public:
  // Joins the process group `env` describes, on `device`'s backend.
  static StatusOr<RankGroup> Join(const dist::RankEnv& env, torch::Device device);

  int rank() const { return group_.rank(); }
  int world_size() const { return group_.world_size(); }
  dist::ProcessGroup& group() { return group_; }

  // How many numbers Sum takes at most.
  static constexpr int64_t kMaxSummedValues = dist::RankSums::kMaxValues;
  // The element-wise sum over the ranks of at most kMaxSummedValues numbers (token counts, loss
  // sums, squared norms).
  StatusOr<std::vector<double>> Sum(const std::vector<double>& values) {
    return sums_.Sum(group_, values);
  }
  // Parallelism::BeginStep for ranks that decide together: the label tokens summed, a stop if any
  // rank was asked (with a checkpoint if any asked for one), the gradients scaled by the world size
  // that their average divides by again.
  StatusOr<StepAgreement> AgreeOnStep(int64_t label_tokens, StopRequest asked);

  // The sums' slots: communication memory, which each strategy counts with its buffers.
  const torch::Tensor& sum_slots() const { return sums_.slots(); }

 private:
  RankGroup(dist::ProcessGroup group, torch::Device device)
      : group_(std::move(group)), sums_(device) {}

  dist::ProcessGroup group_;
  dist::RankSums sums_;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_PARALLEL_RANK_GROUP_H_
