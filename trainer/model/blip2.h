// BLIP-2 as Hugging Face's Blip2ForConditionalGeneration defines it, with its parameter names: the
// ViT image encoder (vision_model), the learned queries (query_tokens), the Q-Former (qformer), the
// projection into the language model's width (language_projection) and the language model
// (language_model, OPT). The image features, one row per query, take the places of the image
// placeholder tokens in the text's embeddings, as the processor lays them out.
//
// B = batch, P = patches + 1 (the class token), Q = queries, C = vision width, Cq = Q-Former width,
// Ct = the language model's width.
#ifndef LLMCTL_TRAINER_MODEL_BLIP2_H_
#define LLMCTL_TRAINER_MODEL_BLIP2_H_

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "common/blip2_config.h"
#include "common/safetensors/safetensors.h"
#include "common/status.h"
#include "trainer/model/layer_hooks.h"
#include "trainer/model/opt.h"
#include "trainer/model/t5.h"

namespace llmctl::trainer {

// Pre-LN ViT block: x + attn(ln1(x)), then + mlp(ln2(x)); one fused qkv projection whose bias is
// q's, zeros for k and v's (transformers 5 keeps the three as one parameter, qkv.bias).
class Blip2VisionLayerImpl : public torch::nn::Module {
 public:
  explicit Blip2VisionLayerImpl(const Blip2VisionConfig& config);
  torch::Tensor forward(const torch::Tensor& x);  // (B, P, C) -> (B, P, C)

 private:
  int64_t heads_;
  double attention_dropout_;
  torch::nn::LayerNorm layer_norm1_{nullptr}, layer_norm2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, projection_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
};
TORCH_MODULE(Blip2VisionLayer);

class Blip2VisionModelImpl : public torch::nn::Module {
 public:
  explicit Blip2VisionModelImpl(const Blip2VisionConfig& config);
  // (B, 3, S, S) normalised pixels -> (B, P, C), after the final LayerNorm.
  torch::Tensor forward(const torch::Tensor& pixel_values);

  bool checkpoint_layers = false;  // each block through CheckpointedForward when grads are on
  StackHooks layer_hooks;          // around each block (strategy fsdp)

 private:
  torch::Tensor class_embedding_;               // (1, 1, C)
  torch::Tensor position_embedding_;            // (1, P, C)
  torch::nn::Conv2d patch_embedding_{nullptr};  // its weight and bias, applied as a GEMM
  std::vector<Blip2VisionLayer> layers_;
  torch::nn::LayerNorm post_layernorm_{nullptr};
};
TORCH_MODULE(Blip2VisionModel);

// BERT-style attention block: LayerNorm(x + dropout(dense(attention(x, context)))), with dropout on
// the attention probabilities too (in training).
class Blip2QFormerAttentionImpl : public torch::nn::Module {
 public:
  Blip2QFormerAttentionImpl(const Blip2QFormerConfig& config, int64_t context_size);
  // x (B, Q, Cq), context (B, N, context_size) -> (B, Q, Cq)
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context);

 private:
  int64_t heads_;
  double hidden_dropout_, attention_dropout_;
  torch::nn::Linear query_{nullptr}, key_{nullptr}, value_{nullptr}, dense_{nullptr};
  torch::nn::LayerNorm layer_norm_{nullptr};
};
TORCH_MODULE(Blip2QFormerAttention);

class Blip2QFormerLayerImpl : public torch::nn::Module {
 public:
  Blip2QFormerLayerImpl(const Blip2QFormerConfig& config, bool cross_attention);
  // queries (B, Q, Cq), image (B, P, C) -> (B, Q, Cq)
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& image);

 private:
  double hidden_dropout_;
  Blip2QFormerAttention attention_{nullptr}, crossattention_{nullptr};
  torch::nn::Linear intermediate_{nullptr}, output_{nullptr};
  torch::nn::LayerNorm output_norm_{nullptr};
};
TORCH_MODULE(Blip2QFormerLayer);

class Blip2QFormerModelImpl : public torch::nn::Module {
 public:
  explicit Blip2QFormerModelImpl(const Blip2QFormerConfig& config);
  // queries (B, Q, Cq), image (B, P, C) -> (B, Q, Cq)
  torch::Tensor forward(const torch::Tensor& queries, const torch::Tensor& image);

  bool checkpoint_layers = false;  // each block, with the image as its second kept input
  StackHooks layer_hooks;          // around each block (strategy fsdp)

 private:
  double hidden_dropout_;
  torch::nn::LayerNorm layernorm_{nullptr};
  std::vector<Blip2QFormerLayer> layers_;
};
TORCH_MODULE(Blip2QFormerModel);

class Blip2ForConditionalGenerationImpl : public torch::nn::Module {
 public:
  // `nf4`: QLoRA's NF4 base weights for the language model's linears (the image side stays dense).
  explicit Blip2ForConditionalGenerationImpl(const Blip2Config& config,
                                             const std::optional<Nf4Options>& nf4 = std::nullopt);
  // (B, 3, S, S) -> image features (B, Q, Ct)
  torch::Tensor ImageFeatures(const torch::Tensor& pixel_values);
  // pixel_values (B, 3, S, S), input_ids (B, T) holding exactly Q image placeholders per row (the
  // caller's to ensure: a row with fewer would silently take fewer features, as masked_scatter
  // does; checking here would cost a host sync every forward) -> the embeddings the language model
  // reads, the image's features in the placeholders' places (B, T, Ct).
  torch::Tensor InputEmbeddings(const torch::Tensor& pixel_values, const torch::Tensor& input_ids);
  // OPT only: InputEmbeddings through OPT -> its final hidden states (B, T, Ct), and those through
  // its head, tied to its embedding -> (B, T, V).
  torch::Tensor Hidden(const torch::Tensor& pixel_values, const torch::Tensor& input_ids);
  torch::Tensor Logits(const torch::Tensor& pixel_values, const torch::Tensor& input_ids) {
    return opt->Logits(Hidden(pixel_values, input_ids));
  }
  // The captioning loss as transformers computes it, a float32 scalar: the mean cross-entropy over
  // the labels that are not -100.
  //   OPT: labels (B, T) aligned with input_ids (-100 on the placeholders), shifted: position t
  //        predicts label t+1; in float32 (ForCausalLMLoss upcasts the logits).
  //   T5:  the encoder reads input_ids' embeddings under attention_mask (B, T) bool (false on
  //        padding); the decoder predicts labels[:, Q:] (the caption after the placeholders'
  //        columns) from their right shift, unshifted; in the logits' dtype, as
  //        T5ForConditionalGeneration's CrossEntropyLoss (bf16 under bf16-true).
  // `chunked`: kLossChunkTokens tokens' logits at a time (ChunkedCrossEntropyLoss), in float32.
  torch::Tensor Loss(const torch::Tensor& pixel_values, const torch::Tensor& input_ids,
                     const torch::Tensor& attention_mask, const torch::Tensor& labels,
                     bool chunked);
  // Hugging Face's initialisation as Blip2PreTrainedModel._init_weights draws it: normal(0, 0.02)
  // for linear, convolution and embedding weights, the class and position embeddings and the
  // query tokens; zero biases; LayerNorms one and zero. An NF4 base draws its dense weight (one at
  // a time) where a dense one would be. Deterministic under torch::manual_seed.
  void InitializeRandom(double std = 0.02);
  // Activation checkpointing per block of every stack (vision, Q-Former, OPT or T5's two), as
  // gradient_checkpointing_enable() wraps each of transformers' GradientCheckpointingLayers.
  // T5's layer norms and gated-GELU (fused_ops.h; the trial key `kernels`). OPT, the Q-Former
  // and the vision encoder use none of the fused ops: their LayerNorm is ATen's own fused one.
  void SetKernels(Kernels kernels);
  void SetActivationCheckpointing(bool on);
  // strategy fsdp: `hooks` (not owned; null: none) around every block of every stack, numbered as
  // LayerOf numbers them.
  void SetLayerHooks(LayerHooks* hooks);
  // The FSDP unit a parameter belongs to, by its name: its block's number across the stacks (the
  // vision encoder's, the Q-Former's, then OPT's or T5's encoder's and decoder's), as the labs'
  // FSDP wraps each block; -1 for the root (the embeddings, norms, learned queries, projection and
  // head, and T5's relative-position biases, which every block of their stack reads).
  int64_t LayerOf(const std::string& name) const;

  Blip2VisionModel vision_model{nullptr};
  torch::Tensor query_tokens;  // (1, Q, Cq)
  Blip2QFormerModel qformer{nullptr};
  torch::nn::Linear language_projection{nullptr};
  // The language model, registered as language_model: exactly one of the two is set.
  OptForCausalLM opt{nullptr};
  T5ForConditionalGeneration t5{nullptr};

 private:
  int64_t image_token_index_;
  int64_t num_query_tokens_;
  // Each stack, in the order LayerOf numbers their blocks: its blocks' name prefix, its block
  // count, and its hooks (in its own module).
  struct Stack {
    std::string prefix;
    int64_t blocks;
    StackHooks* hooks;
  };
  std::vector<Stack> stacks_;
};
TORCH_MODULE(Blip2ForConditionalGeneration);

// Copies every parameter from `checkpoint` by Hugging Face name. A hub checkpoint (transformers 4)
// stores a vision layer's bias as self_attn.q_bias and self_attn.v_bias; a transformers 5 one as
// self_attn.qkv.bias: either loads. An NF4 base weight is read densely and quantised, one at a
// time. Errors name `source` and the tensor.
Status LoadBlip2Weights(Blip2ForConditionalGeneration& model,
                        const safetensors::ShardedCheckpoint& checkpoint,
                        const std::string& source);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_BLIP2_H_
