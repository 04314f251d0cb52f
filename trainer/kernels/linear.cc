#include "trainer/kernels/linear.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <algorithm>
#include <vector>

#include "common/matmul_layout.h"

namespace llmctl::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

bool CopiesRows(const torch::Tensor& weight) {
  return InputGradientCopiesRows(weight.is_cpu(), static_cast<int>(weight.element_size()));
}

// Without a bias, and with one: autograd's inputs are tensors that exist.
struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    Save(ctx, x, weight);
    return torch::linear(x, weight);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    tensor_list grads = Gradients(ctx, grad_outputs[0], /*bias=*/false);
    return {grads[0], grads[1]};
  }

  // What ATen's linear keeps: x for the weight's gradient, the weight for x's (saved variables,
  // which autograd frees once this node's backward has run).
  static void Save(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight) {
    ctx->save_for_backward({weight.requires_grad() ? x : torch::Tensor(),
                            x.requires_grad() ? weight : torch::Tensor()});
  }

  // {x's, the weight's, the bias'} gradients from dy (N..., O); undefined where not needed.
  static tensor_list Gradients(AutogradContext* ctx, const torch::Tensor& dy, bool bias) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];       // (N..., I)
    const torch::Tensor& weight = saved[1];  // (O, I)
    torch::Tensor dx, dweight, dbias;
    // x's first, as ATen's MmBackward forms them.
    if (ctx->needs_input_grad(0)) dx = InputGradient(dy, weight);
    const torch::Tensor dy_rows = dy.reshape({-1, dy.size(-1)});                          // (N, O)
    if (ctx->needs_input_grad(1)) dweight = dy_rows.t().mm(x.reshape({-1, x.size(-1)}));  // (O, I)
    if (bias && ctx->needs_input_grad(2)) dbias = dy_rows.sum(0);
    return {dx, dweight, dbias};
  }
};

struct BiasedLinearFunction : public torch::autograd::Function<BiasedLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias) {
    LinearFunction::Save(ctx, x, weight);
    return torch::linear(x, weight, bias);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    return LinearFunction::Gradients(ctx, grad_outputs[0], /*bias=*/true);
  }
};

}  // namespace

torch::Tensor InputGradient(const torch::Tensor& dy, const torch::Tensor& weight) {
  const torch::Tensor dy_rows = dy.reshape({-1, weight.size(0)});                    // (N, O)
  torch::Tensor dx = torch::empty({dy_rows.size(0), weight.size(1)}, dy.options());  // (N, I)
  InputGradientInto(dx, dy_rows, weight);
  std::vector<int64_t> sizes = dy.sizes().vec();
  sizes.back() = weight.size(1);
  return dx.view(sizes);
}

void InputGradientInto(torch::Tensor& out, const torch::Tensor& dy, const torch::Tensor& weight) {
  if (!CopiesRows(weight)) {
    torch::mm_out(out, dy, weight);
    return;
  }
  const int64_t rows = dy.size(0);
  for (int64_t start = 0; start < rows; start += kInputGradientRows) {
    const int64_t n = std::min(kInputGradientRows, rows - start);
    // (n, O) column-major: the block's transpose made contiguous, seen transposed back; freed
    // before the next block's is made.
    const torch::Tensor block = dy.narrow(0, start, n).t().contiguous().t();
    torch::Tensor out_rows = out.narrow(0, start, n);
    torch::mm_out(out_rows, block, weight);
  }
}

torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  if (!weight.is_cpu()) return torch::linear(x, weight, bias);
  if (at::autocast::is_autocast_enabled(at::kCPU) && at::autocast::is_eligible(x, at::kCPU)) {
    const at::ScalarType dtype = at::autocast::get_autocast_dtype(at::kCPU);
    const torch::Tensor x_cast = at::autocast::cached_cast(dtype, x, at::kCPU);
    const torch::Tensor weight_cast = at::autocast::cached_cast(dtype, weight, at::kCPU);
    const torch::Tensor bias_cast =
        bias.defined() ? at::autocast::cached_cast(dtype, bias, at::kCPU) : bias;
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    return Linear(x_cast, weight_cast, bias_cast);
  }
  const bool records =
      torch::GradMode::is_enabled() &&
      (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (!records || !CopiesRows(weight)) return torch::linear(x, weight, bias);
  return bias.defined() ? BiasedLinearFunction::apply(x, weight, bias)
                        : LinearFunction::apply(x, weight);
}

}  // namespace llmctl::trainer
