// T5's encoder-decoder (Hugging Face's T5ForConditionalGeneration; Flan-T5 is T5 v1.1) with its
// parameter names under a prefix, as BLIP-2 holds it (language_model.encoder.block.0.layer.0...):
// one token embedding (`shared`) for both stacks, relative position buckets whose bias block 0 of
// each stack owns and every block adds to its attention logits, T5's RMS LayerNorm, attention
// logits not scaled by head_dim^-0.5, a gated-GELU (or ReLU) FFN without biases, dropout_rate on
// the embeddings, every sublayer's output, the FFN's inner activation, the attention probabilities
// and the stacks' final outputs (in training). The projections are Projections (LoRA adapters by
// PEFT's names q, k, v, o, wi_0, wi_1, wi, wo); with `nf4` their base weights are NF4 except wo's,
// which BitsAndBytesConfig(load_in_4bit) leaves dense because T5 keeps it out of quantisation
// (_keep_in_fp32_modules).
//
// B = batch, S = encoder sequence, T = decoder sequence, C = d_model, H = heads, V = vocabulary.
#ifndef LLMCTL_TRAINER_MODEL_T5_H_
#define LLMCTL_TRAINER_MODEL_T5_H_

#include <torch/torch.h>

#include <optional>
#include <vector>

#include "common/blip2_config.h"
#include "trainer/model/layer_hooks.h"
#include "trainer/model/llama.h"
#include "trainer/model/projection.h"

namespace llmctl::trainer {

// The relative-position bucket of each (query, key) pair, as T5Attention._relative_position_bucket
// computes it: exact buckets for small distances, logarithmic ones up to max_distance, the sign
// its own half when `bidirectional` (the encoder). (Tq, Tk) int64 on `device`.
torch::Tensor RelativePositionBuckets(int64_t query_length, int64_t key_length, bool bidirectional,
                                      int64_t num_buckets, int64_t max_distance,
                                      torch::Device device);

class T5AttentionImpl : public torch::nn::Module {
 public:
  T5AttentionImpl(const T5Config& config, bool relative_bias, const std::optional<Nf4Options>& nf4);
  // x (B, Tq, C), context (B, Tk, C) (x itself for self-attention), bias: added to the logits,
  // (1 or B, H, Tq, Tk) float, or a (B, 1, 1, Tk) bool mask of the keys attended -> (B, Tq, C).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context,
                        const torch::Tensor& bias);
  // The learned bias of every (query, key) pair: (1, H, Tq, Tk). Requires `relative_bias`.
  torch::Tensor PositionBias(int64_t query_length, int64_t key_length, bool bidirectional);

 private:
  int64_t heads_, head_dim_, num_buckets_, max_distance_;
  double dropout_;
  Projection q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr};
  torch::nn::Embedding relative_attention_bias_{nullptr};  // (buckets, H), block 0's only
};
TORCH_MODULE(T5Attention);

// T5LayerFF: x + dropout(wo(dropout(gelu_new(wi_0(ln(x))) * wi_1(ln(x))))), or wi and ReLU.
class T5FeedForwardImpl : public torch::nn::Module {
 public:
  T5FeedForwardImpl(const T5Config& config, const std::optional<Nf4Options>& nf4);
  torch::Tensor forward(const torch::Tensor& x, Kernels kernels);  // (B, T, C) -> (B, T, C)

 private:
  double dropout_;
  RmsNorm layer_norm_{nullptr};
  Projection wi_0_{nullptr}, wi_1_{nullptr}, wi_{nullptr}, wo_{nullptr};
};
TORCH_MODULE(T5FeedForward);

// T5Block: self-attention, cross-attention (decoder blocks), the FFN; each pre-normed, its output
// dropped out and added to the residual stream.
class T5BlockImpl : public torch::nn::Module {
 public:
  T5BlockImpl(const T5Config& config, bool decoder, bool relative_bias,
              const std::optional<Nf4Options>& nf4);
  // h (B, T, C); self_bias as T5Attention's; encoder (B, S, C) and cross_mask (B, 1, 1, S) bool for
  // decoder blocks (undefined for encoder ones) -> (B, T, C).
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& self_bias,
                        const torch::Tensor& encoder, const torch::Tensor& cross_mask,
                        Kernels kernels);
  T5Attention& self_attention() { return self_attention_; }

 private:
  double dropout_;
  RmsNorm self_norm_{nullptr}, cross_norm_{nullptr};
  T5Attention self_attention_{nullptr}, cross_attention_{nullptr};
  T5FeedForward feed_forward_{nullptr};
};
TORCH_MODULE(T5Block);

class T5StackImpl : public torch::nn::Module {
 public:
  T5StackImpl(const T5Config& config, bool decoder, const std::optional<Nf4Options>& nf4);
  // embeds (B, T, C). The encoder: key_mask (B, T) bool, true on real tokens. The decoder: causal;
  // encoder (B, S, C) and its key_mask (B, S). -> the final (normed, dropped-out) states (B, T, C).
  torch::Tensor forward(const torch::Tensor& embeds, const torch::Tensor& key_mask,
                        const torch::Tensor& encoder = {});

  bool checkpoint_layers = false;  // each block through CheckpointedForward when grads are on
  StackHooks layer_hooks;          // around each block (strategy fsdp)
  // The layer norms' and the gated-GELU's implementation (the trial key `kernels`).
  Kernels kernels = Kernels::kAten;

 private:
  bool decoder_;
  double dropout_;
  std::vector<T5Block> blocks_;
  RmsNorm final_layer_norm_{nullptr};
};
TORCH_MODULE(T5Stack);

class T5ForConditionalGenerationImpl : public torch::nn::Module {
 public:
  T5ForConditionalGenerationImpl(const T5Config& config, const std::optional<Nf4Options>& nf4);
  torch::Tensor Embed(const torch::Tensor& input_ids);  // (B, S) -> (B, S, C)
  // inputs_embeds (B, S, C), attention_mask (B, S) bool (false on padding) -> encoder states.
  torch::Tensor Encode(const torch::Tensor& inputs_embeds, const torch::Tensor& attention_mask);
  // labels (B, T), -100 where not scored: the decoder reads them shifted right (the start token
  // first, -100 as padding), as _shift_right does; -> the decoder's final states (B, T, C).
  torch::Tensor DecoderHidden(const torch::Tensor& labels, const torch::Tensor& encoder,
                              const torch::Tensor& attention_mask);
  // (N..., C) -> (N..., V): lm_head, or the shared embedding with the states scaled by
  // d_model^-0.5 when the head is tied (T5 v1.0).
  torch::Tensor Logits(const torch::Tensor& hidden);
  // Every tensor Logits reads that may need a gradient (the chunked loss lists them).
  std::vector<torch::Tensor> OutputParameters() const;
  // The output weight (V, C) when Logits is exactly hidden @ weight^T (untied, no adapter, no NF4
  // base); undefined otherwise.
  torch::Tensor PlainOutputWeight() const;
  void SetActivationCheckpointing(bool on);
  void SetKernels(Kernels kernels);  // the norms and the gated-GELU (fused_ops.h)
  StackHooks& encoder_hooks() { return encoder_->layer_hooks; }
  StackHooks& decoder_hooks() { return decoder_->layer_hooks; }

 private:
  int64_t pad_token_id_, decoder_start_token_id_;
  double output_scale_;  // d_model^-0.5 with a tied head, else 1
  torch::nn::Embedding shared_{nullptr};
  T5Stack encoder_{nullptr}, decoder_{nullptr};
  Projection lm_head_{nullptr};
};
TORCH_MODULE(T5ForConditionalGeneration);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_T5_H_
