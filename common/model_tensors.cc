// ParameterCount, CheckpointTensorCount and CheckpointTensors (model_config.h): a model's
// parameters counted and listed tensor by tensor, as a Hugging Face checkpoint names them.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "common/model_config.h"

namespace llmctl {

uint64_t ParameterCount(const ModelConfig& config) {
  // Every size is positive and at most INT64_MAX once validated, but their products need not fit:
  // a config.json may state any size. Saturating at UINT64_MAX keeps absurd shapes absurd instead
  // of overflowing (undefined for the signed head products) or wrapping to a small count.
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  auto mul = [](uint64_t a, uint64_t b) {
    uint64_t product = 0;
    return __builtin_mul_overflow(a, b, &product) ? kMax : product;
  };
  auto add = [](uint64_t a, uint64_t b) {
    uint64_t sum = 0;
    return __builtin_add_overflow(a, b, &sum) ? kMax : sum;
  };
  auto size = [](int64_t value) { return static_cast<uint64_t>(std::max<int64_t>(value, 0)); };
  const uint64_t hidden = size(config.hidden_size);
  const uint64_t intermediate = size(config.intermediate_size);
  const uint64_t query_width = mul(size(config.num_attention_heads), size(config.head_dim));
  const uint64_t kv_width = mul(size(config.num_key_value_heads), size(config.head_dim));

  // q and o are hidden x query_width, k and v hidden x kv_width.
  uint64_t attention = add(mul(2, mul(hidden, query_width)), mul(2, mul(hidden, kv_width)));
  if (config.attention_qkv_bias) attention = add(attention, add(query_width, mul(2, kv_width)));
  if (config.attention_output_bias) attention = add(attention, hidden);
  uint64_t mlp = mul(3, mul(hidden, intermediate));  // gate, up, down
  if (config.mlp_bias) mlp = add(mlp, add(mul(2, intermediate), hidden));
  const uint64_t norms = mul(2, hidden);  // before attention, before the MLP
  const uint64_t per_layer = add(add(attention, mlp), norms);

  const uint64_t embedding = mul(size(config.vocab_size), hidden);
  const uint64_t lm_head = config.tie_word_embeddings ? 0 : embedding;
  const uint64_t final_norm = hidden;
  return add(add(add(embedding, mul(size(config.num_hidden_layers), per_layer)), final_norm),
             lm_head);
}

namespace {

int64_t TensorsPerLayer(const ModelConfig& config) {
  return 4 + (config.attention_qkv_bias ? 3 : 0) + (config.attention_output_bias ? 1 : 0) + 3 +
         (config.mlp_bias ? 3 : 0) + 2;
}

}  // namespace

int64_t CheckpointTensorCount(const ModelConfig& config) {
  const int64_t layers = std::max<int64_t>(config.num_hidden_layers, 0);
  const int64_t outside_layers = 2 + (config.tie_word_embeddings ? 0 : 1);  // embedding, norm, head
  if (layers > (std::numeric_limits<int64_t>::max() - outside_layers) / TensorsPerLayer(config)) {
    return std::numeric_limits<int64_t>::max();
  }
  return layers * TensorsPerLayer(config) + outside_layers;
}

std::vector<CheckpointTensor> CheckpointTensors(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t query_width = config.num_attention_heads * config.head_dim;
  const int64_t kv_width = config.num_key_value_heads * config.head_dim;
  std::vector<CheckpointTensor> tensors;
  tensors.reserve(static_cast<size_t>(CheckpointTensorCount(config)));
  tensors.push_back({"model.embed_tokens.weight", {config.vocab_size, hidden}});
  const auto linear = [&](const std::string& name, int64_t in, int64_t out, bool bias) {
    tensors.push_back({name + ".weight", {out, in}});
    if (bias) tensors.push_back({name + ".bias", {out}});
  };
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    linear(layer + "self_attn.q_proj", hidden, query_width, config.attention_qkv_bias);
    linear(layer + "self_attn.k_proj", hidden, kv_width, config.attention_qkv_bias);
    linear(layer + "self_attn.v_proj", hidden, kv_width, config.attention_qkv_bias);
    linear(layer + "self_attn.o_proj", query_width, hidden, config.attention_output_bias);
    linear(layer + "mlp.gate_proj", hidden, config.intermediate_size, config.mlp_bias);
    linear(layer + "mlp.up_proj", hidden, config.intermediate_size, config.mlp_bias);
    linear(layer + "mlp.down_proj", config.intermediate_size, hidden, config.mlp_bias);
    tensors.push_back({layer + "input_layernorm.weight", {hidden}});
    tensors.push_back({layer + "post_attention_layernorm.weight", {hidden}});
  }
  tensors.push_back({"model.norm.weight", {hidden}});
  if (!config.tie_word_embeddings)
    tensors.push_back({"lm_head.weight", {config.vocab_size, hidden}});
  return tensors;
}

}  // namespace llmctl
