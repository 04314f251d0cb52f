// The fused kernels on the CPU: loops over rows (RMSNorm, RoPE) or elements (SwiGLU), parallel
// over them with at::parallel_for, each element's arithmetic row_math.h's. Contiguous tensors of
// one floating dtype (fp32, bf16 or fp16), checked by fused_ops.cc.
#ifndef LLMCTL_TRAINER_KERNELS_CPU_KERNELS_H_
#define LLMCTL_TRAINER_KERNELS_CPU_KERNELS_H_

#include <torch/torch.h>

#include "trainer/kernels/row_math.h"

namespace llmctl::kernels::cpu {

// x, weight, y: (rows, cols); rstd: (rows,) fp32.
void RmsNormForward(const torch::Tensor& x, const torch::Tensor& weight, torch::Tensor& y,
                    torch::Tensor& rstd, float eps);
void RmsNormBackward(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& rstd,
                     const torch::Tensor& dy, torch::Tensor& dx);
// dweight (cols,) fp32 = sum over rows of dy * (x rstd) rounded to x's dtype (the normalised value
// the forward scaled), each column summed over the rows in order by one task.
void RmsNormWeightGrad(const torch::Tensor& x, const torch::Tensor& rstd, const torch::Tensor& dy,
                       torch::Tensor& dweight);
// h = act(g) * u elementwise (SwiGLU, gated-GELU), and its gradients.
void GluForward(GluActivation activation, const torch::Tensor& g, const torch::Tensor& u,
                torch::Tensor& h);
void GluBackward(GluActivation activation, const torch::Tensor& g, const torch::Tensor& u,
                 const torch::Tensor& dh, torch::Tensor& dg, torch::Tensor& du);
// x, y: (B, T, H, D); cos, sin: (T, D) fp32.
void Rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
          torch::Tensor& y, bool inverse);

// In place over logits (rows, cols): each row's gradient of `scale` times the summed
// cross-entropy, scale (softmax - one_hot(label)); row_loss (rows,) fp32 gets each row's loss. A
// row labelled `ignore` gets zeros and a loss of 0. labels (rows,) int64, each `ignore` or in
// [0, cols) (the caller's check).
void CrossEntropyGrad(torch::Tensor& logits, const torch::Tensor& labels, float scale,
                      int64_t ignore, torch::Tensor& row_loss);

}  // namespace llmctl::kernels::cpu

#endif  // LLMCTL_TRAINER_KERNELS_CPU_KERNELS_H_
