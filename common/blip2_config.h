// BLIP-2's shapes (Blip2ForConditionalGeneration: a ViT image encoder, the Q-Former, a projection
// and a language model) as a Hugging Face config.json states them in vision_config, qformer_config
// and text_config, parsed and checked, with transformers' defaults for what a file leaves out (the
// hub's blip2-opt-2.7b states only part of its OPT config). No LibTorch: the estimate reads these
// too.
#ifndef LLMCTL_COMMON_BLIP2_CONFIG_H_
#define LLMCTL_COMMON_BLIP2_CONFIG_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "common/status.h"

namespace llmctl {

// EVA-CLIP's ViT: patch embedding, class token, learned positions, pre-LN blocks with a fused qkv
// projection (bias on q and v), GELU MLP, a final LayerNorm.
struct Blip2VisionConfig {
  int64_t hidden_size = 1408;
  int64_t intermediate_size = 6144;
  int64_t num_hidden_layers = 39;
  int64_t num_attention_heads = 16;
  int64_t image_size = 224;
  int64_t patch_size = 14;
  double layer_norm_eps = 1e-6;
  bool qkv_bias = true;
  double attention_dropout = 0.0;  // on the attention probabilities, in training
};

// The BERT-style Querying Transformer over learned queries: self-attention, cross-attention to the
// image every cross_attention_frequency layers (starting with the first), post-LN, GELU.
struct Blip2QFormerConfig {
  int64_t hidden_size = 768;
  int64_t intermediate_size = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t cross_attention_frequency = 2;
  int64_t encoder_hidden_size = 1408;
  double layer_norm_eps = 1e-12;
  // In training, BERT's: on the embeddings, on each attention and FFN output before its residual
  // LayerNorm, and on the attention probabilities.
  double hidden_dropout_prob = 0.1;
  double attention_probs_dropout_prob = 0.1;
};

// OPT's decoder (OPTConfig's defaults): learned positions offset by 2, pre-LN, ReLU FFN, a head
// tied to the embedding.
struct OptConfig {
  int64_t vocab_size = 50272;
  int64_t hidden_size = 768;
  int64_t ffn_dim = 3072;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t max_position_embeddings = 2048;
  int64_t pad_token_id = 1;
  double dropout = 0.1;  // in training, on each attention and FFN output before its residual
  double attention_dropout = 0.0;  // in training, on the attention probabilities
};

// T5's encoder-decoder (T5Config's fields; Flan-T5 is T5 v1.1): a shared token embedding, relative
// position buckets computed once per stack, T5's RMS LayerNorm (no mean, no bias), unscaled
// attention logits, a gated-GELU (v1.1) or ReLU (v1.0) FFN without biases, dropout_rate everywhere
// in training.
struct T5Config {
  int64_t vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;
  int64_t d_ff = 2048;
  int64_t num_layers = 6;
  int64_t num_decoder_layers = 6;
  int64_t num_heads = 8;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  double dropout_rate = 0.1;
  // feed_forward_proj: "gated-gelu" (wi_0, wi_1, wo; GELU's tanh form, transformers' gelu_new) or
  // "relu" (wi, wo).
  bool gated_gelu = true;
  // The head: false (v1.1, Flan) its own lm_head; true (v1.0) the shared embedding, with the
  // decoder's output scaled by d_model^-0.5. transformers 5 ties the head whatever the config says;
  // the published Flan-T5 checkpoints hold a distinct lm_head, which llmctl keeps, as
  // transformers 4.
  bool tie_word_embeddings = false;
  int64_t pad_token_id = 0;
  int64_t decoder_start_token_id = 0;
  int64_t inner_dim() const { return num_heads * d_kv; }
};

struct Blip2Config {
  Blip2VisionConfig vision;
  Blip2QFormerConfig qformer;
  std::variant<OptConfig, T5Config> text = OptConfig{};  // the language model: OPT or Flan-T5
  int64_t num_query_tokens = 32;
  int64_t image_token_index = -1;  // the placeholder the processor repeats num_query_tokens times

  const OptConfig* opt() const { return std::get_if<OptConfig>(&text); }
  const T5Config* t5() const { return std::get_if<T5Config>(&text); }
  // The language model's width (what language_projection maps to), vocabulary and padding id.
  int64_t text_hidden_size() const { return t5() ? t5()->d_model : opt()->hidden_size; }
  int64_t text_vocab_size() const { return t5() ? t5()->vocab_size : opt()->vocab_size; }
  int64_t text_pad_token_id() const { return t5() ? t5()->pad_token_id : opt()->pad_token_id; }
};

// Parameters by part, as transformers 5 builds the model (its vision layers hold one qkv bias of 3C
// values, k's part included; transformers 4 held q_bias and v_bias, C fewer per layer). OPT's head
// is tied to the embedding and counted once; Flan-T5's is its own (V x C), its encoder's and
// decoder's token embeddings are the one shared matrix.
struct Blip2ParameterCounts {
  int64_t vision = 0;
  int64_t qformer = 0;  // with the query tokens
  int64_t projection = 0;
  int64_t language_model = 0;
  int64_t total() const { return vision + qformer + projection + language_model; }
};
Blip2ParameterCounts CountBlip2Parameters(const Blip2Config& config);

// The published models by their hub names' last part ("blip2-opt-2.7b", "blip2-opt-6.7b",
// "blip2-flan-t5-xl", "blip2-flan-t5-xxl"): the hub's config.json shapes (OPT's vocabulary padded
// to 50,304 with the image token at 50,265; T5's 32,128 with it at 32,100), so that `init: random`
// runs take the real model's memory. nullopt for other names.
std::optional<Blip2Config> Blip2Preset(const std::string& name);

// Parses a config.json of model_type "blip-2". InvalidArgument naming `source`, the section and the
// field for a wrong value; Unimplemented for a language model other than OPT and T5, for OPT
// variants with a projected embedding or post-LN (opt-350m), and for T5 FFNs other than relu and
// gated-gelu.
StatusOr<Blip2Config> ParseBlip2Config(const nlohmann::json& config, const std::string& source);

// `config` as a Hugging Face config.json of model_type "blip-2" (what a merged model is saved
// with): every field ParseBlip2Config reads, so parsing it gives `config` back, and transformers
// builds the same model from it.
nlohmann::json ToHfConfigJson(const Blip2Config& config);

// `model` as a trial names it, when it names BLIP-2: a preset (its hub name, with or without
// "Salesforce/") or a directory (or its config.json) whose config.json has model_type "blip-2".
// nullopt when it names anything else, which ResolveModel (model_config.h) then resolves or
// refuses; errors from reading or parsing a BLIP-2 config.json, naming it.
StatusOr<std::optional<Blip2Config>> ResolveBlip2Model(std::string_view model);

// Whether `model` is a BLIP-2 preset's name (with or without "Salesforce/").
inline bool IsBlip2Preset(std::string_view model) {
  if (model.starts_with("Salesforce/")) model.remove_prefix(11);
  return Blip2Preset(std::string(model)).has_value();
}

}  // namespace llmctl

#endif  // LLMCTL_COMMON_BLIP2_CONFIG_H_
