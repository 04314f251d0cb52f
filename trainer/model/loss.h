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

namespace llmctl::trainer {

// Tokens per chunk for `loss: chunked_ce`: the knee of memory against time. Measured on a 2-core
// CPU (B·T = 1024 tokens, C = 256, V = 32000, fp32; forward + backward of the loss alone, best of
// 3, memory above the start including the weight's gradient):
//   plain CausalLmLoss   1.71 s  375 MiB
//   64 tokens            2.8 s    71 MiB
//   128 tokens           2.17 s   79 MiB
//   256 tokens           2.0 s   126 MiB
//   512 tokens           1.8 s   220 MiB
// Halving 128 saves 8 MiB for 30% more time; doubling it costs 47 MiB for 8% less. The time over
// the plain path is mostly the recomputed projection (4 matmuls instead of 3); the chunk's memory
// is fixed while the full logits grow with B·T. LitGPT chunks by 128 as well.
inline constexpr int64_t kLossChunkTokens = 128;

// The same loss as CausalLmLoss(logits_of(hidden), labels) — labels shifted left, mean over the
// labels that are not -100, in float32 — without ever holding more than `chunk_tokens` tokens'
// logits: forward computes the loss chunk by chunk and keeps only `hidden`; backward recomputes one
// chunk's logits at a time (with the forward's autocast settings) and backpropagates them at once.
//
// hidden (B, T, C); labels (B, T) int64; logits_of maps (n, C) to (n, V) and may read any tensor
// (an adapter's included), but `weights` must list each tensor it reads that needs a gradient:
// their gradients are summed over the chunks and handed to autograd once, so a parameter's gradient
// is accumulated (and its post-accumulate-grad hooks run) once per backward, as on the plain path.
// Weight gradients are summed in the weights' dtype; from the second chunk on, the running sum and
// the chunk's own gradient are both alive, one weight-gradient-sized buffer more than the plain
// path (the price of handing autograd a single gradient). Returns the scalar mean loss.
torch::Tensor ChunkedCausalLmLoss(const torch::Tensor& hidden, const torch::Tensor& labels,
                                  std::function<torch::Tensor(const torch::Tensor&)> logits_of,
                                  const std::vector<torch::Tensor>& weights, int64_t chunk_tokens);

// The same without the shift: position t is scored against labels[t] (an encoder-decoder's decoder,
// T5's), in float32.
torch::Tensor ChunkedCrossEntropyLoss(const torch::Tensor& hidden, const torch::Tensor& labels,
                                      std::function<torch::Tensor(const torch::Tensor&)> logits_of,
                                      const std::vector<torch::Tensor>& weights,
                                      int64_t chunk_tokens);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_LOSS_H_
