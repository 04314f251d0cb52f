// OPT's decoder (Hugging Face's OPTForCausalLM, the pre-LN variants: 125m, 1.3b, 2.7b, 6.7b and up)
// with its parameter names under a prefix, as BLIP-2 holds it (language_model.model.decoder...):
// learned positions offset by 2, pre-LN blocks with biased projections, q scaled before the
// product, a ReLU FFN, dropout on each block's two outputs in training, a final LayerNorm and an
// output head tied to the token embedding. The six linears of each layer are Projections (LoRA
// adapters by PEFT's names q_proj, k_proj, v_proj, out_proj, fc1, fc2); with `nf4` their base
// weights are NF4, as BitsAndBytesConfig(load_in_4bit) quantises every decoder linear.
//
// B = batch, T = sequence, C = width, V = vocabulary.
#ifndef LLMCTL_TRAINER_MODEL_OPT_H_
#define LLMCTL_TRAINER_MODEL_OPT_H_

#include <torch/torch.h>

#include <optional>
#include <vector>

#include "common/blip2_config.h"
#include "trainer/model/layer_hooks.h"
#include "trainer/model/projection.h"

namespace llmctl::trainer {

class OptDecoderLayerImpl : public torch::nn::Module {
 public:
  OptDecoderLayerImpl(const OptConfig& config, const std::optional<Nf4Options>& nf4);
  torch::Tensor forward(const torch::Tensor& x);  // (B, T, C) -> (B, T, C), causal

 private:
  int64_t heads_;
  double dropout_, attention_dropout_;  // in training (OptConfig's)
  torch::nn::LayerNorm self_attn_layer_norm_{nullptr}, final_layer_norm_{nullptr};
  Projection q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, out_proj_{nullptr};
  Projection fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(OptDecoderLayer);

class OptForCausalLMImpl : public torch::nn::Module {
 public:
  OptForCausalLMImpl(const OptConfig& config, const std::optional<Nf4Options>& nf4);
  torch::Tensor Embed(const torch::Tensor& input_ids);  // (B, T) -> (B, T, C)
  // Token embeddings (B, T, C) -> final hidden states (B, T, C). Positions 0..T-1: right padding
  // only (a padded row's real tokens come first, so their positions are OPT's too).
  torch::Tensor Hidden(const torch::Tensor& inputs_embeds);
  torch::Tensor Logits(const torch::Tensor& hidden);  // (B, T, C) -> (B, T, V), the tied head
  // The one weight Logits reads: the embedding matrix (V, C).
  torch::Tensor OutputWeight() const { return embed_tokens_->weight; }

  bool checkpoint_layers = false;  // each decoder layer through CheckpointedForward
  StackHooks layer_hooks;          // around each block (strategy fsdp)

 private:
  torch::nn::Embedding embed_tokens_{nullptr};
  torch::Tensor embed_positions_;  // (max_position_embeddings + 2, C)
  std::vector<OptDecoderLayer> layers_;
  torch::nn::LayerNorm final_layer_norm_{nullptr};
};
TORCH_MODULE(OptForCausalLM);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_OPT_H_
