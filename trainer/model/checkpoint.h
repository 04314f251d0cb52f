// Activation checkpointing: run a block without keeping its activations and recompute them in backward.
#ifndef LLMCTL_TRAINER_MODEL_CHECKPOINT_H_
#define LLMCTL_TRAINER_MODEL_CHECKPOINT_H_

#include <torch/torch.h>

#include <functional>

namespace llmctl::trainer {

// Returns block(input) while keeping only `input` for backward. In backward the block runs again with
// gradients on (and the forward's autocast settings), and its parameters' gradients accumulate as usual.
// `block` must not capture anything by reference that dies before backward: capture tensors by value.
torch::Tensor CheckpointedForward(std::function<torch::Tensor(const torch::Tensor&)> block,
                                  const torch::Tensor& input);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_CHECKPOINT_H_
