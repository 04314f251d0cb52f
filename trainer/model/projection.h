// The linear projection every matrix of the model goes through (q/k/v/o, gate/up/down, lm_head),
// with an optional LoRA adapter as Hugging Face PEFT builds it, over a dense or an NF4 base weight
// (QLoRA, as bitsandbytes' Linear4bit).
//
// N... = any leading dimensions, I = input features, O = output features, R = adapter rank.
#ifndef LLMCTL_TRAINER_MODEL_PROJECTION_H_
#define LLMCTL_TRAINER_MODEL_PROJECTION_H_

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "trainer/quant/quant.h"

namespace llmctl::trainer {

struct LoraOptions {
  int64_t r = 8;
  double alpha = 8.0;    // the adapter's output is scaled by alpha / r
  double dropout = 0.0;  // on the adapter's input only, in train mode
};

// An NF4 base weight, as BitsAndBytesConfig(load_in_4bit, bnb_4bit_quant_type="nf4") gives it.
struct Nf4Options {
  bool double_quant = true;  // bnb_4bit_use_double_quant
  // bnb_4bit_compute_dtype: the weight is dequantised to it and the matmul runs in it.
  torch::ScalarType compute_dtype = torch::kBFloat16;
};

// Parameter names are Hugging Face's: "weight" and "bias" (when present), and with an adapter
// PEFT's "lora_A.weight" (R, I) and "lora_B.weight" (O, R), so checkpoints and adapters load by
// name. An NF4 base has no "weight" parameter: its Nf4Weight's tensors are buffers ("nf4_packed",
// and "nf4_quantized_absmax", "nf4_nested_absmax", "nf4_offset" or "nf4_absmax"), so they move with
// the module, count as parameter bytes and are saved in checkpoints.
class ProjectionImpl : public torch::nn::Module {
 public:
  // A dense base weight, or with `nf4` an NF4 one that never exists densely here. Tensors are
  // allocated, not filled: values come from SetBaseWeight (InitializeRandom, LoadWeights) or a
  // checkpoint. Dense tensors get the default dtype, which BuildModel sets to the run's dtype.
  ProjectionImpl(int64_t in_features, int64_t out_features, bool bias,
                 const std::optional<Nf4Options>& nf4 = std::nullopt);
  // Over a weight (O, I) registered by another module: the tied output projection, whose weight is
  // the embedding matrix. Registers no base parameter, so the weight is counted and loaded once.
  explicit ProjectionImpl(torch::Tensor shared_weight);

  // (N..., I) -> (N..., O): base(x) + lora_B(lora_A(dropout(x))) * alpha / r.
  torch::Tensor forward(const torch::Tensor& x);

  // Adds lora_A (PEFT's init: kaiming-uniform with a = sqrt(5), drawn from the default generator)
  // and lora_B (zeros, so the adapter starts as the identity change), in the parameters' dtype and
  // the base weight's device.
  void AddAdapter(const LoraOptions& options);
  bool has_adapter() const { return !lora_A.is_empty(); }
  // The adapter as a change of the base weight: (lora_B @ lora_A) * alpha / r, (O, I) in the
  // parameters' dtype (computed in float32). Requires has_adapter().
  torch::Tensor MergedDelta() const;

  // Every parameter forward reads, a shared weight included (not the NF4 buffers, which get no
  // gradient): what a caller that recomputes forward itself, such as the chunked loss, must list.
  std::vector<torch::Tensor> ForwardParameters() const;

  // The weight (O, I) when forward is exactly x @ weight^T (a dense base without bias or
  // adapter), so a caller may do that matmul's arithmetic itself (the chunked loss); undefined
  // otherwise.
  torch::Tensor PlainWeight() const;
  bool is_quantized() const { return nf4_.has_value(); }
  const Nf4Weight& nf4_weight() const { return *nf4_; }  // requires is_quantized()
  // An unfilled dense (O, I) tensor in the parameters' dtype, on the base weight's device: what
  // SetBaseWeight takes.
  torch::Tensor EmptyDenseWeight() const;
  // Sets the base weight from a dense (O, I) tensor: copied, or quantised into the NF4 buffers, so
  // the caller can drop the dense tensor right after.
  void SetBaseWeight(const torch::Tensor& weight);
  // The base weight (O, I) in the parameters' dtype: the weight itself, or the NF4 weight
  // dequantised (a new tensor).
  torch::Tensor DenseWeight() const;

  torch::nn::Linear lora_A{nullptr};  // I -> R, no bias
  torch::nn::Linear lora_B{nullptr};  // R -> O, no bias

 private:
  // The frozen or trained base path: a dense matmul, or Nf4Linear in the compute dtype with the
  // result cast back to x's dtype, as Linear4bit.forward does.
  torch::Tensor Base(const torch::Tensor& x) const;
  torch::Device device() const;

  int64_t in_features_;
  int64_t out_features_;
  torch::ScalarType dtype_;  // the parameters' dtype (the dense weight's, bias and adapters)
  torch::Tensor weight_;     // (O, I); undefined with an NF4 base
  std::optional<Nf4Weight> nf4_;
  torch::ScalarType compute_dtype_ = torch::kFloat32;  // with an NF4 base
  torch::Tensor bias_;
  std::optional<LoraOptions> lora_;
};
TORCH_MODULE(Projection);

// Every Projection under `module`, by its name there ("model.layers.0.self_attn.q_proj"), in
// named_modules() order: what LoRA targets and QLoRA quantises.
std::vector<std::pair<std::string, Projection>> NamedProjections(torch::nn::Module& module);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_PROJECTION_H_
