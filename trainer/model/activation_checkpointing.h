// Activation checkpointing: run a block without keeping its activations and recompute them in
// backward.
#ifndef LLMCTL_TRAINER_MODEL_ACTIVATION_CHECKPOINTING_H_
#define LLMCTL_TRAINER_MODEL_ACTIVATION_CHECKPOINTING_H_

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace llmctl::trainer {

// The autocast state of both device types. Backward runs on the autograd engine's threads, where
// autocast is off, so code that reruns part of a forward pass in backward captures this in forward
// and puts it back while rerunning.
struct AutocastSettings {
  bool cpu_enabled;
  at::ScalarType cpu_dtype;
  bool cuda_enabled;
  at::ScalarType cuda_dtype;

  static AutocastSettings Current();
  void Apply() const;
};

// Applies `settings` while alive; puts the previous ones back.
class ScopedAutocast {
 public:
  explicit ScopedAutocast(const AutocastSettings& settings);
  ~ScopedAutocast();
  ScopedAutocast(const ScopedAutocast&) = delete;
  ScopedAutocast& operator=(const ScopedAutocast&) = delete;

 private:
  AutocastSettings previous_;
};

// Returns block(input) while keeping only `input` for backward. In backward the block runs again
// with gradients on, the forward's autocast settings and the forward's random-number states (so
// dropout draws the same masks; the CPU's generator and the input's device's), and its parameters'
// gradients accumulate as usual. `block` must not capture anything by reference that dies before
// backward: capture tensors by value.
torch::Tensor CheckpointedForward(std::function<torch::Tensor(const torch::Tensor&)> block,
                                  const torch::Tensor& input);
// The same with a second input the block reads (BLIP-2's Q-Former: the image for cross-attention),
// kept and given its gradient like `input`, so it must not be captured by the block instead.
torch::Tensor CheckpointedForward(
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> block,
    const torch::Tensor& input, const torch::Tensor& context);
// The same with any number of inputs (T5's decoder block: its stream, the position bias, the
// encoder's states), the first the block's residual stream; each kept and given its gradient.
using BlockOfInputs = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;
torch::Tensor CheckpointedForward(BlockOfInputs block, const std::vector<torch::Tensor>& inputs);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_ACTIVATION_CHECKPOINTING_H_
