#include "trainer/dist/rank_sums.h"

#include <string>

namespace llmctl::dist {

RankSums::RankSums(torch::Device device)
    : slots_(torch::zeros({kMaxValues},
                          torch::TensorOptions().dtype(torch::kFloat64).device(device))) {}

StatusOr<std::vector<double>> RankSums::Sum(ProcessGroup& group,
                                            const std::vector<double>& values) {
  const int64_t count = static_cast<int64_t>(values.size());
  if (count > kMaxValues) {
    return InternalError("a sum over the ranks takes at most " + std::to_string(kMaxValues) +
                         " values, not " + std::to_string(count));
  }
  torch::NoGradGuard no_grad;
  torch::Tensor slots = slots_.narrow(0, 0, count);
  slots.copy_(torch::tensor(values, torch::TensorOptions().dtype(torch::kFloat64)));
  RETURN_IF_ERROR(group.AllReduce(slots, ReduceOp::kSum));
  const torch::Tensor sums = slots.cpu();
  return std::vector<double>(sums.data_ptr<double>(), sums.data_ptr<double>() + count);
}

}  // namespace llmctl::dist
