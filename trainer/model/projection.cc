#include "trainer/model/projection.h"

#include <cmath>
#include <utility>

namespace llmctl::trainer {

ProjectionImpl::ProjectionImpl(int64_t in_features, int64_t out_features, bool bias) {
  // Values come from InitializeRandom or a checkpoint; empty() allocates in the default dtype,
  // which BuildModel sets to the run's dtype.
  weight_ = register_parameter("weight", torch::empty({out_features, in_features}));
  if (bias) bias_ = register_parameter("bias", torch::empty({out_features}));
}

ProjectionImpl::ProjectionImpl(torch::Tensor shared_weight) : weight_(std::move(shared_weight)) {}

torch::Tensor ProjectionImpl::Base(const torch::Tensor& x) const {
  return torch::nn::functional::linear(x, weight_, bias_);
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) {
  torch::Tensor y = Base(x);  // (N..., O)
  if (!lora_) return y;
  torch::Tensor adapter_input = x;
  if (lora_->dropout > 0.0) adapter_input = torch::dropout(x, lora_->dropout, is_training());
  return y + lora_B(lora_A(adapter_input)) * (lora_->alpha / static_cast<double>(lora_->r));
}

void ProjectionImpl::AddAdapter(const LoraOptions& options) {
  torch::NoGradGuard no_grad;
  const int64_t in_features = weight_.size(1);
  const int64_t out_features = weight_.size(0);
  // Drawn in float32 whatever the run's dtype, so a seed gives the same adapter in every precision.
  torch::nn::Linear a(torch::nn::LinearOptions(in_features, options.r).bias(false));
  torch::nn::Linear b(torch::nn::LinearOptions(options.r, out_features).bias(false));
  torch::nn::init::kaiming_uniform_(a->weight, std::sqrt(5.0));
  b->weight.zero_();
  a->to(weight_.device(), weight_.scalar_type());
  b->to(weight_.device(), weight_.scalar_type());
  lora_A = register_module("lora_A", a);
  lora_B = register_module("lora_B", b);
  lora_ = options;
}

torch::Tensor ProjectionImpl::MergedDelta() const {
  const double scaling = lora_->alpha / static_cast<double>(lora_->r);
  auto delta =
      torch::matmul(lora_B->weight.to(torch::kFloat32), lora_A->weight.to(torch::kFloat32));
  return (delta * scaling).to(weight_.scalar_type());  // (O, I)
}

}  // namespace llmctl::trainer
