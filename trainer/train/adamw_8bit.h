// bitsandbytes' blockwise 8-bit AdamW (bnb.optim.AdamW8bit): the moments live as 8-bit codes, so
// the optimizer state is ~2 bytes per parameter instead of AdamW's 8.
#ifndef LLMCTL_TRAINER_TRAIN_ADAMW_8BIT_H_
#define LLMCTL_TRAINER_TRAIN_ADAMW_8BIT_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "trainer/train/optimizer.h"

namespace llmctl::trainer {

// State block size (bitsandbytes' since September 2024).
inline constexpr int64_t kAdamW8bitBlocksize = 256;
// Tensors with fewer elements keep fp32 moments (bitsandbytes' min_8bit_size).
inline constexpr int64_t kAdamW8bitMinSize = 4096;

// How Step() updates 8-bit state. kDefault: for CPU parameters, one fused pass per tensor with no
// temporaries the size of the parameter, whose bits are the same on every CPU and thread count;
// device-generic ATen ops for any other. kAten: the ATen ops everywhere (what CUDA runs). Their
// rounding depends on the kernels ATen picks for the CPU (whether add(alpha) and addcmul fuse their
// product, the order of addcmul's and addcdiv's products, a sqrt not correctly rounded), so on
// CPU the two agree within a few fp32 rounding steps, and the codes within the neighbours those
// steps reach; the bounds are derived in adamw_8bit_test.cc.
enum class AdamW8bitImpl { kDefault, kAten };

// The ATen path updates an 8-bit parameter this many elements at a time (a whole number of state
// blocks), so its temporaries (the fp32 gradient, old and new moments, parameter and update, the
// quantiser's indices: 25 bytes an element for an fp32 parameter, 33 for bf16) are those of a chunk,
// 132 MiB at most, whatever the parameter's size. Over a whole 13B embedding they took 5.05 GiB on
// an H200: under an A100's 79.2 GiB, the lab's 13B 8-bit AdamW rows ran out of memory in their first
// optimizer step. Every operation is elementwise or per block, so chunking changes no bit.
// common/estimate/step_memory.cc counts the same transient.
inline constexpr int64_t kAdamW8bitAtenChunk = int64_t{1} << 22;

// Per parameter of n elements, the state is:
//   n >= kAdamW8bitMinSize: m as uint8 codes of the signed dynamic map and v of the unsigned one,
//   with an
//     fp32 absmax per block of kAdamW8bitBlocksize each: 2n + 8 * ceil(n / 256) bytes;
//   smaller: fp32 m and v, 8n bytes;
// plus, shared, a fp32 step count and the two 256-entry fp32 code maps (4 + 2048 bytes).
//
// The update is bitsandbytes' CUDA kernel's: with t the step, c1 = 1 - beta1^t, c2 = sqrt(1 -
// beta2^t),
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p += (-lr c2 / c1) m / (sqrt(v) + c2 eps);  then p *= 1 - lr wd  (decay after the step)
// and m, v are requantised blockwise to the nearest code. Elements whose gradient is not finite
// keep their parameter and moments unchanged, as the kernel skips them. The fused CPU path
// evaluates it in fp32 exactly in this order, every operation correctly rounded:
//   m = fma(g, 1 - beta1, m_old beta1);  v = fma((1 - beta2) g, g, v_old beta2)
//   p = (p + (step_size m) / (sqrt(v) + eps')) decay
// with beta1, 1 - beta1, beta2, 1 - beta2, step_size = -lr c2 / c1, eps' = c2 eps and decay = 1 -
// lr wd (1 without decay) each rounded from double to fp32, and p rounded to its dtype at the end.
//
// `layouts` (MakeOptimizer's) keeps the state per piece of a parameter, as above with n the piece's
// length and the 8-bit rule the whole parameter's, so over a parameter's pieces it is the
// parameter's own state cut at block boundaries; every 8-bit piece must start on a state block of
// its parameter (InternalError otherwise). Padding has no state and is never stepped.
// `aten_chunk` (a multiple of kAdamW8bitBlocksize) is for tests that span several chunks.
StatusOr<std::unique_ptr<Optimizer>> MakeAdamW8bit(
    const OptimizerOptions& options, std::vector<torch::Tensor> params,
    AdamW8bitImpl impl = AdamW8bitImpl::kDefault, int64_t aten_chunk = kAdamW8bitAtenChunk,
    const std::vector<std::vector<ShardPiece>>& layouts = {});

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_ADAMW_8BIT_H_
