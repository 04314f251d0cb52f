#include "trainer/kernels/fused_ops.h"

#include <ATen/record_function.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/data/dataset.h"  // kIgnoreIndex
#include "trainer/kernels/cpu_kernels.h"
#include "trainer/kernels/kernel_choice.h"
#include "trainer/kernels/linear.h"

#if defined(LLMCTL_HAVE_CUDA_KERNELS)
#include <c10/cuda/CUDAGuard.h>
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

// A launch on the device of the tensors it reads, which is not necessarily the current one (a
// trainer on cuda:1 that never made it current): the guard makes it current while the launcher
// runs (a <<<...>>> launch goes to the current device, and a stream of another device fails it),
// and the stream is that device's current one, the one ATen's ops on those tensors run on.
class CudaLaunch {
 public:
  explicit CudaLaunch(const torch::Tensor& on) : guard_(on.device()) {}
  void* stream() const {
    return c10::cuda::getCurrentCUDAStream(guard_.current_device().index()).stream();
  }

 private:
  c10::cuda::CUDAGuard guard_;
};

// Throws CUDA's error (the autograd engine turns it into the step's failure).
void CheckLaunch(const char* error, const char* what) {
  if (error != nullptr) throw std::runtime_error(std::string(what) + ": " + error);
}
#endif

using kernels::FusedOp;
using kernels::Implementation;

// Why no fused kernel takes `t`, the tensor whose device and dtype pick the kernel: its device in
// this build, or its dtype; "" when one does.
std::string WhyNotFused(const torch::Tensor& t) {
  if (t.is_cuda() && !kernels::CudaKernelsBuilt()) {
    return "this llm-train was built without its CUDA kernels (configured with "
           "-DLLMCTL_CUDA_KERNELS=OFF, or against a LibTorch without CUDA)";
  }
  if (!t.is_cuda() && !t.is_cpu()) return "no fused kernel on device " + t.device().str();
  if (!FusableDtype(t)) {
    return std::string("dtype ") + c10::toString(t.scalar_type()) +
           " (the fused kernels take float32, bfloat16 and float16)";
  }
  return "";
}

// Why the kernels do not take `t` beside `lead`, the leading input whose device and dtype pick
// the kernel: they read every input through plain pointers on one device, in one dtype. "" when
// they do. The caller falls back to the ATen composition, which then computes in mixed dtypes or
// refuses the mixed devices itself: no kernel ever reads another device's memory.
std::string WhyNotBeside(const char* what, const torch::Tensor& t, const char* leading,
                         const torch::Tensor& lead) {
  if (t.scalar_type() != lead.scalar_type()) {
    return std::string(what) + "'s dtype " + c10::toString(t.scalar_type()) + " is not " + leading +
           "'s " + c10::toString(lead.scalar_type());
  }
  if (t.device() != lead.device()) {
    return std::string(what) + " is on " + t.device().str() + ", " + leading + " on " +
           lead.device().str();
  }
  return "";
}

// Records that `op` runs its kernel on `t`'s device.
void RecordFusedOn(FusedOp op, const torch::Tensor& t) {
  kernels::RecordKernel(op, t.is_cuda() ? Implementation::kCudaKernel : Implementation::kCpuLoop);
}

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  // x (N, C) contiguous, weight (C,) of x's dtype.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    torch::Tensor y = torch::empty_like(x);
    torch::Tensor rstd = torch::empty({x.size(0)}, x.options().dtype(torch::kFloat32));
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
    if (x.is_cuda()) {
      const CudaLaunch launch(x);
      CheckLaunch(
          kernels::cuda::RmsNormForward(ElementOf(x), x.data_ptr(), weight.data_ptr(), y.data_ptr(),
                                        rstd.data_ptr<float>(), x.size(0), x.size(1),
                                        static_cast<float>(eps), launch.stream()),
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
        const CudaLaunch launch(x);
        CheckLaunch(kernels::cuda::RmsNormBackward(
                        ElementOf(x), x.data_ptr(), weight.data_ptr(), rstd.data_ptr<float>(),
                        dy.data_ptr(), dx.data_ptr(), x.size(0), x.size(1), launch.stream()),
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

// act(gate) * up, both (..., I) contiguous of one fusable dtype, with the kernel of their device.
torch::Tensor GluForward(kernels::GluActivation activation, const torch::Tensor& gate,
                         const torch::Tensor& up) {
  torch::Tensor h = torch::empty_like(gate);
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
  if (gate.is_cuda()) {
    const CudaLaunch launch(gate);
    CheckLaunch(
        kernels::cuda::GluForward(activation, ElementOf(gate), gate.data_ptr(), up.data_ptr(),
                                  h.data_ptr(), gate.numel(), launch.stream()),
        "gated activation");
    return h;
  }
#endif
  kernels::cpu::GluForward(activation, gate, up, h);
  return h;
}

// The gradients of act(gate) * up given dh's, into new (..., I) tensors {dgate, dup}.
tensor_list GluBackward(kernels::GluActivation activation, const torch::Tensor& gate,
                        const torch::Tensor& up, const torch::Tensor& dh) {
  torch::Tensor dgate = torch::empty_like(gate);
  torch::Tensor dup = torch::empty_like(up);
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
  if (dh.is_cuda()) {
    const CudaLaunch launch(dh);
    CheckLaunch(kernels::cuda::GluBackward(activation, ElementOf(dh), gate.data_ptr(),
                                           up.data_ptr(), dh.data_ptr(), dgate.data_ptr(),
                                           dup.data_ptr(), dh.numel(), launch.stream()),
                "gated activation backward");
    return {dgate, dup};
  }
#endif
  kernels::cpu::GluBackward(activation, gate, up, dh, dgate, dup);
  return {dgate, dup};
}

struct GluFunction : public torch::autograd::Function<GluFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up, int64_t activation_index) {
    ctx->save_for_backward({gate, up});
    ctx->saved_data["activation"] = activation_index;
    return GluForward(static_cast<kernels::GluActivation>(activation_index), gate, up);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto activation =
        static_cast<kernels::GluActivation>(ctx->saved_data["activation"].toInt());
    tensor_list grads = GluBackward(activation, saved[0], saved[1], grad_outputs[0].contiguous());
    grads.emplace_back();  // the activation's index
    return grads;
  }
};

// linear(act(gate) * up, weight) keeping gate, up and the weight: backward recomputes the product
// for the weight's gradient, where the linear layer alone would keep it.
struct GluLinearFunction : public torch::autograd::Function<GluLinearFunction> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up, const torch::Tensor& weight,
                               int64_t activation_index) {
    ctx->save_for_backward({gate, up, weight});
    ctx->saved_data["activation"] = activation_index;
    const torch::Tensor h =
        GluForward(static_cast<kernels::GluActivation>(activation_index), gate, up);  // (N..., I)
    return Linear(h, weight);  // (N..., O); h is freed on return
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& gate = saved[0];
    const torch::Tensor& up = saved[1];
    const torch::Tensor& weight = saved[2];  // (O, I)
    const auto activation =
        static_cast<kernels::GluActivation>(ctx->saved_data["activation"].toInt());
    const torch::Tensor dy = grad_outputs[0].contiguous().view({-1, weight.size(0)});  // (N, O)
    torch::Tensor dweight;
    if (ctx->needs_input_grad(2)) {
      // The product again, (N, I), only while the weight's gradient forms.
      const torch::Tensor h = GluForward(activation, gate, up).view({-1, weight.size(1)});
      dweight = Matmul(dy.t(), h);  // (O, I)
    }
    tensor_list grads = {torch::Tensor(), torch::Tensor()};
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      const torch::Tensor dh = InputGradient(dy, weight).view(gate.sizes());  // (N..., I)
      grads = GluBackward(activation, gate, up, dh);
    }
    return {grads[0], grads[1], dweight, torch::Tensor()};
  }
};

// Rotates x (B, T, H, D) by the tables' angles, or back.
torch::Tensor Rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                     bool inverse) {
  torch::Tensor y = torch::empty_like(x);
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
  if (x.is_cuda()) {
    const CudaLaunch launch(x);
    CheckLaunch(kernels::cuda::Rope(ElementOf(x), x.data_ptr(), cos.data_ptr<float>(),
                                    sin.data_ptr<float>(), y.data_ptr(), x.size(0), x.size(1),
                                    x.size(2), x.size(3), inverse, launch.stream()),
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

torch::Tensor RmsNormWith(Kernels kernels, const torch::Tensor& x, const torch::Tensor& weight,
                          double eps) {
  return kernels == Kernels::kFused ? FusedRmsNorm(x, weight, eps) : AtenRmsNorm(x, weight, eps);
}

torch::Tensor RopeToHeadsWith(Kernels kernels, const torch::Tensor& x, const torch::Tensor& cos,
                              const torch::Tensor& sin) {
  if (kernels == Kernels::kFused) return FusedRope(x, cos, sin).transpose(1, 2);
  return AtenRope(x.transpose(1, 2), cos, sin);
}

torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  RECORD_FUNCTION("llmctl::rms_norm", std::vector<c10::IValue>({x, weight}));
  std::string why = WhyNotFused(x);
  if (why.empty()) why = WhyNotBeside("the weight", weight, "the input", x);
  if (why.empty() && (weight.dim() != 1 || weight.size(0) != x.size(-1))) {
    why = "the weight's shape is not (" + std::to_string(x.size(-1)) + ",)";
  }
  if (!why.empty()) {
    kernels::RecordFallback(FusedOp::kRmsNorm, std::move(why));
    return AtenRmsNorm(x, weight, eps);
  }
  RecordFusedOn(FusedOp::kRmsNorm, x);
  const int64_t cols = x.size(-1);
  const torch::Tensor rows = x.contiguous().view({-1, cols});  // (N, C)
  return RmsNormFunction::apply(rows, weight.contiguous(), eps).view(x.sizes());
}

namespace {

// Why the gated activation's kernels do not take gate and up as they are ("" when they do).
std::string WhyGluNotFused(const torch::Tensor& gate, const torch::Tensor& up) {
  std::string why = WhyNotFused(gate);
  if (why.empty()) why = WhyNotBeside("up", up, "gate", gate);
  if (why.empty() && !up.sizes().equals(gate.sizes())) why = "up's shape is not gate's";
  return why;
}

}  // namespace

torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up) {
  RECORD_FUNCTION("llmctl::swiglu", std::vector<c10::IValue>({gate, up}));
  if (std::string why = WhyGluNotFused(gate, up); !why.empty()) {
    kernels::RecordFallback(FusedOp::kSwiGlu, std::move(why));
    return torch::silu(gate) * up;
  }
  RecordFusedOn(FusedOp::kSwiGlu, gate);
  return GluFunction::apply(gate.contiguous(), up.contiguous(),
                            static_cast<int64_t>(kernels::GluActivation::kSilu));
}

torch::Tensor FusedSwiGluLinear(const torch::Tensor& gate, const torch::Tensor& up,
                                const torch::Tensor& weight) {
  RECORD_FUNCTION("llmctl::swiglu_linear", std::vector<c10::IValue>({gate, up, weight}));
  std::string why = WhyGluNotFused(gate, up);
  if (why.empty()) why = WhyNotBeside("the weight", weight, "gate", gate);
  if (!why.empty()) {
    kernels::RecordFallback(FusedOp::kSwiGluLinear, std::move(why));
    return Linear(FusedSwiGlu(gate, up), weight);
  }
  RecordFusedOn(FusedOp::kSwiGluLinear, gate);
  return GluLinearFunction::apply(gate.contiguous(), up.contiguous(), weight,
                                  static_cast<int64_t>(kernels::GluActivation::kSilu));
}

torch::Tensor AtenGeluNew(const torch::Tensor& x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + torch::tanh(c * (x + 0.044715 * torch::pow(x, 3.0))));
}

torch::Tensor FusedGeGlu(const torch::Tensor& gate, const torch::Tensor& up) {
  RECORD_FUNCTION("llmctl::geglu", std::vector<c10::IValue>({gate, up}));
  if (std::string why = WhyGluNotFused(gate, up); !why.empty()) {
    kernels::RecordFallback(FusedOp::kGeGlu, std::move(why));
    return AtenGeluNew(gate) * up;
  }
  RecordFusedOn(FusedOp::kGeGlu, gate);
  return GluFunction::apply(gate.contiguous(), up.contiguous(),
                            static_cast<int64_t>(kernels::GluActivation::kGeluTanh));
}

namespace {

// Why RoPE's kernels do not take `table` (cos or sin) for x (B, T, H, D): they read it as a
// (T, D) float32 table on x's device, row t for position t. "" when they do.
std::string WhyTableNotFused(const char* name, const torch::Tensor& table, const torch::Tensor& x) {
  std::string why;
  if (table.scalar_type() != torch::kFloat32) {
    why = std::string("the ") + name + " table's dtype " + c10::toString(table.scalar_type()) +
          " is not float32";
  } else if (table.device() != x.device()) {
    why = std::string("the ") + name + " table is on " + table.device().str() + ", the input on " +
          x.device().str();
  } else if (table.dim() != 2 || table.size(0) != x.size(1) || table.size(1) != x.size(3)) {
    why = std::string("the ") + name + " table's shape is not (" + std::to_string(x.size(1)) +
          ", " + std::to_string(x.size(3)) + ")";
  }
  return why;
}

// Refuses what neither the kernels nor ATen's composition may take: labels and inverse_count
// that are not (n,) int64 and one value on the logits' device. Checked before any launch: a kernel
// given another device's pointer reads memory that is not the labels'.
void CheckCrossEntropyInputs(const torch::Tensor& logits, const torch::Tensor& labels,
                             const torch::Tensor& inverse_count) {
  TORCH_CHECK(logits.dim() == 2, "cross-entropy: the logits are ", logits.dim(),
              "-dimensional, not (n, V)");
  TORCH_CHECK(labels.scalar_type() == torch::kInt64, "cross-entropy: the labels' dtype ",
              labels.scalar_type(), " is not int64");
  TORCH_CHECK(labels.dim() == 1 && labels.size(0) == logits.size(0), "cross-entropy: the labels' ",
              "shape ", labels.sizes(), " is not (", logits.size(0), ",), the logits' rows");
  TORCH_CHECK(labels.device() == logits.device(), "cross-entropy: the labels are on ",
              labels.device(), ", the logits on ", logits.device());
  TORCH_CHECK(inverse_count.numel() == 1, "cross-entropy: the inverse count has ",
              inverse_count.numel(), " values, not one");
  TORCH_CHECK(inverse_count.device() == logits.device(), "cross-entropy: the inverse count is on ",
              inverse_count.device(), ", the logits on ", logits.device());
}

}  // namespace

torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& cos,
                        const torch::Tensor& sin) {
  RECORD_FUNCTION("llmctl::rope", std::vector<c10::IValue>({x}));
  std::string why = WhyNotFused(x);
  if (why.empty() && x.size(-1) % 2 != 0) why = "an odd head dimension";
  if (why.empty()) why = WhyTableNotFused("cos", cos, x);
  if (why.empty()) why = WhyTableNotFused("sin", sin, x);
  if (!why.empty()) {
    kernels::RecordFallback(FusedOp::kRope, std::move(why));
    // (B, T, H, D) as (B, H, T, D), the layout the composition broadcasts the tables over.
    return AtenRope(x.transpose(1, 2), cos, sin).transpose(1, 2);
  }
  RecordFusedOn(FusedOp::kRope, x);
  return RopeFunction::apply(x.contiguous(), cos.contiguous(), sin.contiguous());
}

torch::Tensor AtenCrossEntropyGrad(torch::Tensor& logits, const torch::Tensor& labels,
                                   const torch::Tensor& inverse_count) {
  // (n, V) float32: the logits, then in place the softmax, then the loss' gradient.
  torch::Tensor probs = logits.to(torch::kFloat32);
  const torch::Tensor scored = labels.ne(data::kIgnoreIndex);
  const torch::Tensor targets = labels.masked_fill(scored.logical_not(), 0).unsqueeze(1);
  const torch::Tensor log_normalizer = probs.logsumexp(1, /*keepdim=*/true);  // (n, 1)
  torch::Tensor row_loss = log_normalizer.squeeze(1)
                               .sub(probs.gather(1, targets).squeeze(1))
                               .masked_fill_(scored.logical_not(), 0);
  // d/d(logits) = (softmax - one_hot(label)) * inverse_count, zero on unscored rows (also when
  // none is scored and inverse_count is infinite, as cross_entropy's backward gives).
  probs.sub_(log_normalizer).exp_();
  probs.scatter_add_(1, targets, torch::full_like(targets, -1, probs.options()));
  probs.mul_(torch::where(scored, inverse_count, torch::zeros_like(inverse_count)).unsqueeze(1));
  if (!probs.is_same(logits)) logits.copy_(probs);
  return row_loss;
}

torch::Tensor FusedCrossEntropyGrad(torch::Tensor& logits, const torch::Tensor& labels,
                                    const torch::Tensor& inverse_count) {
  RECORD_FUNCTION("llmctl::cross_entropy", std::vector<c10::IValue>({logits, labels}));
  CheckCrossEntropyInputs(logits, labels, inverse_count);
  std::string why = WhyNotFused(logits);
  if (why.empty() && !logits.is_contiguous()) why = "the logits are not contiguous";
  if (why.empty() && inverse_count.scalar_type() != torch::kFloat32) {
    why = std::string("the inverse count's dtype ") + c10::toString(inverse_count.scalar_type()) +
          " is not float32";
  }
  if (!why.empty()) {
    kernels::RecordFallback(FusedOp::kCrossEntropy, std::move(why));
    return AtenCrossEntropyGrad(logits, labels, inverse_count);
  }
  RecordFusedOn(FusedOp::kCrossEntropy, logits);
  const torch::Tensor row_labels = labels.contiguous();
  const int64_t rows = logits.size(0);
  const int64_t vocab = logits.size(1);
  torch::Tensor row_loss = torch::empty({rows}, logits.options().dtype(torch::kFloat32));
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
  if (logits.is_cuda()) {
    const CudaLaunch launch(logits);
    CheckLaunch(kernels::cuda::CrossEntropyGrad(
                    ElementOf(logits), logits.data_ptr(), row_labels.data_ptr<int64_t>(),
                    inverse_count.data_ptr<float>(), row_loss.data_ptr<float>(), rows, vocab,
                    data::kIgnoreIndex, launch.stream()),
                "cross-entropy");
    return row_loss;
  }
#endif
  const int64_t* label = row_labels.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(label[r] == data::kIgnoreIndex || (label[r] >= 0 && label[r] < vocab), "label ",
                label[r], " is outside the vocabulary [0, ", vocab, ")");
  }
  kernels::cpu::CrossEntropyGrad(logits, row_labels, inverse_count.item<float>(),
                                 data::kIgnoreIndex, row_loss);
  return row_loss;
}

}  // namespace llmctl::trainer

namespace llmctl::kernels {

bool CudaKernelsBuilt() {
#if defined(LLMCTL_HAVE_CUDA_KERNELS)
  return true;
#else
  return false;
#endif
}

}  // namespace llmctl::kernels
