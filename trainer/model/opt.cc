#include "trainer/model/opt.h"

#include <cmath>

#include "trainer/kernels/linear.h"
#include "trainer/model/activation_checkpointing.h"

namespace llmctl::trainer {
namespace {

constexpr int64_t kPositionOffset = 2;  // OPTLearnedPositionalEmbedding's

torch::nn::LayerNorm MakeLayerNorm(int64_t size) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({size}).eps(1e-5));
}

}  // namespace

OptDecoderLayerImpl::OptDecoderLayerImpl(const OptConfig& c, const std::optional<Nf4Options>& nf4)
    : heads_(c.num_attention_heads), dropout_(c.dropout), attention_dropout_(c.attention_dropout) {
  const int64_t width = c.hidden_size;
  auto attention = register_module("self_attn", std::make_shared<torch::nn::Module>());
  q_proj_ = attention->register_module("q_proj", Projection(width, width, /*bias=*/true, nf4));
  k_proj_ = attention->register_module("k_proj", Projection(width, width, /*bias=*/true, nf4));
  v_proj_ = attention->register_module("v_proj", Projection(width, width, /*bias=*/true, nf4));
  out_proj_ = attention->register_module("out_proj", Projection(width, width, /*bias=*/true, nf4));
  self_attn_layer_norm_ = register_module("self_attn_layer_norm", MakeLayerNorm(width));
  fc1_ = register_module("fc1", Projection(width, c.ffn_dim, /*bias=*/true, nf4));
  fc2_ = register_module("fc2", Projection(c.ffn_dim, width, /*bias=*/true, nf4));
  final_layer_norm_ = register_module("final_layer_norm", MakeLayerNorm(width));
}

torch::Tensor OptDecoderLayerImpl::forward(const torch::Tensor& x) {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  const int64_t width = x.size(2);
  const int64_t head_dim = width / heads_;
  auto split = [&](const torch::Tensor& t) {
    return t.view({batch, seq, heads_, head_dim}).transpose(1, 2);  // (B, H, T, D)
  };
  const torch::Tensor normed = self_attn_layer_norm_(x);
  // OPT scales q after its projection and attends unscaled, as transformers does.
  const torch::Tensor q = q_proj_(normed) * (1.0 / std::sqrt(static_cast<double>(head_dim)));
  const torch::Tensor y =
      at::scaled_dot_product_attention(split(q), split(k_proj_(normed)), split(v_proj_(normed)),
                                       /*attn_mask=*/{},
                                       /*dropout_p=*/is_training() ? attention_dropout_ : 0.0,
                                       /*is_causal=*/true, /*scale=*/1.0);  // (B, H, T, D)
  const auto dropout =
      torch::nn::functional::DropoutFuncOptions().p(dropout_).training(is_training());
  const torch::Tensor h =
      x + torch::nn::functional::dropout(out_proj_(y.transpose(1, 2).reshape({batch, seq, width})),
                                         dropout);
  return h + torch::nn::functional::dropout(fc2_(torch::relu(fc1_(final_layer_norm_(h)))), dropout);
}

OptForCausalLMImpl::OptForCausalLMImpl(const OptConfig& c, const std::optional<Nf4Options>& nf4) {
  auto model = register_module("model", std::make_shared<torch::nn::Module>());
  auto decoder = model->register_module("decoder", std::make_shared<torch::nn::Module>());
  embed_tokens_ =
      decoder->register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  auto positions =
      decoder->register_module("embed_positions", std::make_shared<torch::nn::Module>());
  embed_positions_ = positions->register_parameter(
      "weight", torch::zeros({c.max_position_embeddings + kPositionOffset, c.hidden_size}));
  auto list = decoder->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_.push_back(OptDecoderLayer(c, nf4));
    list->push_back(layers_.back());
  }
  final_layer_norm_ = decoder->register_module("final_layer_norm", MakeLayerNorm(c.hidden_size));
}

torch::Tensor OptForCausalLMImpl::Embed(const torch::Tensor& input_ids) {
  return embed_tokens_(input_ids);
}

torch::Tensor OptForCausalLMImpl::Hidden(const torch::Tensor& inputs_embeds) {
  const int64_t seq = inputs_embeds.size(1);
  torch::Tensor h = inputs_embeds + embed_positions_.narrow(0, kPositionOffset, seq);  // (B, T, C)
  const bool checkpoint = checkpoint_layers && torch::GradMode::is_enabled();
  if (checkpoint && !h.requires_grad()) {
    // Frozen embeddings (LoRA): a checkpointed layer whose input needs no gradient never reruns in
    // backward, so its adapters would get none; as transformers' enable_input_require_grads.
    h.requires_grad_(true);
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    OptDecoderLayer& layer = layers_[i];
    h = layer_hooks.Before(static_cast<int64_t>(i), h);
    h = checkpoint
            ? CheckpointedForward([layer](const torch::Tensor& x) mutable { return layer(x); }, h)
            : layer(h);
    h = layer_hooks.After(static_cast<int64_t>(i), h);
  }
  return final_layer_norm_(h);
}

torch::Tensor OptForCausalLMImpl::Logits(const torch::Tensor& hidden) {
  return Linear(hidden, embed_tokens_->weight);
}

}  // namespace llmctl::trainer
