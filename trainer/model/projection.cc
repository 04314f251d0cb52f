#include "trainer/model/projection.h"

#include <cmath>
#include <string>
#include <utility>

#include "trainer/kernels/linear.h"

namespace llmctl::trainer {

ProjectionImpl::ProjectionImpl(int64_t in_features, int64_t out_features, bool bias,
                               const std::optional<Nf4Options>& nf4)
    : in_features_(in_features),
      out_features_(out_features),
      dtype_(torch::typeMetaToScalarType(torch::get_default_dtype())) {
  if (nf4) {
    nf4_ = EmptyNf4({out_features, in_features}, nf4->double_quant, torch::kCPU);
    compute_dtype_ = nf4->compute_dtype;
    register_buffer("nf4_packed", nf4_->packed);
    if (nf4_->double_quant) {
      register_buffer("nf4_quantized_absmax", nf4_->quantized_absmax);
      register_buffer("nf4_nested_absmax", nf4_->nested_absmax);
      register_buffer("nf4_offset", nf4_->offset);
    } else {
      register_buffer("nf4_absmax", nf4_->absmax);
    }
  } else {
    weight_ = register_parameter("weight", torch::empty({out_features, in_features}));
  }
  if (bias) bias_ = register_parameter("bias", torch::empty({out_features}));
}

ProjectionImpl::ProjectionImpl(torch::Tensor shared_weight)
    : in_features_(shared_weight.size(1)),
      out_features_(shared_weight.size(0)),
      dtype_(shared_weight.scalar_type()),
      weight_(std::move(shared_weight)) {}

torch::Device ProjectionImpl::device() const {
  return nf4_ ? nf4_->packed.device() : weight_.device();
}

torch::Tensor ProjectionImpl::Base(const torch::Tensor& x) const {
  if (!nf4_) return Linear(x, weight_, bias_);
  torch::Tensor y = Nf4Linear(x, *nf4_, compute_dtype_);  // (N..., O) in the compute dtype
  if (bias_.defined()) y = y + bias_.to(compute_dtype_);
  return y.to(x.scalar_type());
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
  // Drawn in float32 whatever the run's dtype, so a seed gives the same adapter in every precision.
  torch::nn::Linear a(torch::nn::LinearOptions(in_features_, options.r).bias(false));
  torch::nn::Linear b(torch::nn::LinearOptions(options.r, out_features_).bias(false));
  torch::nn::init::kaiming_uniform_(a->weight, std::sqrt(5.0));
  b->weight.zero_();
  a->to(device(), dtype_);
  b->to(device(), dtype_);
  lora_A = register_module("lora_A", a);
  lora_B = register_module("lora_B", b);
  lora_ = options;
}

torch::Tensor ProjectionImpl::MergedDelta() const {
  const double scaling = lora_->alpha / static_cast<double>(lora_->r);
  auto delta =
      torch::matmul(lora_B->weight.to(torch::kFloat32), lora_A->weight.to(torch::kFloat32));
  return (delta * scaling).to(dtype_);  // (O, I)
}

torch::Tensor ProjectionImpl::EmptyDenseWeight() const {
  return torch::empty({out_features_, in_features_},
                      torch::TensorOptions().dtype(dtype_).device(device()));
}

void ProjectionImpl::SetBaseWeight(const torch::Tensor& weight) {
  TORCH_CHECK(
      weight.dim() == 2 && weight.size(0) == out_features_ && weight.size(1) == in_features_,
      "SetBaseWeight: expected (", out_features_, ", ", in_features_, "), got ", weight.sizes());
  torch::NoGradGuard no_grad;
  if (!nf4_) {
    weight_.copy_(weight);
    return;
  }
  // Quantised on the buffers' device from the weight in the parameters' dtype, as Params4bit
  // quantises the weight from_pretrained loaded in torch_dtype.
  CopyNf4(QuantizeNf4(weight.to(device(), dtype_), nf4_->double_quant, nf4_->blocksize), *nf4_);
}

torch::Tensor ProjectionImpl::DenseWeight() const {
  return nf4_ ? DequantizeNf4(*nf4_, dtype_) : weight_;
}

std::vector<torch::Tensor> ProjectionImpl::ForwardParameters() const {
  std::vector<torch::Tensor> tensors;
  for (const torch::Tensor& t : {weight_, bias_}) {
    if (t.defined()) tensors.push_back(t);
  }
  if (has_adapter()) tensors.insert(tensors.end(), {lora_A->weight, lora_B->weight});
  return tensors;
}

torch::Tensor ProjectionImpl::PlainWeight() const {
  if (nf4_ || bias_.defined() || has_adapter()) return torch::Tensor();
  return weight_;
}

std::vector<std::pair<std::string, Projection>> NamedProjections(torch::nn::Module& module) {
  std::vector<std::pair<std::string, Projection>> projections;
  for (const auto& item : module.named_modules()) {
    if (auto projection = std::dynamic_pointer_cast<ProjectionImpl>(item.value())) {
      projections.emplace_back(item.key(), Projection(projection));
    }
  }
  return projections;
}

}  // namespace llmctl::trainer
