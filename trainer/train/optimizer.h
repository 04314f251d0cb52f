// Optimizers the trainer runs, behind one small interface so memory accounting sees every state tensor.
#ifndef LLMCTL_TRAINER_TRAIN_OPTIMIZER_H_
#define LLMCTL_TRAINER_TRAIN_OPTIMIZER_H_

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace llmctl::trainer {

struct OptimizerOptions {
  std::string name = "adamw";  // adamw | adamw_8bit | sgd
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;  // sgd
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update to every parameter that has a gradient, at learning rate `lr`.
  virtual void Step(double lr) = 0;
  // Every tensor the optimizer keeps (created lazily at the first step, as PyTorch's optimizers do).
  virtual std::vector<torch::Tensor> StateTensors() const = 0;
  // Named state for checkpoints: "<param index>.<field>" -> tensor.
  virtual std::vector<std::pair<std::string, torch::Tensor>> NamedState() const = 0;
  virtual Status LoadNamedState(const std::vector<std::pair<std::string, torch::Tensor>>& state) = 0;
  virtual int64_t steps_taken() const = 0;
};

// `params` are the trainable parameters (requires_grad), in a fixed order.
StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerOptions& options,
                                                   std::vector<torch::Tensor> params);

// Clips the global L2 norm of the gradients to `max_norm`; returns the norm before clipping.
double ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_OPTIMIZER_H_
