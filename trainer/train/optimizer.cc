#include "trainer/train/optimizer.h"

#include <charconv>
#include <cmath>
#include <map>
#include <string_view>

#include "trainer/train/adamw_8bit.h"
#include "trainer/train/offload.h"

namespace llmctl::trainer {
namespace {

// AdamW with decoupled weight decay, through PyTorch's fused kernel (one pass over p, g, m, v per
// tensor, on CPU and CUDA). Moments have the parameter's dtype, as torch.optim.AdamW's do. The
// kernel reads the step count from a tensor; one float32 scalar shared by all parameters holds it
// (4 bytes of state in all, counted as optimizer state).
class AdamW final : public Optimizer {
 public:
  AdamW(const OptimizerOptions& options, std::vector<torch::Tensor> params)
      : options_(options), params_(std::move(params)) {}

  void Step(double lr) override {
    torch::NoGradGuard no_grad;
    BeginStep(lr);
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!params_[i].grad().defined()) continue;
      params.push_back(params_[i]);
      grads.push_back(params_[i].grad());
      exp_avgs.push_back(exp_avg_[i]);
      exp_avg_sqs.push_back(exp_avg_sq_[i]);
      steps.push_back(step_);
    }
    if (params.empty()) return;
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr_,
                      options_.beta1, options_.beta2, options_.weight_decay, options_.eps,
                      /*amsgrad=*/false, /*maximize=*/false);
  }

  void BeginStep(double lr) override {
    torch::NoGradGuard no_grad;
    Materialize();
    step_.add_(1.0);
    ++steps_taken_;
    lr_ = lr;
  }

  // The fused kernel over a one-tensor list: per element the arithmetic of Step's batched call.
  void StepParameter(size_t index) override {
    torch::NoGradGuard no_grad;
    const torch::Tensor& p = params_[index];
    if (!p.grad().defined()) return;
    at::_fused_adamw_({p}, {p.grad()}, {exp_avg_[index]}, {exp_avg_sq_[index]},
                      /*max_exp_avg_sqs=*/{}, {step_}, lr_, options_.beta1, options_.beta2,
                      options_.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }

  std::vector<torch::Tensor> StateTensors() const override {
    std::vector<torch::Tensor> state;
    if (exp_avg_.empty()) return state;
    state.insert(state.end(), exp_avg_.begin(), exp_avg_.end());
    state.insert(state.end(), exp_avg_sq_.begin(), exp_avg_sq_.end());
    state.push_back(step_);
    return state;
  }

  std::vector<std::pair<std::string, torch::Tensor>> NamedState() const override {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    if (exp_avg_.empty()) return named;
    for (size_t i = 0; i < params_.size(); ++i) {
      named.emplace_back(std::to_string(i) + ".exp_avg", exp_avg_[i]);
      named.emplace_back(std::to_string(i) + ".exp_avg_sq", exp_avg_sq_[i]);
    }
    named.emplace_back("step", step_);
    return named;
  }

  Status LoadNamedState(const std::vector<std::pair<std::string, torch::Tensor>>& state) override {
    std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
    if (by_name.empty()) return Status::Ok();
    Materialize();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      RETURN_IF_ERROR(CopyNamedState(by_name, std::to_string(i) + ".exp_avg", exp_avg_[i]));
      RETURN_IF_ERROR(CopyNamedState(by_name, std::to_string(i) + ".exp_avg_sq", exp_avg_sq_[i]));
    }
    ASSIGN_OR_RETURN(steps_taken_, LoadStepCounter(by_name, step_));
    return Status::Ok();
  }

  int64_t steps_taken() const override { return steps_taken_; }

 private:
  void Materialize() {
    if (!exp_avg_.empty()) return;
    for (const torch::Tensor& p : params_) {
      exp_avg_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
      exp_avg_sq_.push_back(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    }
    step_ = torch::zeros(
        {}, torch::TensorOptions().dtype(torch::kFloat32).device(params_.front().device()));
  }

  OptimizerOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> exp_avg_;
  std::vector<torch::Tensor> exp_avg_sq_;
  torch::Tensor step_;
  int64_t steps_taken_ = 0;
  double lr_ = 0.0;  // of the step in progress
};

// SGD; with momentum 0 it keeps no state at all (the labs' "optimizer without state" row).
class Sgd final : public Optimizer {
 public:
  Sgd(const OptimizerOptions& options, std::vector<torch::Tensor> params)
      : options_(options), params_(std::move(params)) {}

  void Step(double lr) override {
    BeginStep(lr);
    for (size_t i = 0; i < params_.size(); ++i) StepParameter(i);
  }

  void BeginStep(double lr) override {
    ++steps_taken_;
    lr_ = lr;
    if (options_.momentum != 0.0 && momentum_.empty())
      momentum_.assign(params_.size(), torch::Tensor());
  }

  void StepParameter(size_t index) override {
    torch::NoGradGuard no_grad;
    torch::Tensor& p = params_[index];
    if (!p.grad().defined()) return;
    torch::Tensor update = p.grad();
    if (options_.weight_decay != 0.0) update = update.add(p, options_.weight_decay);
    if (options_.momentum != 0.0) {
      if (!momentum_[index].defined()) {
        momentum_[index] = update.clone();
      } else {
        momentum_[index].mul_(options_.momentum).add_(update);
      }
      update = momentum_[index];
    }
    p.add_(update, -lr_);
  }

  std::vector<torch::Tensor> StateTensors() const override {
    std::vector<torch::Tensor> state;
    for (const torch::Tensor& m : momentum_) {
      if (m.defined()) state.push_back(m);
    }
    return state;
  }

  std::vector<std::pair<std::string, torch::Tensor>> NamedState() const override {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (size_t i = 0; i < momentum_.size(); ++i) {
      if (momentum_[i].defined()) named.emplace_back(std::to_string(i) + ".momentum", momentum_[i]);
    }
    return named;
  }

  Status LoadNamedState(const std::vector<std::pair<std::string, torch::Tensor>>& state) override {
    if (state.empty()) return Status::Ok();
    if (options_.momentum == 0.0)
      return DataLossError("checkpoint has SGD momentum, but momentum is 0");
    // A checkpoint may come from another node: each name is "INDEX.momentum" of a parameter, and
    // each buffer is shaped as its parameter, of a floating-point type (copied into its dtype and
    // device).
    std::vector<torch::Tensor> loaded(params_.size());
    for (const auto& [name, tensor] : state) {
      size_t index = 0;
      const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), index);
      if (error != std::errc() || std::string_view(end, name.data() + name.size()) != ".momentum" ||
          index >= params_.size()) {
        return DataLossError("optimizer state '" + name + "' is not a parameter's momentum");
      }
      const torch::Tensor& param = params_[index];
      if (!tensor.sizes().equals(param.sizes()) || !tensor.is_floating_point()) {
        return DataLossError("optimizer state '" + name +
                             "' has the wrong shape or dtype for its parameter");
      }
      torch::NoGradGuard no_grad;
      loaded[index] = tensor.to(param.device(), param.scalar_type()).clone();
    }
    momentum_ = std::move(loaded);
    return Status::Ok();
  }

  int64_t steps_taken() const override { return steps_taken_; }

 private:
  OptimizerOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> momentum_;
  int64_t steps_taken_ = 0;
  double lr_ = 0.0;  // of the step in progress
};

struct FunctionPostAccumulateGradHook final : torch::autograd::PostAccumulateGradHook {
  explicit FunctionPostAccumulateGradHook(std::function<void(const torch::Tensor&)> f)
      : hook(std::move(f)) {}
  void operator()(const torch::autograd::Variable& tensor) override { hook(tensor); }
  std::function<void(const torch::Tensor&)> hook;
};

}  // namespace

OptimizerOptions OptimizerOptionsOf(const TrialSettings& settings) {
  const TrainSettings& train = settings.train;
  OptimizerOptions options;
  options.name = Name(train.optimizer);
  options.lr = train.lr;
  options.beta1 = train.betas.at(0);
  options.beta2 = train.betas.at(1);
  options.eps = train.eps;
  options.weight_decay = train.weight_decay;
  options.momentum = train.momentum;
  options.offload = settings.memory.offload == trial::Offload::kOptimizer;
  return options;
}

StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(
    const OptimizerOptions& options, std::vector<torch::Tensor> params,
    const std::vector<std::vector<ShardPiece>>& layouts) {
  if (params.empty()) return InvalidArgumentError("the model has no trainable parameters");
  if (options.offload) {
    if (options.name != "adamw") {
      return InvalidArgumentError("offload: optimizer runs AdamW only, not '" + options.name + "'");
    }
    return MakeOffloadedAdamW(options, std::move(params));
  }
  if (options.name == "adamw")
    return std::unique_ptr<Optimizer>(new AdamW(options, std::move(params)));
  if (options.name == "adamw_8bit") {
    return MakeAdamW8bit(options, std::move(params), AdamW8bitImpl::kDefault, kAdamW8bitAtenChunk,
                         layouts);
  }
  if (options.name == "sgd") return std::unique_ptr<Optimizer>(new Sgd(options, std::move(params)));
  return InvalidArgumentError("optimizer: unknown optimizer '" + options.name +
                              "' (adamw, adamw_8bit, sgd)");
}

void SetPostAccumulateGradHook(const torch::Tensor& param,
                               std::function<void(const torch::Tensor&)> hook) {
  torch::autograd::impl::set_post_acc_grad_hooks(
      param, hook ? std::make_unique<FunctionPostAccumulateGradHook>(std::move(hook)) : nullptr);
}

Status CopyNamedState(const std::map<std::string, torch::Tensor>& state, const std::string& name,
                      torch::Tensor& target) {
  auto it = state.find(name);
  // Floating-point state converts (a bf16 run's moments into offload's fp32 ones); 8-bit codes must
  // stay codes.
  if (it == state.end() || !it->second.sizes().equals(target.sizes()) ||
      it->second.is_floating_point() != target.is_floating_point()) {
    return DataLossError("optimizer state '" + name +
                         "' is missing or has the wrong shape or dtype");
  }
  torch::NoGradGuard no_grad;
  target.copy_(it->second);
  return Status::Ok();
}

StatusOr<int64_t> LoadStepCounter(const std::map<std::string, torch::Tensor>& state,
                                  torch::Tensor& step) {
  RETURN_IF_ERROR(CopyNamedState(state, "step", step));
  // A count of steps: NaN or a fraction would reach the bias correction, and a cast of NaN or of a
  // number past int64's range is undefined.
  const double steps = step.item<double>();
  if (!(steps >= 0 && steps <= 9.0e15 && steps == std::floor(steps))) {
    return DataLossError("optimizer state 'step' must be a whole number of steps, got " +
                         std::to_string(steps));
  }
  return static_cast<int64_t>(steps);
}

double ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& p : params) {
    // An empty dimension list (all of them), spelled out: LibTorch before 2.15 also has a Dimname
    // overload, which makes a bare {} ambiguous.
    if (p.grad().defined()) {
      norms.push_back(p.grad().norm(2, torch::IntArrayRef{}, false, torch::kFloat32));
    }
  }
  if (norms.empty()) return 0.0;
  const double total = torch::stack(norms).norm().item<double>();
  const double coefficient = max_norm / (total + 1e-6);
  if (coefficient < 1.0) {
    for (const torch::Tensor& p : params) {
      if (p.grad().defined()) p.grad().mul_(coefficient);
    }
  }
  return total;
}

}  // namespace llmctl::trainer
