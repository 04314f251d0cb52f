#include "trainer/kernels/fused_ops.h"

#include <cmath>
#include <stdexcept>

#include "trainer/kernels/cpu_kernels.h"

#if defined(LLMCTL_HAVE_CUDA_KERNELS)
#include <c10/cuda/CUDAStream.h>

#include "trainer/kernels/cuda_kernels.h"
#endif

namespace llmctl::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

bool FusableDtype(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16 ||
         t.scalar_type() == torch::kHalf;
}

#if defined(LLMCTL_HAVE_CUDA_KERNELS)
kernels::cuda::Element ElementOf(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kBFloat16:
      return kernels::cuda::Element::kBFloat16;
    case torch::kHalf:
      return kernels::cuda::Element::kFloat16;
    default:
      return kernels::cuda::Element::kFloat32;
  }
}

void* CurrentStream() { return c10::cuda::getCurrentCUDAStream().stream(); }

// Throws CUDA's error (the autograd engine turns it into the step's failure).
void CheckLaunch(const char* error, const char* what) {
  if (error != nullptr) throw std::runtime_error(std::string(what) + ": " + error);
}
#endif

// The devices the fused kernels run on in this build.
bool FusedOn(const torch::Tensor& t) {
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
  if (t.is_cuda()) return true;
#endif
  return t.is_cpu();
}

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  // x (N, C) contiguous, weight (C,) of x's dtype.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    torch::Tensor y = torch::empty_like(x);
    torch::Tensor rstd = torch::empty({x.size(0)}, x.options().dtype(torch::kFloat32));
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
    if (x.is_cuda()) {
      CheckLaunch(
          kernels::cuda::RmsNormForward(ElementOf(x), x.data_ptr(), weight.data_ptr(), y.data_ptr(),
                                        rstd.data_ptr<float>(), x.size(0), x.size(1),
                                        static_cast<float>(eps), CurrentStream()),
          "RMSNorm");
    } else
#endif
    {
      kernels::cpu::RmsNormForward(x, weight, y, rstd, static_cast<float>(eps));
    }
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor& rstd = saved[2];
    const torch::Tensor dy = grad_outputs[0].contiguous();
    torch::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty_like(x);
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
      if (x.is_cuda()) {
        CheckLaunch(kernels::cuda::RmsNormBackward(
                        ElementOf(x), x.data_ptr(), weight.data_ptr(), rstd.data_ptr<float>(),
                        dy.data_ptr(), dx.data_ptr(), x.size(0), x.size(1), CurrentStream()),
                    "RMSNorm backward");
      } else
#endif
      {
        kernels::cpu::RmsNormBackward(x, weight, rstd, dy, dx);
      }
    }
    torch::Tensor dweight;
    if (ctx->needs_input_grad(1)) {
      // The sum over rows of dy * (x rstd).to(dtype).
      if (x.is_cpu()) {
        torch::Tensor sums = torch::empty({x.size(1)}, x.options().dtype(torch::kFloat32));
        kernels::cpu::RmsNormWeightGrad(x, rstd, dy, sums);
        dweight = sums.to(weight.scalar_type());
      } else {
        const torch::Tensor normed =
            (x.to(torch::kFloat32) * rstd.unsqueeze(1)).to(x.scalar_type());
        dweight =
            (dy.to(torch::kFloat32) * normed.to(torch::kFloat32)).sum(0).to(weight.scalar_type());
      }
    }
    return {dx, dweight, torch::Tensor()};
  }
};

struct GluFunction : public torch::autograd::Function<GluFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up, int64_t activation_index) {
    const auto activation = static_cast<kernels::GluActivation>(activation_index);
    torch::Tensor h = torch::empty_like(gate);
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
    if (gate.is_cuda()) {
      CheckLaunch(
          kernels::cuda::GluForward(activation, ElementOf(gate), gate.data_ptr(), up.data_ptr(),
                                    h.data_ptr(), gate.numel(), CurrentStream()),
          "gated activation");
    } else
#endif
    {
      kernels::cpu::GluForward(activation, gate, up, h);
    }
    ctx->save_for_backward({gate, up});
    ctx->saved_data["activation"] = activation_index;
    return h;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto activation =
        static_cast<kernels::GluActivation>(ctx->saved_data["activation"].toInt());
    const torch::Tensor dh = grad_outputs[0].contiguous();
    torch::Tensor dgate = torch::empty_like(saved[0]);
    torch::Tensor dup = torch::empty_like(saved[1]);
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
    if (dh.is_cuda()) {
      CheckLaunch(kernels::cuda::GluBackward(activation, ElementOf(dh), saved[0].data_ptr(),
                                             saved[1].data_ptr(), dh.data_ptr(), dgate.data_ptr(),
                                             dup.data_ptr(), dh.numel(), CurrentStream()),
                  "gated activation backward");
    } else
#endif
    {
      kernels::cpu::GluBackward(activation, saved[0], saved[1], dh, dgate, dup);
    }
    return {dgate, dup, torch::Tensor()};
  }
};

// Rotates x (B, T, H, D) by the tables' angles, or back.
torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     bool inverse) {
  torch::Tensor y = torch::empty_like(x);
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
  if (x.is_cuda()) {
    CheckLaunch(kernels::cuda::Rope(ElementOf(x), x.data_ptr(), cos.data_ptr<float>(),
                                    sin.data_ptr<float>(), y.data_ptr(), x.size(0), x.size(1),
                                    x.size(2), x.size(3), inverse, CurrentStream()),
                "RoPE");
    return y;
  }
#endif
  kernels::cpu::Rope(x, cos, sin, y, inverse);
  return y;
}

struct RopeFunction : public torch::autograd::Function<RopeFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    // The tables need no gradient: kept as plain references, not saved variables.
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    return Rotate(x, cos, sin, /*inverse=*/false);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    return {Rotate(grad_outputs[0].contiguous(), ctx->saved_data["cos"].toTensor(),
                   ctx->saved_data["sin"].toTensor(), /*inverse=*/true),
            torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor AtenRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  auto x32 = x.to(torch::kFloat32);
  auto variance = x32.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (x32 * torch::rsqrt(variance + eps)).to(x.scalar_type());
}

torch::Tensor AtenRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.to(x.scalar_type()) + rotated * sin.to(x.scalar_type());
}

Kernels KernelsNamed(const std::string& name) {
  return name == "aten" ? Kernels::kAten : Kernels::kFused;
}

torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (!FusedOn(x) || !FusableDtype(x) || weight.scalar_type() != x.scalar_type() ||
      weight.device() != x.device()) {
    return AtenRmsNorm(x, weight, eps);
  }
  const int64_t cols = x.size(-1);
  const torch::Tensor rows = x.contiguous().view({-1, cols});  // (N, C)
  return RmsNormFunction::apply(rows, weight.contiguous(), eps).view(x.sizes());
}

// Whether the gated activation's kernels take gate and up as they are.
bool GluFusable(const torch::Tensor& gate, const torch::Tensor& up) {
  return FusedOn(gate) && FusableDtype(gate) && up.scalar_type() == gate.scalar_type() &&
         up.sizes().equals(gate.sizes());
}

torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up) {
  if (!GluFusable(gate, up)) return torch::silu(gate) * up;
  return GluFunction::apply(gate.contiguous(), up.contiguous(),
                            static_cast<int64_t>(kernels::GluActivation::kSilu));
}

torch::Tensor AtenGeluNew(const torch::Tensor& x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + torch::tanh(c * (x + 0.044715 * torch::pow(x, 3.0))));
}

torch::Tensor FusedGeGlu(const torch::Tensor& gate, const torch::Tensor& up) {
  if (!GluFusable(gate, up)) return AtenGeluNew(gate) * up;
  return GluFunction::apply(gate.contiguous(), up.contiguous(),
                            static_cast<int64_t>(kernels::GluActivation::kGeluTanh));
}

torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  if (!FusedOn(x) || !FusableDtype(x) || cos.scalar_type() != torch::kFloat32 ||
      x.size(-1) % 2 != 0) {
    // (B, T, H, D) as (B, H, T, D), the layout the composition broadcasts the tables over.
    return AtenRope(x.transpose(1, 2), cos, sin).transpose(1, 2);
  }
  return RopeFunction::apply(x.contiguous(), cos.contiguous(), sin.contiguous());
}

}  // namespace llmctl::trainer
