#include "trainer/parallel/rank_group.h"

#include <utility>

namespace llmctl::trainer {

StatusOr<RankGroup> RankGroup::Join(const dist::RankEnv& env, torch::Device device) {
  dist::ProcessGroupOptions options;
  options.backend = device.is_cuda() ? dist::BackendKind::kNccl : dist::BackendKind::kGloo;
  options.cuda_device = device.is_cuda() ? device.index() : 0;
  ASSIGN_OR_RETURN(dist::ProcessGroup group, dist::ProcessGroup::Create(env, options));
  return RankGroup(std::move(group), device);
}

StatusOr<StepAgreement> RankGroup::AgreeOnStep(int64_t label_tokens, StopRequest asked) {
  // A signal reaches the ranks at different points of a step (or only one of them), and a rank
  // stopping alone would leave the others in the step's next collective while it runs the stop's
  // (a checkpoint is a collective too). So the stop is decided in the same sum as the tokens: a
  // rank asked to stop adds 1, or kCheckpointStop when asked for a checkpoint.
  constexpr double kCheckpointStop = 1 << 20;
  const double stop = asked == StopRequest::kNone   ? 0.0
                      : asked == StopRequest::kStop ? 1.0
                                                    : kCheckpointStop;
  ASSIGN_OR_RETURN(const std::vector<double> sums, Sum({static_cast<double>(label_tokens), stop}));
  StepAgreement agreement;
  if (sums.at(1) >= kCheckpointStop) {
    agreement.stop = StopRequest::kStopWithCheckpoint;
  } else if (sums.at(1) > 0) {
    agreement.stop = StopRequest::kStop;
  }
  agreement.label_tokens = static_cast<int64_t>(sums.at(0));
  agreement.gradient_scale = static_cast<double>(world_size());
  return agreement;
}

}  // namespace llmctl::trainer
