#include "trainer/model/t5.h"

#include <cmath>
#include <limits>

#include "trainer/model/activation_checkpointing.h"

namespace llmctl::trainer {
namespace {

namespace F = torch::nn::functional;

torch::Tensor Dropout(const torch::Tensor& x, double p, bool training) {
  return F::dropout(x, F::DropoutFuncOptions().p(p).training(training));
}

// The most negative finite value of `dtype`: what a masked logit becomes, as transformers' masks.
c10::Scalar Lowest(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kBFloat16:
      return std::numeric_limits<c10::BFloat16>::lowest();
    case torch::kHalf:
      return std::numeric_limits<c10::Half>::lowest();
    case torch::kDouble:
      return std::numeric_limits<double>::lowest();
    default:
      return std::numeric_limits<float>::lowest();
  }
}

// A sublayer holder named as transformers' T5Block.layer[i] (T5LayerSelfAttention, ...).
std::shared_ptr<torch::nn::Module> AddSublayer(torch::nn::ModuleListImpl& list) {
  auto sublayer = std::make_shared<torch::nn::Module>();
  list.push_back(sublayer);
  return sublayer;
}

}  // namespace

torch::Tensor RelativePositionBuckets(int64_t query_length, int64_t key_length, bool bidirectional,
                                      int64_t num_buckets, int64_t max_distance,
                                      torch::Device device) {
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(device);
  // memory_position - context_position: (Tq, Tk)
  torch::Tensor relative = torch::arange(key_length, longs).unsqueeze(0) -
                           torch::arange(query_length, longs).unsqueeze(1);
  torch::Tensor buckets = torch::zeros_like(relative);
  if (bidirectional) {
    num_buckets /= 2;
    buckets += (relative > 0).to(torch::kLong) * num_buckets;
    relative = relative.abs();
  } else {
    relative = -torch::min(relative, torch::zeros_like(relative));
  }
  // Half the buckets are exact distances, the other half logarithmic bins up to max_distance.
  const int64_t max_exact = num_buckets / 2;
  const torch::Tensor is_small = relative < max_exact;
  torch::Tensor large =
      max_exact + (torch::log(relative.to(torch::kFloat32) / static_cast<double>(max_exact)) /
                   std::log(static_cast<double>(max_distance) / max_exact) *
                   static_cast<double>(num_buckets - max_exact))
                      .to(torch::kLong);
  large = torch::min(large, torch::full_like(large, num_buckets - 1));
  return buckets + torch::where(is_small, relative, large);
}

T5AttentionImpl::T5AttentionImpl(const T5Config& c, bool relative_bias,
                                 const std::optional<Nf4Options>& nf4)
    : heads_(c.num_heads),
      head_dim_(c.d_kv),
      num_buckets_(c.relative_attention_num_buckets),
      max_distance_(c.relative_attention_max_distance),
      dropout_(c.dropout_rate) {
  const int64_t inner = c.inner_dim();
  q_ = register_module("q", Projection(c.d_model, inner, /*bias=*/false, nf4));
  k_ = register_module("k", Projection(c.d_model, inner, /*bias=*/false, nf4));
  v_ = register_module("v", Projection(c.d_model, inner, /*bias=*/false, nf4));
  o_ = register_module("o", Projection(inner, c.d_model, /*bias=*/false, nf4));
  if (relative_bias) {
    relative_attention_bias_ = register_module(
        "relative_attention_bias", torch::nn::Embedding(c.relative_attention_num_buckets, heads_));
  }
}

torch::Tensor T5AttentionImpl::PositionBias(int64_t query_length, int64_t key_length,
                                            bool bidirectional) {
  const torch::Tensor buckets =
      RelativePositionBuckets(query_length, key_length, bidirectional, num_buckets_, max_distance_,
                              relative_attention_bias_->weight.device());
  return relative_attention_bias_(buckets).permute({2, 0, 1}).unsqueeze(0);  // (1, H, Tq, Tk)
}

torch::Tensor T5AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& context,
                                       const torch::Tensor& bias) {
  const int64_t batch = x.size(0);
  auto split = [&](const torch::Tensor& t) {
    return t.view({batch, t.size(1), heads_, head_dim_}).transpose(1, 2);  // (B, H, T, D)
  };
  // T5 folds its scale into the initialisation: the logits are q·k unscaled, plus the bias.
  const torch::Tensor y = at::scaled_dot_product_attention(
      split(q_(x)), split(k_(context)), split(v_(context)), bias,
      /*dropout_p=*/is_training() ? dropout_ : 0.0, /*is_causal=*/false, /*scale=*/1.0);
  return o_(y.transpose(1, 2).reshape({batch, x.size(1), heads_ * head_dim_}));
}

T5FeedForwardImpl::T5FeedForwardImpl(const T5Config& c, const std::optional<Nf4Options>& nf4)
    : dropout_(c.dropout_rate) {
  auto dense = register_module("DenseReluDense", std::make_shared<torch::nn::Module>());
  if (c.gated_gelu) {
    wi_0_ = dense->register_module("wi_0", Projection(c.d_model, c.d_ff, /*bias=*/false, nf4));
    wi_1_ = dense->register_module("wi_1", Projection(c.d_model, c.d_ff, /*bias=*/false, nf4));
  } else {
    wi_ = dense->register_module("wi", Projection(c.d_model, c.d_ff, /*bias=*/false, nf4));
  }
  wo_ = dense->register_module("wo", Projection(c.d_ff, c.d_model, /*bias=*/false));
  layer_norm_ = register_module("layer_norm", RmsNorm(c.d_model, c.layer_norm_epsilon));
}

torch::Tensor T5FeedForwardImpl::forward(const torch::Tensor& x, Kernels kernels) {
  const torch::Tensor normed = layer_norm_(x, kernels);
  torch::Tensor inner;  // (B, T, F)
  if (wi_) {
    inner = torch::relu(wi_(normed));
  } else if (kernels == Kernels::kFused) {
    inner = FusedGeGlu(wi_0_(normed), wi_1_(normed));
  } else {
    inner = AtenGeluNew(wi_0_(normed)) * wi_1_(normed);
  }
  return x + Dropout(wo_(Dropout(inner, dropout_, is_training())), dropout_, is_training());
}

T5BlockImpl::T5BlockImpl(const T5Config& c, bool decoder, bool relative_bias,
                         const std::optional<Nf4Options>& nf4)
    : dropout_(c.dropout_rate) {
  auto layers = register_module("layer", torch::nn::ModuleList());
  auto self = AddSublayer(*layers);
  self_attention_ = self->register_module("SelfAttention", T5Attention(c, relative_bias, nf4));
  self_norm_ = self->register_module("layer_norm", RmsNorm(c.d_model, c.layer_norm_epsilon));
  if (decoder) {
    auto cross = AddSublayer(*layers);
    cross_attention_ =
        cross->register_module("EncDecAttention", T5Attention(c, /*relative_bias=*/false, nf4));
    cross_norm_ = cross->register_module("layer_norm", RmsNorm(c.d_model, c.layer_norm_epsilon));
  }
  feed_forward_ = T5FeedForward(c, nf4);
  layers->push_back(feed_forward_);
}

torch::Tensor T5BlockImpl::forward(const torch::Tensor& h, const torch::Tensor& self_bias,
                                   const torch::Tensor& encoder, const torch::Tensor& cross_mask,
                                   Kernels kernels) {
  const torch::Tensor normed = self_norm_(h, kernels);
  torch::Tensor x =
      h + Dropout(self_attention_(normed, normed, self_bias), dropout_, is_training());
  if (cross_attention_) {
    x = x + Dropout(cross_attention_(cross_norm_(x, kernels), encoder, cross_mask), dropout_,
                    is_training());
  }
  return feed_forward_(x, kernels);
}

T5StackImpl::T5StackImpl(const T5Config& c, bool decoder, const std::optional<Nf4Options>& nf4)
    : decoder_(decoder), dropout_(c.dropout_rate) {
  auto list = register_module("block", torch::nn::ModuleList());
  const int64_t count = decoder ? c.num_decoder_layers : c.num_layers;
  for (int64_t i = 0; i < count; ++i) {
    blocks_.push_back(T5Block(c, decoder, /*relative_bias=*/i == 0, nf4));
    list->push_back(blocks_.back());
  }
  final_layer_norm_ = register_module("final_layer_norm", RmsNorm(c.d_model, c.layer_norm_epsilon));
}

torch::Tensor T5StackImpl::forward(const torch::Tensor& embeds, const torch::Tensor& key_mask,
                                   const torch::Tensor& encoder) {
  const int64_t length = embeds.size(1);
  // Block 0's bias serves every block, with the masked logits at the lowest value: (1 or B, H, T,
  // T).
  torch::Tensor self_bias =
      blocks_.front()->self_attention()->PositionBias(length, length, /*bidirectional=*/!decoder_);
  torch::Tensor cross_mask;  // (B, 1, 1, S) bool: the encoder's real tokens
  if (decoder_) {
    const torch::Tensor causal = torch::ones(
        {length, length}, torch::TensorOptions().dtype(torch::kBool).device(embeds.device()));
    self_bias = torch::where(causal.tril(), self_bias, Lowest(self_bias.scalar_type()));
    cross_mask = key_mask.unsqueeze(1).unsqueeze(1);
  } else {
    self_bias = torch::where(key_mask.unsqueeze(1).unsqueeze(1), self_bias,
                             Lowest(self_bias.scalar_type()));
  }
  torch::Tensor h = Dropout(embeds, dropout_, is_training());
  const bool checkpoint = checkpoint_layers && torch::GradMode::is_enabled();
  if (checkpoint && !h.requires_grad()) {
    // Frozen embeddings (LoRA): a checkpointed block whose input needs no gradient never reruns
    // in backward, so its adapters would get none; as transformers' enable_input_require_grads.
    h.requires_grad_(true);
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    T5Block& block = blocks_[i];
    h = layer_hooks.Before(static_cast<int64_t>(i), h);
    if (checkpoint) {
      // The bias (block 0's trained embedding) and a decoder's encoder states are kept inputs with
      // their own gradients, as transformers passes them into each checkpointed block; the mask
      // is read.
      std::vector<torch::Tensor> kept = {h, self_bias};
      if (decoder_) kept.push_back(encoder);
      h = CheckpointedForward(
          [block, cross_mask, kernels = kernels](const std::vector<torch::Tensor>& x) mutable {
            return block(x[0], x[1], x.size() > 2 ? x[2] : torch::Tensor(), cross_mask, kernels);
          },
          kept);
    } else {
      h = block(h, self_bias, encoder, cross_mask, kernels);
    }
    h = layer_hooks.After(static_cast<int64_t>(i), h);
  }
  return Dropout(final_layer_norm_(h, kernels), dropout_, is_training());
}

T5ForConditionalGenerationImpl::T5ForConditionalGenerationImpl(const T5Config& c,
                                                               const std::optional<Nf4Options>& nf4)
    : pad_token_id_(c.pad_token_id),
      decoder_start_token_id_(c.decoder_start_token_id),
      output_scale_(c.tie_word_embeddings ? 1.0 / std::sqrt(static_cast<double>(c.d_model)) : 1.0) {
  shared_ = register_module("shared", torch::nn::Embedding(c.vocab_size, c.d_model));
  encoder_ = register_module("encoder", T5Stack(c, /*decoder=*/false, nf4));
  decoder_ = register_module("decoder", T5Stack(c, /*decoder=*/true, nf4));
  // BitsAndBytesConfig(load_in_4bit) leaves the output head dense, as for every family.
  lm_head_ = register_module("lm_head", c.tie_word_embeddings
                                            ? Projection(shared_->weight)
                                            : Projection(c.d_model, c.vocab_size, /*bias=*/false));
}

torch::Tensor T5ForConditionalGenerationImpl::Embed(const torch::Tensor& input_ids) {
  return shared_(input_ids);
}

torch::Tensor T5ForConditionalGenerationImpl::Encode(const torch::Tensor& inputs_embeds,
                                                     const torch::Tensor& attention_mask) {
  return encoder_(inputs_embeds, attention_mask);
}

torch::Tensor T5ForConditionalGenerationImpl::DecoderHidden(const torch::Tensor& labels,
                                                            const torch::Tensor& encoder,
                                                            const torch::Tensor& attention_mask) {
  // _shift_right: (B, T) -> start token, then labels[:, :-1], with -100 read as padding.
  torch::Tensor inputs = torch::constant_pad_nd(labels.narrow(1, 0, labels.size(1) - 1), {1, 0},
                                                decoder_start_token_id_);
  inputs = inputs.masked_fill(inputs == -100, pad_token_id_);
  return decoder_(shared_(inputs), attention_mask, encoder);
}

torch::Tensor T5ForConditionalGenerationImpl::Logits(const torch::Tensor& hidden) {
  return lm_head_(output_scale_ == 1.0 ? hidden : hidden * output_scale_);
}

std::vector<torch::Tensor> T5ForConditionalGenerationImpl::OutputParameters() const {
  return lm_head_->ForwardParameters();
}

torch::Tensor T5ForConditionalGenerationImpl::PlainOutputWeight() const {
  return output_scale_ == 1.0 ? lm_head_->PlainWeight() : torch::Tensor();
}

void T5ForConditionalGenerationImpl::SetKernels(Kernels kernels) {
  encoder_->kernels = kernels;
  decoder_->kernels = kernels;
}

void T5ForConditionalGenerationImpl::SetActivationCheckpointing(bool on) {
  encoder_->checkpoint_layers = on;
  decoder_->checkpoint_layers = on;
}

}  // namespace llmctl::trainer
