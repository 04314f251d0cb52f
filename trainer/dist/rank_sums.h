// The element-wise sum over the ranks of a few float64 numbers (token counts, loss sums, squared
// gradient norms), for data-parallel strategies.
//
// The numbers are reduced in slots allocated once and kept for the run, because a collective's
// worker thread (Gloo's, NCCL's) drops its reference to the tensor it reduced some time after
// wait() returns: a temporary would stay allocated for an unpredictable while and show up in the
// memory accounting as activations (a CI run once saw 8 such bytes). The slots are communication
// memory: strategies count slots() with their buffers.
#ifndef LLMCTL_TRAINER_DIST_RANK_SUMS_H_
#define LLMCTL_TRAINER_DIST_RANK_SUMS_H_

#include <torch/torch.h>

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "trainer/dist/process_group.h"

namespace llmctl::dist {

class RankSums {
 public:
  // How many numbers one Sum takes at most.
  static constexpr int64_t kMaxValues = 2;

  explicit RankSums(torch::Device device);

  // Every rank's `values` added element-wise over `group`; at most kMaxValues of them.
  StatusOr<std::vector<double>> Sum(ProcessGroup& group, const std::vector<double>& values);

  // (kMaxValues,) float64 on the device.
  const torch::Tensor& slots() const { return slots_; }

 private:
  torch::Tensor slots_;
};

}  // namespace llmctl::dist

#endif  // LLMCTL_TRAINER_DIST_RANK_SUMS_H_
