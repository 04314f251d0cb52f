// Hooks around each block of a model's stacks (outside the block's activation checkpoint): strategy
// fsdp gathers a block's parameters before it and frees them after. Each returns the hidden states
// the model goes on with, so it may put an autograd node in their path (to act in backward).
#ifndef LLMCTL_TRAINER_MODEL_LAYER_HOOKS_H_
#define LLMCTL_TRAINER_MODEL_LAYER_HOOKS_H_

#include <torch/torch.h>

#include <cstdint>

namespace llmctl::trainer {

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  // `layer` numbers the model's blocks across its stacks (BLIP-2: the vision encoder's first,
  // then the Q-Former's, then the language model's), as its FSDP units are numbered.
  virtual torch::Tensor BeforeLayer(int64_t layer, const torch::Tensor& hidden) = 0;  // (B, T, C)
  virtual torch::Tensor AfterLayer(int64_t layer, const torch::Tensor& hidden) = 0;   // (B, T, C)
};

// Where a stack's blocks stand among the model's: the hooks (not owned; null: none) and the number
// of its first block.
struct StackHooks {
  LayerHooks* hooks = nullptr;
  int64_t first_layer = 0;

  torch::Tensor Before(int64_t block, const torch::Tensor& hidden) const {
    return hooks == nullptr ? hidden : hooks->BeforeLayer(first_layer + block, hidden);
  }
  torch::Tensor After(int64_t block, const torch::Tensor& hidden) const {
    return hooks == nullptr ? hidden : hooks->AfterLayer(first_layer + block, hidden);
  }
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_LAYER_HOOKS_H_
