#include "trainer/train/offload.h"

#include <algorithm>
#include <map>
#include <string>

#include "trainer/memory/counting_allocator.h"

namespace llmctl::trainer {
namespace {

class OffloadedAdamW final : public Optimizer {
 public:
  OffloadedAdamW(const OptimizerOptions& options, std::vector<torch::Tensor> params)
      : options_(options), params_(std::move(params)), has_grad_(params_.size(), false) {
    torch::NoGradGuard no_grad;
    // On CPU runs the counting allocator puts these in the host pool; on CUDA they are CPU tensors.
    ScopedHostAllocations host;
    const auto fp32_host = torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCPU);
    for (const torch::Tensor& p : params_) {
      master_.push_back(torch::empty(p.sizes(), fp32_host).copy_(p));
      exp_avg_.push_back(torch::zeros(p.sizes(), fp32_host));
      exp_avg_sq_.push_back(torch::zeros(p.sizes(), fp32_host));
      // Written, not added to, by the first gradient of each step: no zeroing pass.
      grad_.push_back(torch::empty(p.sizes(), fp32_host));
    }
    step_ = torch::zeros({}, fp32_host);
    widened_ = torch::empty({kWidenedValues}, fp32_host);
    for (size_t i = 0; i < params_.size(); ++i) {
      SetPostAccumulateGradHook(params_[i],
                                [this, i](const torch::Tensor& p) { MoveGradToHost(i, p); });
    }
  }

  ~OffloadedAdamW() override {
    for (const torch::Tensor& p : params_) SetPostAccumulateGradHook(p, nullptr);
  }

  void Step(double lr) override {
    BeginStep(lr);
    for (size_t i = 0; i < params_.size(); ++i) StepParameter(i);
  }

  void BeginStep(double lr) override {
    step_.add_(1.0);
    ++steps_taken_;
    lr_ = lr;
  }

  // Updates parameter `index` from its host gradient buffer. Offload's own hook is what fills the
  // buffers, so validation keeps optimizer_in_backward (which would take the hook) away from it.
  void StepParameter(size_t index) override {
    if (!has_grad_[index]) return;
    torch::NoGradGuard no_grad;
    ScopedHostAllocations host;
    at::_fused_adamw_({master_[index]}, {grad_[index]}, {exp_avg_[index]}, {exp_avg_sq_[index]},
                      /*max_exp_avg_sqs=*/{}, {step_}, lr_, options_.beta1, options_.beta2,
                      options_.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
    params_[index].copy_(master_[index]);
    has_grad_[index] = false;
  }

  std::vector<torch::Tensor> StateTensors() const override {
    std::vector<torch::Tensor> state;
    for (const auto* tensors : {&master_, &exp_avg_, &exp_avg_sq_, &grad_}) {
      state.insert(state.end(), tensors->begin(), tensors->end());
    }
    state.push_back(step_);
    return state;
  }

  std::vector<std::pair<std::string, torch::Tensor>> NamedState() const override {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (size_t i = 0; i < params_.size(); ++i) {
      named.emplace_back(std::to_string(i) + ".master", master_[i]);
      named.emplace_back(std::to_string(i) + ".exp_avg", exp_avg_[i]);
      named.emplace_back(std::to_string(i) + ".exp_avg_sq", exp_avg_sq_[i]);
    }
    named.emplace_back("step", step_);
    return named;
  }

  Status LoadNamedState(const std::vector<std::pair<std::string, torch::Tensor>>& state) override {
    std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
    if (by_name.empty()) return Status::Ok();
    torch::NoGradGuard no_grad;
    ScopedHostAllocations host;
    for (size_t i = 0; i < params_.size(); ++i) {
      const std::string prefix = std::to_string(i);
      RETURN_IF_ERROR(CopyNamedState(by_name, prefix + ".exp_avg", exp_avg_[i]));
      RETURN_IF_ERROR(CopyNamedState(by_name, prefix + ".exp_avg_sq", exp_avg_sq_[i]));
      if (by_name.count(prefix + ".master") == 0) {
        master_[i].copy_(params_[i]);  // plain AdamW's checkpoint: the parameters are all there is
      } else {
        RETURN_IF_ERROR(CopyNamedState(by_name, prefix + ".master", master_[i]));
      }
    }
    ASSIGN_OR_RETURN(steps_taken_, LoadStepCounter(by_name, step_));
    return Status::Ok();
  }

  int64_t steps_taken() const override { return steps_taken_; }

 private:
  // Runs on the autograd engine's thread, once per backward for each parameter.
  void MoveGradToHost(size_t index, const torch::Tensor& param) {
    torch::NoGradGuard no_grad;
    ScopedHostAllocations host;  // the transfer's staging copy, if any, is host memory too
    const torch::Tensor grad = param.grad().to(torch::kCPU);
    if (has_grad_[index]) {
      AddToHostGrad(index, grad);
    } else {
      grad_[index].copy_(grad);
      has_grad_[index] = true;
    }
    param.mutable_grad() = torch::Tensor();
  }

  // grad_[index] += grad. A gradient in the run's 16-bit dtype is widened a block at a time into
  // widened_: ATen's CPU add_ would first copy all of it into a new fp32 tensor, whose pages, while
  // the heap still grows, the kernel faults in (12-05, Xeon: about 6 us a 4 KiB page; 126 MB of
  // such tensors in a cpu-lab-large step's second micro-batch); a copy_ widens as it writes.
  void AddToHostGrad(size_t index, const torch::Tensor& grad) {
    if (grad.scalar_type() == torch::kFloat32) {
      grad_[index].add_(grad);
      return;
    }
    const torch::Tensor sum = grad_[index].view(-1);
    const torch::Tensor values = grad.contiguous().view(-1);
    for (int64_t start = 0; start < sum.numel(); start += kWidenedValues) {
      const int64_t count = std::min(kWidenedValues, sum.numel() - start);
      const torch::Tensor widened = widened_.narrow(0, 0, count);
      widened.copy_(values.narrow(0, start, count));
      sum.narrow(0, start, count).add_(widened);
    }
  }

  // A block of 1 MiB: two threads' halves stay in their cores' L2 between the widening copy and
  // the add that reads it.
  static constexpr int64_t kWidenedValues = 256 << 10;

  OptimizerOptions options_;
  std::vector<torch::Tensor> params_;
  std::vector<torch::Tensor> master_;      // fp32, host
  std::vector<torch::Tensor> exp_avg_;     // fp32, host
  std::vector<torch::Tensor> exp_avg_sq_;  // fp32, host
  std::vector<torch::Tensor> grad_;        // fp32, host; valid where has_grad_
  std::vector<bool> has_grad_;
  torch::Tensor step_;  // fp32 scalar, host, read by the fused kernel
  torch::Tensor widened_;  // fp32, host: kWidenedValues, AddToHostGrad's block
  int64_t steps_taken_ = 0;
  double lr_ = 0.0;  // of the step in progress
};

}  // namespace

std::unique_ptr<Optimizer> MakeOffloadedAdamW(const OptimizerOptions& options,
                                              std::vector<torch::Tensor> params) {
  return std::make_unique<OffloadedAdamW>(options, std::move(params));
}

}  // namespace llmctl::trainer
