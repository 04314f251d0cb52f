// Nf4Linear (quant.h): the linear layer over an NF4 weight, which keeps the packed weight for
// backward and dequantises it in each pass.
#include <torch/torch.h>

#include "trainer/kernels/linear.h"
#include "trainer/quant/quant.h"

namespace llmctl::trainer {
namespace {

// Saved in the autograd context instead of the dense weight: the backward dequantises again.
void SaveNf4(torch::autograd::AutogradContext* ctx, const Nf4Weight& w) {
  ctx->saved_data["shape"] = w.shape;
  ctx->saved_data["blocksize"] = w.blocksize;
  ctx->saved_data["packed"] = w.packed;
  ctx->saved_data["absmax"] = w.absmax;
  ctx->saved_data["quantized_absmax"] = w.quantized_absmax;
  ctx->saved_data["nested_absmax"] = w.nested_absmax;
  ctx->saved_data["offset"] = w.offset;
  ctx->saved_data["double_quant"] = w.double_quant;
}

Nf4Weight LoadNf4(torch::autograd::AutogradContext* ctx) {
  Nf4Weight w;
  w.shape = ctx->saved_data["shape"].toIntVector();
  w.blocksize = ctx->saved_data["blocksize"].toInt();
  w.packed = ctx->saved_data["packed"].toTensor();
  w.absmax = ctx->saved_data["absmax"].toTensor();
  w.quantized_absmax = ctx->saved_data["quantized_absmax"].toTensor();
  w.nested_absmax = ctx->saved_data["nested_absmax"].toTensor();
  w.offset = ctx->saved_data["offset"].toTensor();
  w.double_quant = ctx->saved_data["double_quant"].toBool();
  return w;
}

class Nf4LinearFunction : public torch::autograd::Function<Nf4LinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const Nf4Weight& w, torch::ScalarType compute_dtype) {
    SaveNf4(ctx, w);
    ctx->saved_data["compute_dtype"] = static_cast<int64_t>(compute_dtype);
    ctx->saved_data["input_dtype"] = static_cast<int64_t>(x.scalar_type());
    // (out, in), freed when forward returns: only the packed weight is kept for backward.
    torch::Tensor weight = DequantizeNf4(w, compute_dtype);
    return Linear(x.to(compute_dtype), weight);  // (..., out)
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const auto compute_dtype =
        static_cast<torch::ScalarType>(ctx->saved_data["compute_dtype"].toInt());
    const auto input_dtype = static_cast<torch::ScalarType>(ctx->saved_data["input_dtype"].toInt());
    torch::Tensor weight = DequantizeNf4(LoadNf4(ctx), compute_dtype);  // (out, in)
    // (..., out) @ (out, in) -> (..., in)
    torch::Tensor grad_x = InputGradient(grad_outputs[0].to(compute_dtype), weight).to(input_dtype);
    return {grad_x, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor Nf4Linear(const torch::Tensor& x, const Nf4Weight& w,
                        torch::ScalarType compute_dtype) {
  TORCH_CHECK(w.shape.size() == 2 && x.size(-1) == w.shape[1], "Nf4Linear: input (..., ",
              x.size(-1), ") does not match the weight's in-features");
  return Nf4LinearFunction::apply(x, w, compute_dtype);
}

}  // namespace llmctl::trainer
