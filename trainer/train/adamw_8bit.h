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
// temporaries the size of the parameter; device-generic ATen ops for any other. kAten: the ATen ops
// everywhere, the reference the fused CPU kernel is tested against: the same state bits, parameters
// within a rounding step (its sqrt is correctly rounded, ATen's CPU sqrt is MKL's, 1 ulp off at
// times).
enum class AdamW8bitImpl { kDefault, kAten };

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
// keep their parameter and moments unchanged, as the kernel skips them.
std::unique_ptr<Optimizer> MakeAdamW8bit(const OptimizerOptions& options,
                                         std::vector<torch::Tensor> params,
                                         AdamW8bitImpl impl = AdamW8bitImpl::kDefault);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_ADAMW_8BIT_H_
