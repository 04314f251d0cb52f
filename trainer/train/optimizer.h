// Optimizers the trainer runs, behind one small interface so memory accounting sees every state
// tensor.
#ifndef LLMCTL_TRAINER_TRAIN_OPTIMIZER_H_
#define LLMCTL_TRAINER_TRAIN_OPTIMIZER_H_

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/flat_layout.h"
#include "common/status.h"
#include "common/trial_settings.h"

namespace llmctl::trainer {

struct OptimizerOptions {
  std::string name = "adamw";  // adamw | adamw_8bit | sgd
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;  // sgd
  // adamw only: fp32 master weights, moments and gradients in host memory, the update on the host
  // (trainer/train/offload.h).
  bool offload = false;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update to every parameter that has a gradient, at learning rate `lr`.
  virtual void Step(double lr) = 0;
  // The same step one parameter at a time, for the optimizer in backward: BeginStep(lr), before
  // backward, counts the step and fixes its learning rate; then StepParameter(i), from parameter
  // i's post-accumulate-grad hook, applies that step's update to parameter i alone (`i` indexes the
  // `params` given to MakeOptimizer; a parameter without a gradient is left alone) and leaves the
  // gradient for the caller to free. Step(lr) gives the same result as BeginStep(lr) and then
  // StepParameter for every parameter. Every optimizer implements both.
  virtual void BeginStep(double lr) = 0;
  virtual void StepParameter(size_t index) = 0;
  // Every tensor the optimizer keeps (created lazily at the first step, as PyTorch's optimizers
  // do).
  virtual std::vector<torch::Tensor> StateTensors() const = 0;
  // Named state for checkpoints: "<param index>.<field>" -> tensor.
  virtual std::vector<std::pair<std::string, torch::Tensor>> NamedState() const = 0;
  virtual Status LoadNamedState(
      const std::vector<std::pair<std::string, torch::Tensor>>& state) = 0;
  virtual int64_t steps_taken() const = 0;
};

// A trial's optimizer keys (optimizer, train.lr, betas, eps, weight_decay, momentum, offload).
OptimizerOptions OptimizerOptionsOf(const TrialSettings& settings);

// `params` are the trainable parameters (requires_grad), in a fixed order. `layouts`, when given,
// says what each of them is made of: fsdp's flat shards hold pieces of several model parameters and
// padding (common/flat_layout.h). 8-bit AdamW, whose state depends on the parameter (its blocks and
// its small-tensor rule), keeps that state per piece, as one process keeps it per parameter; the
// elementwise optimizers need no layout. Empty: each tensor is one whole parameter.
StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(
    const OptimizerOptions& options, std::vector<torch::Tensor> params,
    const std::vector<std::vector<ShardPiece>>& layouts = {});

// Calls `hook(param)` each time autograd has accumulated a gradient into param.grad(), as
// torch.Tensor.register_post_accumulate_grad_hook does; the hook may free the gradient. A tensor
// has one such hook: setting another replaces it, and an empty `hook` removes it.
void SetPostAccumulateGradHook(const torch::Tensor& param,
                               std::function<void(const torch::Tensor&)> hook);

// For LoadNamedState: copies state[name] into `target` (a live state tensor), which must exist with
// target's shape and be floating-point exactly when target is; DataLoss naming the entry otherwise.
Status CopyNamedState(const std::map<std::string, torch::Tensor>& state, const std::string& name,
                      torch::Tensor& target);

// For LoadNamedState: restores the shared step counter from state["step"] into `step` and returns
// the number of steps taken.
StatusOr<int64_t> LoadStepCounter(const std::map<std::string, torch::Tensor>& state,
                                  torch::Tensor& step);

// Clips the global L2 norm of the gradients to `max_norm`; returns the norm before clipping.
double ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_OPTIMIZER_H_
