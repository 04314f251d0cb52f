// The linear projection every matrix of the model goes through (q/k/v/o, gate/up/down, lm_head),
// with an optional LoRA adapter as Hugging Face PEFT builds it.
//
// N... = any leading dimensions, I = input features, O = output features, R = adapter rank.
#ifndef LLMCTL_TRAINER_MODEL_PROJECTION_H_
#define LLMCTL_TRAINER_MODEL_PROJECTION_H_

#include <torch/torch.h>

#include <optional>

namespace llmctl::trainer {

struct LoraOptions {
  int64_t r = 8;
  double alpha = 8.0;    // the adapter's output is scaled by alpha / r
  double dropout = 0.0;  // on the adapter's input only, in train mode
};

// Parameter names are Hugging Face's: "weight" and "bias" (when present), and with an adapter
// PEFT's "lora_A.weight" (R, I) and "lora_B.weight" (O, R), so checkpoints and adapters load by
// name.
class ProjectionImpl : public torch::nn::Module {
 public:
  ProjectionImpl(int64_t in_features, int64_t out_features, bool bias);
  // Over a weight (O, I) registered by another module: the tied output projection, whose weight is
  // the embedding matrix. Registers no base parameter, so the weight is counted and loaded once.
  explicit ProjectionImpl(torch::Tensor shared_weight);

  // (N..., I) -> (N..., O): base(x) + lora_B(lora_A(dropout(x))) * alpha / r.
  torch::Tensor forward(const torch::Tensor& x);

  // Adds lora_A (PEFT's init: kaiming-uniform with a = sqrt(5), drawn from the default generator)
  // and lora_B (zeros, so the adapter starts as the identity change), in the base weight's dtype
  // and device.
  void AddAdapter(const LoraOptions& options);
  bool has_adapter() const { return !lora_A.is_empty(); }
  // The adapter as a change of the base weight: (lora_B @ lora_A) * alpha / r, (O, I) in the
  // weight's dtype (computed in float32). Requires has_adapter().
  torch::Tensor MergedDelta() const;

  const torch::Tensor& weight() const { return weight_; }  // (O, I)
  const torch::Tensor& bias() const { return bias_; }      // (O,) or undefined

  torch::nn::Linear lora_A{nullptr};  // I -> R, no bias
  torch::nn::Linear lora_B{nullptr};  // R -> O, no bias

 private:
  // The frozen or trained base path: a dense matmul. The one place a quantised base weight would
  // plug in.
  torch::Tensor Base(const torch::Tensor& x) const;

  torch::Tensor weight_;
  torch::Tensor bias_;
  std::optional<LoraOptions> lora_;
};
TORCH_MODULE(Projection);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_PROJECTION_H_
