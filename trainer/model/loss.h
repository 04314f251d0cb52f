// Cross-entropy without the full logits: the (B, T, V) logits of a large vocabulary are often the
// biggest single activation of a fine-tuning step (TinyLlama, 4 x 2048 tokens: 1 GiB in fp32, and
// as much again for their gradient).
//
// B = batch size, T = sequence length, C = hidden size, V = vocabulary size, N = B·T tokens.
#ifndef LLMCTL_TRAINER_MODEL_LOSS_H_
#define LLMCTL_TRAINER_MODEL_LOSS_H_

#include <torch/torch.h>

#include <functional>
#include <vector>

#include "common/trial_config.h"  // kLossChunkTokens

namespace llmctl::trainer {

// The same loss as CausalLmLoss(logits_of(hidden), labels) — labels shifted left, mean over the
// labels that are not -100, in float32 — without ever holding more than `chunk_tokens` tokens'
// logits. When a gradient is needed, forward forms it chunk by chunk (Liger-Kernel's fused linear
// cross-entropy): each chunk's logits, softmax and gradients are made and dropped before the next
// chunk's, and what forward keeps for backward is the gradient of `hidden` (N, C) and of the
// trainable `weights`, which backward only scales. So the logits are computed once, not
// recomputed in backward.
//
// hidden (B, T, C); labels (B, T) int64; logits_of maps (n, C) to (n, V) and may read any tensor
// (an adapter's included), but `weights` must list each tensor it reads that needs a gradient:
// their gradients are summed over the chunks and handed to autograd once, so a parameter's gradient
// is accumulated (and its post-accumulate-grad hooks run) once per backward, as on the plain path.
//
// `plain_weight` (V, C), when given, says logits_of(h) is exactly h @ plain_weight^T (a head
// without adapter, bias or NF4 base); the chunks then skip autograd: the softmax's gradient is
// formed in place over the chunk's logits and the weight's gradient accumulates in one buffer
// (addmm), in autocast's dtype when it is on. Otherwise each chunk goes through autograd, whose
// weight gradient is a second (V, C) buffer while it is added to the sum. Weight gradients are
// summed in the weights' dtype.
// Returns the scalar mean loss.
torch::Tensor ChunkedCausalLmLoss(const torch::Tensor& hidden, const torch::Tensor& labels,
                                  std::function<torch::Tensor(const torch::Tensor&)> logits_of,
                                  const std::vector<torch::Tensor>& weights, int64_t chunk_tokens,
                                  const torch::Tensor& plain_weight = {});

// The same without the shift: position t is scored against labels[t] (an encoder-decoder's decoder,
// T5's), in float32.
torch::Tensor ChunkedCrossEntropyLoss(const torch::Tensor& hidden, const torch::Tensor& labels,
                                      std::function<torch::Tensor(const torch::Tensor&)> logits_of,
                                      const std::vector<torch::Tensor>& weights,
                                      int64_t chunk_tokens, const torch::Tensor& plain_weight = {});

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_LOSS_H_
