#include "trainer/model/llama.h"

#include <ATen/autocast_mode.h>

#include <cmath>
#include <numbers>

#include "trainer/model/activation_checkpointing.h"
#include "trainer/model/weights.h"

namespace llmctl::trainer {
namespace {

// Inverse frequencies (D/2,), with Llama 3's piecewise rescaling when configured.
torch::Tensor InverseFrequencies(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  auto exponents = torch::arange(0, dim, 2, torch::kFloat64) / static_cast<double>(dim);
  auto inv_freq = 1.0 / torch::pow(config.rope_theta, exponents);
  if (config.rope_scaling) {
    const RopeScaling& s = *config.rope_scaling;
    const double old_context = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_context / s.low_freq_factor;
    const double high_freq_wavelen = old_context / s.high_freq_factor;
    auto wavelen = 2.0 * std::numbers::pi / inv_freq;
    auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
    auto smooth =
        (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    auto smoothed = (1.0 - smooth) * scaled / s.factor + smooth * scaled;
    auto is_medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
    inv_freq = torch::where(is_medium, smoothed, scaled);
  }
  return inv_freq.to(torch::kFloat32);
}

}  // namespace

RmsNormImpl::RmsNormImpl(int64_t size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x, Kernels kernels) {
  return RmsNormWith(kernels, x, weight, eps_);
}

RotaryTables MakeRotaryTables(const ModelConfig& config, int64_t seq_len, torch::Device device) {
  auto inv_freq = InverseFrequencies(config).to(device);  // (D/2,)
  auto positions =
      torch::arange(seq_len, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  auto freqs = torch::outer(positions, inv_freq);  // (T, D/2)
  auto angles = torch::cat({freqs, freqs}, -1);    // (T, D)
  return {angles.cos(), angles.sin()};
}

AttentionImpl::AttentionImpl(const ModelConfig& c, const std::optional<Nf4Options>& nf4)
    : num_heads_(c.num_attention_heads),
      num_kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim) {
  const bool qkv_bias = c.attention_qkv_bias;
  q_proj_ =
      register_module("q_proj", Projection(c.hidden_size, num_heads_ * head_dim_, qkv_bias, nf4));
  k_proj_ = register_module("k_proj",
                            Projection(c.hidden_size, num_kv_heads_ * head_dim_, qkv_bias, nf4));
  v_proj_ = register_module("v_proj",
                            Projection(c.hidden_size, num_kv_heads_ * head_dim_, qkv_bias, nf4));
  o_proj_ = register_module(
      "o_proj", Projection(num_heads_ * head_dim_, c.hidden_size, c.attention_output_bias, nf4));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                     Kernels kernels) {
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  auto q = q_proj_(x).view({batch, seq, num_heads_, head_dim_});                     // (B, T, H, D)
  auto k = k_proj_(x).view({batch, seq, num_kv_heads_, head_dim_});                  // (B, T, K, D)
  auto v = v_proj_(x).view({batch, seq, num_kv_heads_, head_dim_}).transpose(1, 2);  // (B, K, T, D)
  q = RopeToHeadsWith(kernels, q, rope.cos, rope.sin);                               // (B, H, T, D)
  k = RopeToHeadsWith(kernels, k, rope.cos, rope.sin);                               // (B, K, T, D)
  bool grouped = num_heads_ != num_kv_heads_;
  if (grouped && q.is_cuda() && q.scalar_type() == torch::kFloat32) {
    // On CUDA, float32 gets SDPA's memory-efficient kernel, which takes no grouped-query attention:
    // with enable_gqa SDPA falls back to its math path, which keeps the attention probabilities
    // (B, H, T, T) of every layer (TinyLlama at 8 x 512 on an H200: 6.2 GiB more). Repeating the
    // keys and values to every head first, as LitGPT does, keeps two (B, H, T, D) copies instead.
    k = k.repeat_interleave(num_heads_ / num_kv_heads_, /*dim=*/1);  // (B, H, T, D)
    v = v.repeat_interleave(num_heads_ / num_kv_heads_, /*dim=*/1);  // (B, H, T, D)
    grouped = false;
  }
  // Right padding only: real tokens never attend to padding under the causal mask, and padded
  // positions carry no labels, so no padding mask is needed.
  auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, /*scale=*/std::nullopt,
                                            /*enable_gqa=*/grouped);  // (B, H, T, D)
  y = y.transpose(1, 2).reshape({batch, seq, num_heads_ * head_dim_});
  return o_proj_(y);
}

MlpImpl::MlpImpl(const ModelConfig& c, const std::optional<Nf4Options>& nf4) {
  gate_proj_ =
      register_module("gate_proj", Projection(c.hidden_size, c.intermediate_size, c.mlp_bias, nf4));
  up_proj_ =
      register_module("up_proj", Projection(c.hidden_size, c.intermediate_size, c.mlp_bias, nf4));
  down_proj_ =
      register_module("down_proj", Projection(c.intermediate_size, c.hidden_size, c.mlp_bias, nf4));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x, Kernels kernels) {
  if (kernels == Kernels::kAten) return down_proj_(torch::silu(gate_proj_(x)) * up_proj_(x));
  const torch::Tensor gate = gate_proj_(x);
  const torch::Tensor up = up_proj_(x);
  // A plain down_proj whose weight trains would keep the product for its gradient: the fused node
  // recomputes it instead. Under autocast only where the linear layer would cast nothing (fsdp's
  // gathered weights are in autocast's dtype already); otherwise its casts are autocast's to make.
  const torch::Tensor weight = down_proj_->PlainWeight();
  const c10::DeviceType device = x.device().type();
  const bool recomputes = weight.defined() && weight.requires_grad() &&
                          (!at::autocast::is_autocast_enabled(device) ||
                           weight.scalar_type() == at::autocast::get_autocast_dtype(device));
  if (!recomputes) return down_proj_(FusedSwiGlu(gate, up));
  return FusedSwiGluLinear(gate, up, weight);
}

DecoderLayerImpl::DecoderLayerImpl(const ModelConfig& c, const std::optional<Nf4Options>& nf4) {
  self_attn_ = register_module("self_attn", Attention(c, nf4));
  mlp_ = register_module("mlp", Mlp(c, nf4));
  input_layernorm_ = register_module("input_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", RmsNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const RotaryTables& rope,
                                        Kernels kernels) {
  auto h = x + self_attn_->forward(input_layernorm_->forward(x, kernels), rope, kernels);
  return h + mlp_->forward(post_attention_layernorm_->forward(h, kernels), kernels);
}

LlamaModelImpl::LlamaModelImpl(const ModelConfig& c, const std::optional<Nf4Options>& nf4)
    : config_(c) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layer_list_.push_back(DecoderLayer(c, nf4));
    layers_->push_back(layer_list_.back());
  }
  norm_ = register_module("norm", RmsNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& input_ids, const LlamaOptions& options) {
  auto h = embed_tokens(input_ids);  // (B, T, C)
  if (options.activation_checkpointing && torch::GradMode::is_enabled() && !h.requires_grad()) {
    // A frozen embedding (LoRA) gives the first layer an input that needs no gradient, and a
    // checkpointed block whose input needs none never reruns in backward, so its adapters would get
    // no gradient. As transformers' enable_input_require_grads, make the input require one.
    h.requires_grad_(true);
  }
  const RotaryTables rope = MakeRotaryTables(config_, input_ids.size(1), input_ids.device());
  for (size_t i = 0; i < layer_list_.size(); ++i) {
    DecoderLayer& layer = layer_list_[i];
    if (options.layer_hooks != nullptr)
      h = options.layer_hooks->BeforeLayer(static_cast<int64_t>(i), h);
    if (options.activation_checkpointing && torch::GradMode::is_enabled()) {
      h = CheckpointedForward(
          [layer, rope, kernels = options.kernels](const torch::Tensor& input) mutable {
            return layer->forward(input, rope, kernels);
          },
          h);
    } else {
      h = layer->forward(h, rope, options.kernels);
    }
    if (options.layer_hooks != nullptr)
      h = options.layer_hooks->AfterLayer(static_cast<int64_t>(i), h);
  }
  return norm_->forward(h, options.kernels);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const ModelConfig& c,
                                           const std::optional<Nf4Options>& nf4)
    : config_(c) {
  model_ = register_module("model", LlamaModel(c, nf4));
  lm_head_ = register_module(
      "lm_head", c.tie_word_embeddings ? Projection(model_->embed_tokens->weight)
                                       : Projection(c.hidden_size, c.vocab_size, /*bias=*/false));
}

torch::Tensor LlamaForCausalLMImpl::Hidden(const torch::Tensor& input_ids,
                                           const LlamaOptions& options) {
  return model_->forward(input_ids, options);
}

torch::Tensor LlamaForCausalLMImpl::Logits(const torch::Tensor& hidden) { return lm_head_(hidden); }

std::vector<torch::Tensor> LlamaForCausalLMImpl::OutputParameters() const {
  return lm_head_->ForwardParameters();
}

torch::Tensor LlamaForCausalLMImpl::PlainOutputWeight() const { return lm_head_->PlainWeight(); }

std::vector<std::pair<std::string, Projection>> LlamaForCausalLMImpl::NamedProjections() {
  return trainer::NamedProjections(*this);
}

void LlamaForCausalLMImpl::InitializeRandom(double std) { InitializeLikeHuggingFace(*this, std); }

torch::Tensor CausalLmLoss(const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t vocab = logits.size(-1);
  // Shift the labels, not the logits (as transformers does): position t is scored against label
  // t+1, and the last position gets -100. Narrowing the logits instead would copy all B*T*V of
  // them.
  auto next_labels = torch::constant_pad_nd(labels.narrow(1, 1, labels.size(1) - 1), {0, 1}, -100);
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32).reshape({-1, vocab}), next_labels.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kMean));
}

}  // namespace llmctl::trainer
