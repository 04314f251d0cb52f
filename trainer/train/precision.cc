#include "trainer/train/precision.h"

#include <ATen/autocast_mode.h>

namespace llmctl::trainer {

StatusOr<Precision> Precision::FromName(const std::string& name) {
  if (name == "32-true") return Precision{name, torch::kFloat32, std::nullopt, false};
  if (name == "bf16-true") return Precision{name, torch::kBFloat16, std::nullopt, false};
  if (name == "bf16-mixed") return Precision{name, torch::kFloat32, torch::kBFloat16, false};
  if (name == "16-mixed") return Precision{name, torch::kFloat32, torch::kFloat16, true};
  return InvalidArgumentError("precision: unknown mode '" + name +
                              "' (32-true, bf16-true, bf16-mixed, 16-mixed)");
}

AutocastScope::AutocastScope(const Precision& precision, torch::Device device)
    : device_type_(device.type()) {
  if (!precision.autocast) return;
  active_ = true;
  previous_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, *precision.autocast);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, previous_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
}

LossScaler::LossScaler(torch::Device device) : device_(device) {}

bool LossScaler::UnscaleAndCheck(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return true;
  // PyTorch's GradScaler kernel: divides every gradient and flags any non-finite value in one pass,
  // with a single host synchronisation for the flag.
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  torch::Tensor found_inf = torch::zeros({1}, options);
  at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf,
                                                 torch::full({1}, 1.0 / scale_, options));
  return found_inf.item<float>() == 0.0f;
}

void LossScaler::Update(bool grads_were_finite) {
  if (!grads_were_finite) {
    scale_ *= 0.5;
    good_steps_ = 0;
    return;
  }
  if (++good_steps_ >= 2000) {
    scale_ *= 2.0;
    good_steps_ = 0;
  }
}

}  // namespace llmctl::trainer
