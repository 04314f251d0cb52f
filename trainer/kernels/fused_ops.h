// The lean decoder block's fused ops (the trial key `kernels: fused`): each one autograd node with
// a backward of its own that keeps fewer tensors than the ATen composition transformers runs
// (`kernels: aten`), and computes in one pass over memory. Per element the arithmetic is
// row_math.h's, in fp32, rounded once to the tensors' dtype: on the CPU cpu_kernels.h's loops, on
// CUDA cuda_kernels.cu's kernels (a LibTorch with CUDA needs nvcc, unless LLMCTL_CUDA_KERNELS=OFF).
//
// What each keeps for backward, against the ATen composition's:
//   RMSNorm: its input and each row's fp32 rstd (B, T, 1); ATen keeps an fp32 copy of a
//     low-precision input, rstd and the normalised input (for the weight's gradient).
//   SwiGLU: the gate and up projections' outputs, recomputing the activation in backward; ATen
//     keeps silu(gate) as well, a third (B, T, I) tensor. With the trained output projection
//     (FusedSwiGluLinear) not even the product its weight's gradient needs: it is recomputed.
//   Gated-GELU (T5): the same two; ATen's gelu_new keeps its input, x^3's input, the tanh and
//     several (B, T, F) intermediates of its seven ops.
//   RoPE: nothing but the fp32 tables the model already holds; ATen under bf16 keeps bf16 casts of
//     them per call, and builds rotate_half's copy of its input.
//   The chunked loss' cross-entropy: nothing beside a chunk's logits, which become their gradient
//     in place; ATen's composition holds a float32 copy of 16-bit logits and log-sum-exp's two
//     float32 temporaries, and makes eight passes over them where the fused kernel makes three.
//
// Where no fused kernel applies (a dtype other than fp32, bf16 or fp16, mixed dtypes, inputs on
// different devices or of shapes the op does not pair, a CUDA tensor in a build without the CUDA
// kernels), each function runs the ATen composition instead: the same values, transformers'
// tensors kept (and ATen's own error for devices it does not mix). kernel_choice.h records which
// ran, and why. A kernel runs on its inputs' device and that device's current stream, whichever
// device is current.
//
// In a profiled step's Kineto trace (`profile:`) each call is a span named "llmctl::" and the op's
// kernel_choice.h name ("llmctl::rms_norm", "llmctl::cross_entropy", ...), covering whichever
// implementation ran: the CPU loops and CUDA launches are not ATen operators, and without the span
// their time is in the step but under no operator (its backward is the autograd engine's
// CppNode<...Function> span).
#ifndef LLMCTL_TRAINER_KERNELS_FUSED_OPS_H_
#define LLMCTL_TRAINER_KERNELS_FUSED_OPS_H_

#include <torch/torch.h>

#include <string>

namespace llmctl::trainer {

// Which implementation of the decoder block's RMSNorm, SwiGLU and RoPE (and T5's norm and
// gated-GELU) a model runs.
enum class Kernels { kAten, kFused };

// The trial key's value ("fused" or "aten").
Kernels KernelsNamed(const std::string& name);

// The ATen compositions transformers runs (kernels: aten), and the fallbacks below:
// LlamaRMSNorm, weight * (x32 rsqrt(mean(x32^2, -1) + eps)).to(x.dtype) with x32 = x in fp32;
torch::Tensor AtenRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
// and the rotary embedding of x (B, H, T, D), x cos + rotate_half(x) sin with the (T, D) fp32
// tables cast to x's dtype first.
torch::Tensor AtenRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// weight * (x rstd).to(x.dtype) with rstd = 1 / sqrt(mean(x^2, -1) + eps) in fp32: transformers'
// LlamaRMSNorm (and T5's layer norm). x (..., C), weight (C,) of x's dtype; the ATen composition
// otherwise (a weight of another dtype).
torch::Tensor FusedRmsNorm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// silu(gate) * up, both (..., I) of one dtype (the ATen composition otherwise).
torch::Tensor FusedSwiGlu(const torch::Tensor& gate, const torch::Tensor& up);
// linear(silu(gate) * up, weight), weight (O, I) of gate's dtype and device: LLaMA's MLP from its
// two projections on, as one node that keeps gate, up and the weight and recomputes the product in
// backward for the weight's gradient (FusedSwiGlu then the linear layer keep the product too, a
// third (B, T, I) tensor). FusedSwiGlu and the linear layer otherwise.
torch::Tensor FusedSwiGluLinear(const torch::Tensor& gate, const torch::Tensor& up,
                                const torch::Tensor& weight);
// transformers' gelu_new (NewGELUActivation), 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))),
// op for op, so autograd keeps the same tensors: T5's gated-GELU under kernels: aten, and the
// fallback below.
torch::Tensor AtenGeluNew(const torch::Tensor& x);
// T5's gated-GELU, gelu_new(gate) * up, both (..., F) of one dtype, keeping the two projections
// as FusedSwiGlu does (the ATen composition otherwise).
torch::Tensor FusedGeGlu(const torch::Tensor& gate, const torch::Tensor& up);

// The rotary embedding of x (B, T, H, D) (the projections' layout before heads move to dim 1) at
// positions 0 .. T - 1: x cos + rotate_half(x) sin with cos, sin (T, D) fp32 tables whose halves
// are equal (MakeRotaryTables').
torch::Tensor FusedRope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// The decoder block's RMSNorm by `kernels`: FusedRmsNorm or AtenRmsNorm.
torch::Tensor RmsNormWith(Kernels kernels, const torch::Tensor& x, const torch::Tensor& weight,
                          double eps);
// RoPE on a projection's heads x (B, T, H, D) by `kernels`, returned with the heads moved to
// dimension 1 (B, H, T, D): FusedRope rotates in the projections' layout before the move,
// AtenRope (transformers' order) after it.
torch::Tensor RopeToHeadsWith(Kernels kernels, const torch::Tensor& x, const torch::Tensor& cos,
                              const torch::Tensor& sin);

// The cross-entropy of each row of logits (n, V) against labels (n,) int64 (-100: not scored),
// forming its gradient in place, as the chunked loss needs it (trainer/model/loss.h): the logits
// become inverse_count (softmax - one_hot(label)) on scored rows and zeros on the rest, with
// inverse_count a 0-dim float32 tensor on the logits' device (the reciprocal of the count of
// scored labels); labels or inverse_count of another shape, dtype (labels) or device are refused
// (c10::Error), fused or not. Returns each row's loss, log-sum-exp minus the label's logit, (n,)
// float32 (0 on unscored rows). Fused: three passes over each row in its own dtype, in the cache,
// and nothing else allocated; ATen's composition (AtenCrossEntropyGrad, the fallback) holds a
// float32 copy of 16-bit logits, and log-sum-exp two float32 (n, V) temporaries.
torch::Tensor FusedCrossEntropyGrad(torch::Tensor& logits, const torch::Tensor& labels,
                                    const torch::Tensor& inverse_count);
torch::Tensor AtenCrossEntropyGrad(torch::Tensor& logits, const torch::Tensor& labels,
                                   const torch::Tensor& inverse_count);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_KERNELS_FUSED_OPS_H_
