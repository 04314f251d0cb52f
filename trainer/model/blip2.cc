#include "trainer/model/blip2.h"

#include "trainer/kernels/linear.h"
#include "trainer/model/activation_checkpointing.h"
#include "trainer/model/loss.h"
#include "trainer/model/weights.h"

namespace llmctl::trainer {
namespace {

namespace F = torch::nn::functional;

// The module's weight and bias through the trainer's linear layer (trainer/kernels/linear.h), whose
// 16-bit products on a CPU without LibTorch's 16-bit GEMM are fp32 ones.
torch::Tensor Apply(const torch::nn::Linear& layer, const torch::Tensor& x) {
  return Linear(x, layer->weight, layer->bias);
}

// The patch embedding, a convolution whose kernel is its stride, as one GEMM over the images'
// non-overlapping patches: each patch's 3 x p x p pixels in the weight's (channel, row, column)
// order times the weight viewed (C, 3·p·p). The sums are the convolution's. Not the convolution
// itself: on a CPU with AMX, oneDNN's convolutions (brg_conv_fwd, brgconv_bwd_w) take a scratchpad
// from LibTorch's allocator that no shape rule here predicts (197.6 MiB for 8 images of 224 x 224
// pixels at 14-pixel patches, 96 channels, on a 2-core Xeon: a BLIP-2 row measured 33% above its
// estimate), and elsewhere their scratchpads follow each CPU's kernels; a GEMM takes what linear.h
// says. pixel_values (B, 3, S, S) -> (B, (S/p)², C)
torch::Tensor EmbedPatches(const torch::nn::Conv2d& conv, const torch::Tensor& pixel_values) {
  const torch::Tensor& weight = conv->weight;  // (C, 3, p, p)
  const int64_t batch = pixel_values.size(0);
  const int64_t patch = weight.size(2);
  const int64_t side = pixel_values.size(2) / patch;
  // (B, 3, S/p, p, S/p, p) -> (B, S/p, S/p, 3, p, p) -> (B·(S/p)², 3·p·p), a copy
  const torch::Tensor patches = pixel_values.to(weight.scalar_type())
                                    .view({batch, 3, side, patch, side, patch})
                                    .permute({0, 2, 4, 1, 3, 5})
                                    .reshape({batch * side * side, 3 * patch * patch});
  return Linear(patches, weight.view({weight.size(0), -1}), conv->bias)
      .view({batch, side * side, weight.size(0)});
}

torch::nn::LayerNorm MakeLayerNorm(int64_t size, double eps) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({size}).eps(eps));
}

// Bidirectional multi-head attention, scaled by head_dim^-0.5, with `dropout` on the probabilities.
// q (B, Tq, H*D), k and v (B, Tk, H*D) -> (B, Tq, H*D).
torch::Tensor Attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     int64_t heads, double dropout) {
  const int64_t batch = q.size(0);
  const int64_t width = q.size(2);
  const int64_t head_dim = width / heads;
  auto split = [&](const torch::Tensor& t) {
    return t.view({batch, t.size(1), heads, head_dim}).transpose(1, 2);  // (B, H, T, D)
  };
  const torch::Tensor y =
      at::scaled_dot_product_attention(split(q), split(k), split(v), /*attn_mask=*/{}, dropout);
  return y.transpose(1, 2).reshape({batch, q.size(1), width});
}

}  // namespace

Blip2VisionLayerImpl::Blip2VisionLayerImpl(const Blip2VisionConfig& c)
    : heads_(c.num_attention_heads), attention_dropout_(c.attention_dropout) {
  const int64_t width = c.hidden_size;
  layer_norm1_ = register_module("layer_norm1", MakeLayerNorm(width, c.layer_norm_eps));
  // self_attn.qkv, self_attn.projection
  auto attention = register_module("self_attn", std::make_shared<torch::nn::Module>());
  qkv_ = attention->register_module(
      "qkv", torch::nn::Linear(torch::nn::LinearOptions(width, 3 * width).bias(c.qkv_bias)));
  projection_ = attention->register_module("projection", torch::nn::Linear(width, width));
  layer_norm2_ = register_module("layer_norm2", MakeLayerNorm(width, c.layer_norm_eps));
  auto mlp = register_module("mlp", std::make_shared<torch::nn::Module>());
  fc1_ = mlp->register_module("fc1", torch::nn::Linear(width, c.intermediate_size));
  fc2_ = mlp->register_module("fc2", torch::nn::Linear(c.intermediate_size, width));
}

torch::Tensor Blip2VisionLayerImpl::forward(const torch::Tensor& x) {
  const std::vector<torch::Tensor> qkv =
      Apply(qkv_, layer_norm1_(x)).chunk(3, -1);  // 3 x (B, P, C)
  const torch::Tensor h = x + Apply(projection_, Attend(qkv[0], qkv[1], qkv[2], heads_,
                                                        is_training() ? attention_dropout_ : 0.0));
  return h + Apply(fc2_, F::gelu(Apply(fc1_, layer_norm2_(h))));
}

Blip2VisionModelImpl::Blip2VisionModelImpl(const Blip2VisionConfig& c) {
  const int64_t width = c.hidden_size;
  const int64_t positions = (c.image_size / c.patch_size) * (c.image_size / c.patch_size) + 1;
  auto embeddings = register_module("embeddings", std::make_shared<torch::nn::Module>());
  class_embedding_ = embeddings->register_parameter("class_embedding", torch::zeros({1, 1, width}));
  patch_embedding_ = embeddings->register_module(
      "patch_embedding",
      torch::nn::Conv2d(torch::nn::Conv2dOptions(3, width, c.patch_size).stride(c.patch_size)));
  position_embedding_ =
      embeddings->register_parameter("position_embedding", torch::zeros({1, positions, width}));
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto list = encoder->register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_.push_back(Blip2VisionLayer(c));
    list->push_back(layers_.back());
  }
  post_layernorm_ = register_module("post_layernorm", MakeLayerNorm(width, c.layer_norm_eps));
}

torch::Tensor Blip2VisionModelImpl::forward(const torch::Tensor& pixel_values) {
  const int64_t batch = pixel_values.size(0);
  const torch::Tensor patches = EmbedPatches(patch_embedding_, pixel_values);  // (B, P - 1, C)
  torch::Tensor x = torch::cat({class_embedding_.expand({batch, 1, -1}), patches}, 1) +
                    position_embedding_;  // (B, P, C)
  const bool checkpoint = checkpoint_layers && torch::GradMode::is_enabled();
  for (size_t i = 0; i < layers_.size(); ++i) {
    Blip2VisionLayer& layer = layers_[i];
    x = layer_hooks.Before(static_cast<int64_t>(i), x);
    x = checkpoint
            ? CheckpointedForward([layer](const torch::Tensor& h) mutable { return layer(h); }, x)
            : layer(x);
    x = layer_hooks.After(static_cast<int64_t>(i), x);
  }
  return post_layernorm_(x);
}

Blip2QFormerAttentionImpl::Blip2QFormerAttentionImpl(const Blip2QFormerConfig& c,
                                                     int64_t context_size)
    : heads_(c.num_attention_heads),
      hidden_dropout_(c.hidden_dropout_prob),
      attention_dropout_(c.attention_probs_dropout_prob) {
  const int64_t width = c.hidden_size;
  auto attention = register_module("attention", std::make_shared<torch::nn::Module>());
  query_ = attention->register_module("query", torch::nn::Linear(width, width));
  key_ = attention->register_module("key", torch::nn::Linear(context_size, width));
  value_ = attention->register_module("value", torch::nn::Linear(context_size, width));
  auto output = register_module("output", std::make_shared<torch::nn::Module>());
  dense_ = output->register_module("dense", torch::nn::Linear(width, width));
  layer_norm_ = output->register_module("LayerNorm", MakeLayerNorm(width, c.layer_norm_eps));
}

torch::Tensor Blip2QFormerAttentionImpl::forward(const torch::Tensor& x,
                                                 const torch::Tensor& context) {
  const torch::Tensor y = Attend(Apply(query_, x), Apply(key_, context), Apply(value_, context),
                                 heads_, is_training() ? attention_dropout_ : 0.0);
  return layer_norm_(
      F::dropout(Apply(dense_, y),
                 F::DropoutFuncOptions().p(hidden_dropout_).training(is_training())) +
      x);
}

Blip2QFormerLayerImpl::Blip2QFormerLayerImpl(const Blip2QFormerConfig& c, bool cross_attention)
    : hidden_dropout_(c.hidden_dropout_prob) {
  attention_ = register_module("attention", Blip2QFormerAttention(c, c.hidden_size));
  if (cross_attention) {
    crossattention_ =
        register_module("crossattention", Blip2QFormerAttention(c, c.encoder_hidden_size));
  }
  auto intermediate = register_module("intermediate_query", std::make_shared<torch::nn::Module>());
  intermediate_ =
      intermediate->register_module("dense", torch::nn::Linear(c.hidden_size, c.intermediate_size));
  auto output = register_module("output_query", std::make_shared<torch::nn::Module>());
  output_ = output->register_module("dense", torch::nn::Linear(c.intermediate_size, c.hidden_size));
  output_norm_ =
      output->register_module("LayerNorm", MakeLayerNorm(c.hidden_size, c.layer_norm_eps));
}

torch::Tensor Blip2QFormerLayerImpl::forward(const torch::Tensor& queries,
                                             const torch::Tensor& image) {
  torch::Tensor h = attention_(queries, queries);
  if (crossattention_) h = crossattention_(h, image);
  const torch::Tensor y = Apply(output_, F::gelu(Apply(intermediate_, h)));
  return output_norm_(
      F::dropout(y, F::DropoutFuncOptions().p(hidden_dropout_).training(is_training())) + h);
}

Blip2QFormerModelImpl::Blip2QFormerModelImpl(const Blip2QFormerConfig& c)
    : hidden_dropout_(c.hidden_dropout_prob) {
  layernorm_ = register_module("layernorm", MakeLayerNorm(c.hidden_size, c.layer_norm_eps));
  auto encoder = register_module("encoder", std::make_shared<torch::nn::Module>());
  auto list = encoder->register_module("layer", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers_.push_back(Blip2QFormerLayer(c, i % c.cross_attention_frequency == 0));
    list->push_back(layers_.back());
  }
}

torch::Tensor Blip2QFormerModelImpl::forward(const torch::Tensor& queries,
                                             const torch::Tensor& image) {
  torch::Tensor h = F::dropout(layernorm_(queries),
                               F::DropoutFuncOptions().p(hidden_dropout_).training(is_training()));
  const bool checkpoint = checkpoint_layers && torch::GradMode::is_enabled();
  for (size_t i = 0; i < layers_.size(); ++i) {
    Blip2QFormerLayer& layer = layers_[i];
    h = layer_hooks.Before(static_cast<int64_t>(i), h);
    h = checkpoint ? CheckpointedForward(
                         [layer](const torch::Tensor& q, const torch::Tensor& context) mutable {
                           return layer(q, context);
                         },
                         h, image)
                   : layer(h, image);
    h = layer_hooks.After(static_cast<int64_t>(i), h);
  }
  return h;
}

Blip2ForConditionalGenerationImpl::Blip2ForConditionalGenerationImpl(
    const Blip2Config& c, const std::optional<Nf4Options>& nf4)
    : image_token_index_(c.image_token_index), num_query_tokens_(c.num_query_tokens) {
  vision_model = register_module("vision_model", Blip2VisionModel(c.vision));
  query_tokens = register_parameter("query_tokens",
                                    torch::zeros({1, c.num_query_tokens, c.qformer.hidden_size}));
  qformer = register_module("qformer", Blip2QFormerModel(c.qformer));
  language_projection = register_module(
      "language_projection", torch::nn::Linear(c.qformer.hidden_size, c.text_hidden_size()));
  stacks_ = {
      {"vision_model.encoder.layers.", c.vision.num_hidden_layers, &vision_model->layer_hooks},
      {"qformer.encoder.layer.", c.qformer.num_hidden_layers, &qformer->layer_hooks}};
  if (const T5Config* t5_config = c.t5()) {
    t5 = register_module("language_model", T5ForConditionalGeneration(*t5_config, nf4));
    stacks_.push_back(
        {"language_model.encoder.block.", t5_config->num_layers, &t5->encoder_hooks()});
    stacks_.push_back(
        {"language_model.decoder.block.", t5_config->num_decoder_layers, &t5->decoder_hooks()});
  } else {
    opt = register_module("language_model", OptForCausalLM(*c.opt(), nf4));
    stacks_.push_back(
        {"language_model.model.decoder.layers.", c.opt()->num_hidden_layers, &opt->layer_hooks});
  }
}

torch::Tensor Blip2ForConditionalGenerationImpl::ImageFeatures(const torch::Tensor& pixel_values) {
  const torch::Tensor image = vision_model(pixel_values);  // (B, P, C)
  const torch::Tensor queries = qformer(query_tokens.expand({image.size(0), -1, -1}), image);
  return Apply(language_projection, queries);  // (B, Q, Ct)
}

void Blip2ForConditionalGenerationImpl::SetActivationCheckpointing(bool on) {
  vision_model->checkpoint_layers = on;
  qformer->checkpoint_layers = on;
  if (opt) opt->checkpoint_layers = on;
  if (t5) t5->SetActivationCheckpointing(on);
}

void Blip2ForConditionalGenerationImpl::SetKernels(Kernels kernels) {
  if (t5) t5->SetKernels(kernels);
}

void Blip2ForConditionalGenerationImpl::SetLayerHooks(LayerHooks* hooks) {
  int64_t first = 0;
  for (const Stack& stack : stacks_) {
    *stack.hooks = StackHooks{hooks, first};
    first += stack.blocks;
  }
}

int64_t Blip2ForConditionalGenerationImpl::LayerOf(const std::string& name) const {
  if (name.find("relative_attention_bias") != std::string::npos) return -1;
  int64_t first = 0;
  for (const Stack& stack : stacks_) {
    if (name.starts_with(stack.prefix)) {
      return first + std::stoll(name.substr(stack.prefix.size()));  // "<i>.…"
    }
    first += stack.blocks;
  }
  return -1;
}

torch::Tensor Blip2ForConditionalGenerationImpl::InputEmbeddings(const torch::Tensor& pixel_values,
                                                                 const torch::Tensor& input_ids) {
  const torch::Tensor features = ImageFeatures(pixel_values);                          // (B, Q, Ct)
  const torch::Tensor embeds = opt ? opt->Embed(input_ids) : t5->Embed(input_ids);     // (B, T, Ct)
  const torch::Tensor placeholders = (input_ids == image_token_index_).unsqueeze(-1);  // (B, T, 1)
  return embeds.masked_scatter(placeholders, features.to(embeds.scalar_type()));
}

torch::Tensor Blip2ForConditionalGenerationImpl::Hidden(const torch::Tensor& pixel_values,
                                                        const torch::Tensor& input_ids) {
  TORCH_CHECK(opt, "Hidden: OPT's; this BLIP-2's language model is T5");
  return opt->Hidden(InputEmbeddings(pixel_values, input_ids));
}

torch::Tensor Blip2ForConditionalGenerationImpl::Loss(const torch::Tensor& pixel_values,
                                                      const torch::Tensor& input_ids,
                                                      const torch::Tensor& attention_mask,
                                                      const torch::Tensor& labels, bool chunked) {
  const torch::Tensor embeds = InputEmbeddings(pixel_values, input_ids);  // (B, T, Ct)
  if (opt) {
    const torch::Tensor hidden = opt->Hidden(embeds);
    if (!chunked) return CausalLmLoss(opt->Logits(hidden), labels);  // logits (B, T, V)
    return ChunkedCausalLmLoss(
        hidden, labels, [model = opt](const torch::Tensor& h) mutable { return model->Logits(h); },
        {opt->OutputWeight()}, kLossChunkTokens, opt->OutputWeight());
  }
  // The caption's columns: every row's Q placeholders come first.
  const torch::Tensor caption_labels =
      labels.narrow(1, num_query_tokens_, labels.size(1) - num_query_tokens_);  // (B, T - Q)
  const torch::Tensor encoder = t5->Encode(embeds, attention_mask);             // (B, T, Ct)
  const torch::Tensor hidden = t5->DecoderHidden(caption_labels, encoder, attention_mask);
  if (chunked) {
    return ChunkedCrossEntropyLoss(
        hidden, caption_labels,
        [model = t5](const torch::Tensor& h) mutable { return model->Logits(h); },
        t5->OutputParameters(), kLossChunkTokens, t5->PlainOutputWeight());
  }
  const torch::Tensor logits = t5->Logits(hidden);  // (B, T - Q, V)
  return torch::nn::functional::cross_entropy(
             logits.reshape({-1, logits.size(-1)}), caption_labels.reshape({-1}),
             torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100))
      .to(torch::kFloat32);
}

void Blip2ForConditionalGenerationImpl::InitializeRandom(double std) {
  InitializeLikeHuggingFace(*this, std);
}

Status LoadBlip2Weights(Blip2ForConditionalGeneration& model,
                        const safetensors::ShardedCheckpoint& checkpoint,
                        const std::string& source) {
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& param = item.value();
    if (const safetensors::TensorView* view = checkpoint.Find(name)) {
      RETURN_IF_ERROR(CopyTensorFromView(*view, param, source));
      continue;
    }
    const std::string qkv_bias = "self_attn.qkv.bias";
    if (name.ends_with(qkv_bias)) {
      // transformers 4's names: q_bias and v_bias (C) each; k has no bias.
      const std::string prefix = name.substr(0, name.size() - qkv_bias.size()) + "self_attn.";
      const safetensors::TensorView* q = checkpoint.Find(prefix + "q_bias");
      const safetensors::TensorView* v = checkpoint.Find(prefix + "v_bias");
      if (q != nullptr && v != nullptr) {
        const int64_t width = param.size(0) / 3;
        torch::Tensor q_part = param.narrow(0, 0, width);
        torch::Tensor v_part = param.narrow(0, 2 * width, width);
        RETURN_IF_ERROR(CopyTensorFromView(*q, q_part, source));
        RETURN_IF_ERROR(CopyTensorFromView(*v, v_part, source));
        param.narrow(0, width, width).zero_();
        continue;
      }
    }
    return DataLossError(source + ": tensor '" + name + "' is missing");
  }
  return LoadNf4BaseWeights(*model, checkpoint, source);
}

}  // namespace llmctl::trainer
