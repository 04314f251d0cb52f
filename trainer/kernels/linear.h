// The matrix products of the trainer's linear layers, their gradients and its chunked loss: ATen's,
// except on a CPU where LibTorch has no native 16-bit GEMM (common/cpu_matmul.h). There a
// 16-bit product is formed as fp32 GEMMs over blocks of its operands converted into a scratch
// buffer, summed in fp32 and rounded once into the 16-bit result, as a 16-bit GEMM that
// accumulates in fp32 does (the product of two bf16 or fp16 values is exact in fp32): 3-7x
// faster than LibTorch's scalar fallback on a Zen 3. The scratch (kScratchFloats floats a thread
// at most, kept for the thread's next product) is outside LibTorch's allocator, like a BLAS's
// own workspace: the tensors allocated, and so the memory a step reports, are the ones ATen's
// own GEMM allocates. (oneDNN takes its workspace from LibTorch's allocator: 51-197 KB a thread
// for its native bf16 GEMM, twice the output for its bf16 GEMM without avx512_bf16.)
//
// N... = any leading dimensions, I = input features, O = output features.
#ifndef LLMCTL_TRAINER_KERNELS_LINEAR_H_
#define LLMCTL_TRAINER_KERNELS_LINEAR_H_

#include <torch/torch.h>

#include <cstdint>

namespace llmctl::trainer {

// The most a thread's scratch holds: a 256 x 1,024 block of the left operand, a 1,024 x 1,024
// block of the right one and their 256 x 1,024 fp32 sum (6 MiB).
inline constexpr int64_t kScratchFloats = 256 * 1024 + 1024 * 1024 + 256 * 1024;

// Whether `a` @ `b` is formed in fp32 blocks here: both on the CPU, of one 16-bit dtype this CPU
// has no GEMM for.
bool MultipliesInFp32(const torch::Tensor& a, const torch::Tensor& b);

// a (M, K) @ b (K, N) -> (M, N), any strides: torch::mm.
torch::Tensor Matmul(const torch::Tensor& a, const torch::Tensor& b);
// The same into `out` (M, N), or added to what `out` holds where `accumulate` (out.addmm_(a, b)).
void MatmulInto(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                bool accumulate = false);

// dy (N..., O) @ weight (O, I) -> (N..., I): a linear layer's input gradient.
torch::Tensor InputGradient(const torch::Tensor& dy, const torch::Tensor& weight);

// linear(x, weight, bias): x (N..., I), weight (O, I), bias (O) or undefined -> (N..., O), autocast
// included (x, the weight and the bias cast to its dtype, the weight's cast cached, as autocast's
// linear does). Where MultipliesInFp32, its backward is one node of this file's that keeps what
// ATen's keeps (x when the weight trains, the weight when x needs a gradient) and forms x's
// gradient first, then the weight's (dy^T @ x) and the bias'; elsewhere it is ATen's linear.
torch::Tensor Linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias = {});

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_KERNELS_LINEAR_H_
