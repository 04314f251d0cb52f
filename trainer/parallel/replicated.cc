#include "trainer/parallel/replicated.h"

#include <map>

#include "trainer/train/optimizer.h"

namespace llmctl::trainer {

StatusOr<ModelTensors> ReplicatedParallelism::PrepareModel(TrainedModel& model, torch::Dtype) {
  ModelTensors tensors;
  for (auto& [name, tensor] : ModelState(model.module())) tensors.state.push_back(tensor);
  for (const torch::Tensor& p : model.module().parameters()) {
    if (p.requires_grad()) tensors.trainable.push_back(p);
  }
  return tensors;
}

Status ReplicatedParallelism::LoadCheckpoint(const std::string& dir, TrainedModel& model,
                                       LoadedCheckpoint& checkpoint) {
  torch::NoGradGuard no_grad;
  const std::map<std::string, torch::Tensor> saved(checkpoint.model.begin(),
                                                   checkpoint.model.end());
  for (auto& [name, tensor] : ModelState(model.module())) {
    auto it = saved.find(name);
    if (it == saved.end() || !it->second.sizes().equals(tensor.sizes())) {
      return DataLossError(
          dir + "/model.safetensors: tensor '" + name +
          "' is missing or has another shape (a checkpoint of a different model?)");
    }
    tensor.copy_(it->second);
  }
  return Status::Ok();
}

StatusOr<bool> ReplicatedParallelism::SaveCheckpoint(const std::string& dir, TrainedModel& model,
                                               const NamedTensors& optimizer,
                                               const TrainingState& state) {
  if (rank() != 0) return false;
  RETURN_IF_ERROR(trainer::SaveCheckpoint(dir, ModelState(model.module()), optimizer, state));
  return true;
}

StatusOr<double> ReplicatedParallelism::ClipGradNorm(const std::vector<torch::Tensor>& trainable,
                                               double max_norm) {
  return trainer::ClipGradNorm(trainable, max_norm);
}

StatusOr<StepAgreement> SingleProcess::BeginStep(int64_t label_tokens, StopRequest asked) {
  return StepAgreement{.stop = asked, .label_tokens = label_tokens, .gradient_scale = 1.0};
}

}  // namespace llmctl::trainer
