// The LLaMA-family decoder (LLaMA 1/2/3, TinyLlama, OpenLLaMA, Mistral, Qwen2, SmolLM shapes) with Hugging
// Face's parameter names, so a model directory's safetensors load by name and logits match transformers.
//
// B = batch size, T = sequence length, C = hidden size, H = attention heads, K = key/value heads,
// D = head dim, V = vocabulary size.
#ifndef LLMCTL_TRAINER_MODEL_LLAMA_H_
#define LLMCTL_TRAINER_MODEL_LLAMA_H_

#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/model_config.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/model/layer_hooks.h"
#include "trainer/model/projection.h"

namespace llmctl::trainer {

class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t size, double eps);
  // (..., C) -> (..., C), as transformers' LlamaRMSNorm (kernels/fused_ops.h's fused op or the
  // ATen composition).
  torch::Tensor forward(const torch::Tensor& x, Kernels kernels = Kernels::kAten);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RmsNorm);

// cos and sin tables for rotary embeddings: (T, D) each, float32.
struct RotaryTables {
  torch::Tensor cos;
  torch::Tensor sin;
};
RotaryTables MakeRotaryTables(const ModelConfig& config, int64_t seq_len, torch::Device device);

// `nf4` in the constructors below: when set, every decoder projection (q/k/v/o, gate/up/down) gets
// an NF4 base weight, as BitsAndBytesConfig(load_in_4bit) quantises every decoder linear whichever
// get adapters; the embeddings, norms and lm_head stay dense.

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const ModelConfig& config, const std::optional<Nf4Options>& nf4);
  // (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope, Kernels kernels);

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
  Projection q_proj_{nullptr}, k_proj_{nullptr}, v_proj_{nullptr}, o_proj_{nullptr};
};
TORCH_MODULE(Attention);

class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(const ModelConfig& config, const std::optional<Nf4Options>& nf4);
  // SwiGLU: down(silu(gate(x)) * up(x))
  torch::Tensor forward(const torch::Tensor& x, Kernels kernels);

 private:
  Projection gate_proj_{nullptr}, up_proj_{nullptr}, down_proj_{nullptr};
};
TORCH_MODULE(Mlp);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const ModelConfig& config, const std::optional<Nf4Options>& nf4);
  torch::Tensor forward(const torch::Tensor& x, const RotaryTables& rope,
                        Kernels kernels);  // (B, T, C)

 private:
  RmsNorm input_layernorm_{nullptr}, post_attention_layernorm_{nullptr};
  Attention self_attn_{nullptr};
  Mlp mlp_{nullptr};
};
TORCH_MODULE(DecoderLayer);

struct LlamaOptions {
  // Recompute each decoder layer in backward instead of keeping its activations.
  bool activation_checkpointing = false;
  LayerHooks* layer_hooks = nullptr;  // not owned; null: none
  // The decoder block's RMSNorm, SwiGLU and RoPE (the trial key `kernels`).
  Kernels kernels = Kernels::kAten;
};

// "model.*" of a Hugging Face LlamaForCausalLM: embeddings, decoder layers, final norm.
class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const ModelConfig& config, const std::optional<Nf4Options>& nf4);
  // input_ids (B, T) int64 -> final hidden states (B, T, C)
  torch::Tensor forward(const torch::Tensor& input_ids, const LlamaOptions& options);
  torch::nn::Embedding embed_tokens{nullptr};

 private:
  ModelConfig config_;
  torch::nn::ModuleList layers_{nullptr};
  std::vector<DecoderLayer> layer_list_;
  RmsNorm norm_{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(const ModelConfig& config,
                                const std::optional<Nf4Options>& nf4 = std::nullopt);

  // input_ids (B, T) -> hidden states (B, T, C) after the final norm.
  torch::Tensor Hidden(const torch::Tensor& input_ids, const LlamaOptions& options);
  // hidden (N..., C) -> logits (N..., V) in the compute dtype, through lm_head (and its adapter, if
  // any), for any leading shape: (B, T, C) or a chunk of rows (N, C).
  torch::Tensor Logits(const torch::Tensor& hidden);
  // Every parameter Logits reads: the output weight (the embedding matrix when tied) and, with an
  // lm_head adapter, its lora_A and lora_B weights.
  std::vector<torch::Tensor> OutputParameters() const;
  // The output weight (V, C) when Logits is exactly hidden @ weight^T (no adapter, no NF4 base);
  // undefined otherwise.
  torch::Tensor PlainOutputWeight() const;

  const ModelConfig& config() const { return config_; }

  // Every projection by module name ("model.layers.0.self_attn.q_proj", "lm_head"), in module
  // order.
  std::vector<std::pair<std::string, Projection>> NamedProjections();

  // Hugging Face's initialisation: normal(0, 0.02) for linear and embedding weights, zero biases,
  // ones for norms. Deterministic under torch::manual_seed; an NF4 base draws its dense weight (one
  // at a time) in the same order as a dense one, so the same seed gives the same weights,
  // quantised.
  void InitializeRandom(double std = 0.02);

 private:
  ModelConfig config_;
  LlamaModel model_{nullptr};
  // With tied embeddings, a projection over the embedding matrix that owns no weight: an lm_head
  // adapter then applies to the output projection as PEFT's does, under the name PEFT gives it.
  Projection lm_head_{nullptr};
};
TORCH_MODULE(LlamaForCausalLM);

// Mean cross-entropy over the labels that are not -100, with Hugging Face's shift: position t predicts
// label t+1. logits (B, T, V), labels (B, T) int64. Computed in float32; returns the scalar mean.
torch::Tensor CausalLmLoss(const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_LLAMA_H_
