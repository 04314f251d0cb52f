// The linear layer every dense projection of the trainer runs, and its input gradient: ATen's,
// except that on the CPU in 16 bits the input gradient is formed a block of rows at a time, each
// block of dy copied column-major first (common/matmul_layout.h: LibTorch's row-major x row-major
// bf16 GEMM is 10x slower there than either other layout).
//
// N... = any leading dimensions, I = input features, O = output features.
#ifndef LLMCTL_TRAINER_KERNELS_LINEAR_H_
#define LLMCTL_TRAINER_KERNELS_LINEAR_H_

#include <torch/torch.h>

namespace llmctl::trainer {

// dy (N..., O) @ weight (O, I) -> (N..., I): a linear layer's input gradient. On the CPU in 16
// bits kInputGradientRows rows at a time, each block of dy copied column-major, one block alive at
// a time.
torch::Tensor InputGradient(const torch::Tensor& dy, const torch::Tensor& weight);
// The same into `out` (N, I), dy (N, O), all three of one dtype: for a caller that writes it into
// part of a larger tensor (the chunked loss' hidden states' gradient).
void InputGradientInto(torch::Tensor& out, const torch::Tensor& dy, const torch::Tensor& weight);

// linear(x, weight, bias): x (N..., I), weight (O, I), bias (O) or undefined -> (N..., O), autocast
// included (x, the weight and the bias cast to its dtype, the weight's cast cached, as autocast's
// linear does). Its forward is ATen's linear. On the CPU in 16 bits its backward is one node of
// this file's that keeps what ATen's keeps (x when the weight trains, the weight when x needs a
// gradient) and forms x's gradient first, with InputGradient, then the weight's (dy^T @ x, as
// ATen's) and the bias'; elsewhere it is ATen's linear.
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias = {});

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_KERNELS_LINEAR_H_
