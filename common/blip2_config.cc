#include "common/blip2_config.h"

#include <filesystem>

#include "common/files.h"
#include "common/foreign_json.h"
#include "common/model_bounds.h"

namespace llmctl {
namespace {

using model_bounds::kMaxHeads;
using model_bounds::kMaxLayers;
using model_bounds::kMaxPositions;
using model_bounds::kMaxVocabulary;
using model_bounds::kMaxWidth;
// BLIP-2's own (common/model_bounds.h has the shapes it shares with LLaMA's configs).
constexpr int64_t kMaxImageSide = 1 << 16;  // an image's or a patch's side, in pixels
constexpr int64_t kMaxQueryTokens = 1 << 16;

// Reads `section`.`key` into `out` when present: a positive integer up to a bound (or any number
// for doubles).
class Fields {
 public:
  Fields(const nlohmann::json& json, std::string where) : json_(json), where_(std::move(where)) {}

  Status Int(const char* key, int64_t& out, int64_t max) {
    if (!json_.contains(key)) return Status::Ok();
    const nlohmann::json& v = json_[key];
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > max) {
      return InvalidArgumentError(where_ + "." + key + ": expected a positive integer up to " +
                                  std::to_string(max) + ", got " + ShortJson(v));
    }
    out = v.get<int64_t>();
    return Status::Ok();
  }
  Status Double(const char* key, double& out) {
    if (!json_.contains(key)) return Status::Ok();
    if (!json_[key].is_number() || json_[key].get<double>() <= 0) {
      return InvalidArgumentError(where_ + "." + key + ": expected a positive number, got " +
                                  ShortJson(json_[key]));
    }
    out = json_[key].get<double>();
    return Status::Ok();
  }
  // A dropout probability: a number in [0, 1).
  Status Probability(const char* key, double& out) {
    if (!json_.contains(key)) return Status::Ok();
    const nlohmann::json& v = json_[key];
    if (!v.is_number() || v.get<double>() < 0 || v.get<double>() >= 1) {
      return InvalidArgumentError(where_ + "." + key + ": expected a probability in [0, 1), got " +
                                  ShortJson(v));
    }
    out = v.get<double>();
    return Status::Ok();
  }
  // A token id (a non-negative integer); null counts as absent, as transformers reads it.
  Status Id(const char* key, int64_t& out) {
    if (!json_.contains(key) || json_[key].is_null()) return Status::Ok();
    const nlohmann::json& v = json_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return InvalidArgumentError(where_ + "." + key + ": expected a token id, got " +
                                  ShortJson(v));
    }
    out = v.get<int64_t>();
    return Status::Ok();
  }
  Status Bool(const char* key, bool& out) {
    if (!json_.contains(key)) return Status::Ok();
    if (!json_[key].is_boolean()) {
      return InvalidArgumentError(where_ + "." + key + ": expected true or false, got " +
                                  ShortJson(json_[key]));
    }
    out = json_[key].get<bool>();
    return Status::Ok();
  }
  Status String(const char* key, std::string& out) {
    if (!json_.contains(key)) return Status::Ok();
    if (!json_[key].is_string()) {
      return InvalidArgumentError(where_ + "." + key + ": expected a string, got " +
                                  ShortJson(json_[key]));
    }
    out = json_[key].get<std::string>();
    return Status::Ok();
  }
  // A string field that must be `expected` when present (what llmctl implements).
  Status Is(const char* key, const std::string& expected, StatusCode code) {
    if (!json_.contains(key) || (json_[key].is_string() && json_[key] == expected)) {
      return Status::Ok();
    }
    return Status(code, where_ + "." + key + ": " + ShortJson(json_[key]) +
                            ", where llmctl implements \"" + expected + "\"");
  }

 private:
  const nlohmann::json& json_;
  std::string where_;
};

Status Divisible(int64_t size, int64_t by, const std::string& what) {
  if (size % by == 0) return Status::Ok();
  return InvalidArgumentError(what + ": " + std::to_string(size) + " is not a multiple of " +
                              std::to_string(by));
}

StatusOr<OptConfig> ParseOptConfig(const nlohmann::json& text_json, const std::string& where) {
  OptConfig o;
  Fields text(text_json, where);
  RETURN_IF_ERROR(text.Int("vocab_size", o.vocab_size, kMaxVocabulary));
  RETURN_IF_ERROR(text.Int("hidden_size", o.hidden_size, kMaxWidth));
  RETURN_IF_ERROR(text.Int("ffn_dim", o.ffn_dim, kMaxWidth));
  RETURN_IF_ERROR(text.Int("num_hidden_layers", o.num_hidden_layers, kMaxLayers));
  RETURN_IF_ERROR(text.Int("num_attention_heads", o.num_attention_heads, kMaxHeads));
  RETURN_IF_ERROR(text.Int("max_position_embeddings", o.max_position_embeddings, kMaxPositions));
  if (text_json.contains("pad_token_id") && text_json["pad_token_id"].is_number_integer()) {
    o.pad_token_id = text_json["pad_token_id"].get<int64_t>();
  }
  RETURN_IF_ERROR(text.Probability("dropout", o.dropout));
  RETURN_IF_ERROR(text.Probability("attention_dropout", o.attention_dropout));
  RETURN_IF_ERROR(text.Is("activation_function", "relu", StatusCode::kUnimplemented));
  bool pre_ln = true, bias = true, affine = true;
  RETURN_IF_ERROR(text.Bool("do_layer_norm_before", pre_ln));
  RETURN_IF_ERROR(text.Bool("enable_bias", bias));
  RETURN_IF_ERROR(text.Bool("layer_norm_elementwise_affine", affine));
  int64_t projected = o.hidden_size;
  RETURN_IF_ERROR(text.Int("word_embed_proj_dim", projected, kMaxWidth));
  if (!pre_ln || !bias || !affine || projected != o.hidden_size) {
    return UnimplementedError(where +
                              ": OPT with do_layer_norm_before false, no biases, "
                              "LayerNorms without weights or word_embed_proj_dim != hidden_size "
                              "(opt-350m's) is not built");
  }
  RETURN_IF_ERROR(Divisible(o.hidden_size, o.num_attention_heads,
                            where + ".hidden_size / num_attention_heads"));
  return o;
}

StatusOr<T5Config> ParseT5Config(const nlohmann::json& text_json, const std::string& where) {
  T5Config t;
  t.tie_word_embeddings = true;  // PretrainedConfig's default, which T5 v1.0's files rely on
  Fields text(text_json, where);
  RETURN_IF_ERROR(text.Int("vocab_size", t.vocab_size, kMaxVocabulary));
  RETURN_IF_ERROR(text.Int("d_model", t.d_model, kMaxWidth));
  RETURN_IF_ERROR(text.Int("d_kv", t.d_kv, kMaxWidth));
  RETURN_IF_ERROR(text.Int("d_ff", t.d_ff, kMaxWidth));
  RETURN_IF_ERROR(text.Int("num_layers", t.num_layers, kMaxLayers));
  t.num_decoder_layers = t.num_layers;  // T5Config's default: as many as the encoder
  RETURN_IF_ERROR(text.Int("num_decoder_layers", t.num_decoder_layers, kMaxLayers));
  RETURN_IF_ERROR(text.Int("num_heads", t.num_heads, kMaxHeads));
  RETURN_IF_ERROR(
      text.Int("relative_attention_num_buckets", t.relative_attention_num_buckets, kMaxPositions));
  RETURN_IF_ERROR(text.Int("relative_attention_max_distance", t.relative_attention_max_distance,
                           kMaxPositions));
  RETURN_IF_ERROR(text.Double("layer_norm_epsilon", t.layer_norm_epsilon));
  RETURN_IF_ERROR(text.Probability("dropout_rate", t.dropout_rate));
  RETURN_IF_ERROR(text.Bool("tie_word_embeddings", t.tie_word_embeddings));
  RETURN_IF_ERROR(text.Id("pad_token_id", t.pad_token_id));
  t.decoder_start_token_id = t.pad_token_id;
  RETURN_IF_ERROR(text.Id("decoder_start_token_id", t.decoder_start_token_id));
  std::string ffn = "relu";
  RETURN_IF_ERROR(text.String("feed_forward_proj", ffn));
  if (ffn != "relu" && ffn != "gated-gelu") {
    return UnimplementedError(where + ".feed_forward_proj: \"" + ffn +
                              "\", where llmctl implements \"gated-gelu\" (Flan-T5, T5 v1.1) and "
                              "\"relu\" (T5 v1.0)");
  }
  t.gated_gelu = ffn == "gated-gelu";
  if (t.relative_attention_num_buckets < 4 ||
      t.relative_attention_max_distance <= t.relative_attention_num_buckets / 2) {
    return InvalidArgumentError(
        where + ": relative_attention_num_buckets " +
        std::to_string(t.relative_attention_num_buckets) + " and relative_attention_max_distance " +
        std::to_string(t.relative_attention_max_distance) +
        " leave no logarithmic buckets (at least 4 buckets and a distance above half of them)");
  }
  return t;
}

// The config's vision_config section (`where` names it in messages).
StatusOr<Blip2VisionConfig> ParseVisionConfig(const nlohmann::json& section,
                                              const std::string& where) {
  Blip2VisionConfig v;
  Fields vision(section, where);
  RETURN_IF_ERROR(vision.Int("hidden_size", v.hidden_size, kMaxWidth));
  RETURN_IF_ERROR(vision.Int("intermediate_size", v.intermediate_size, kMaxWidth));
  RETURN_IF_ERROR(vision.Int("num_hidden_layers", v.num_hidden_layers, kMaxLayers));
  RETURN_IF_ERROR(vision.Int("num_attention_heads", v.num_attention_heads, kMaxHeads));
  RETURN_IF_ERROR(vision.Int("image_size", v.image_size, kMaxImageSide));
  RETURN_IF_ERROR(vision.Int("patch_size", v.patch_size, kMaxImageSide));
  RETURN_IF_ERROR(vision.Double("layer_norm_eps", v.layer_norm_eps));
  RETURN_IF_ERROR(vision.Probability("attention_dropout", v.attention_dropout));
  RETURN_IF_ERROR(vision.Bool("qkv_bias", v.qkv_bias));
  RETURN_IF_ERROR(vision.Is("hidden_act", "gelu", StatusCode::kUnimplemented));
  RETURN_IF_ERROR(Divisible(v.hidden_size, v.num_attention_heads,
                            where + ".hidden_size / num_attention_heads"));
  RETURN_IF_ERROR(Divisible(v.image_size, v.patch_size, where + ".image_size / patch_size"));
  return v;
}

// The config's qformer_config section, whose encoder is the vision model of `vision_hidden_size`.
StatusOr<Blip2QFormerConfig> ParseQFormerConfig(const nlohmann::json& section,
                                                const std::string& where,
                                                int64_t vision_hidden_size) {
  Blip2QFormerConfig q;
  q.encoder_hidden_size = vision_hidden_size;
  Fields qformer(section, where);
  RETURN_IF_ERROR(qformer.Int("hidden_size", q.hidden_size, kMaxWidth));
  RETURN_IF_ERROR(qformer.Int("intermediate_size", q.intermediate_size, kMaxWidth));
  RETURN_IF_ERROR(qformer.Int("num_hidden_layers", q.num_hidden_layers, kMaxLayers));
  RETURN_IF_ERROR(qformer.Int("num_attention_heads", q.num_attention_heads, kMaxHeads));
  RETURN_IF_ERROR(
      qformer.Int("cross_attention_frequency", q.cross_attention_frequency, kMaxLayers));
  RETURN_IF_ERROR(qformer.Int("encoder_hidden_size", q.encoder_hidden_size, kMaxWidth));
  RETURN_IF_ERROR(qformer.Double("layer_norm_eps", q.layer_norm_eps));
  RETURN_IF_ERROR(qformer.Probability("hidden_dropout_prob", q.hidden_dropout_prob));
  RETURN_IF_ERROR(
      qformer.Probability("attention_probs_dropout_prob", q.attention_probs_dropout_prob));
  RETURN_IF_ERROR(qformer.Is("hidden_act", "gelu", StatusCode::kUnimplemented));
  bool text_input = false;
  RETURN_IF_ERROR(qformer.Bool("use_qformer_text_input", text_input));
  if (text_input) {
    return UnimplementedError(where + ".use_qformer_text_input (InstructBLIP's) is not built");
  }
  RETURN_IF_ERROR(Divisible(q.hidden_size, q.num_attention_heads,
                            where + ".hidden_size / num_attention_heads"));
  if (q.encoder_hidden_size != vision_hidden_size) {
    return InvalidArgumentError(
        where + ".encoder_hidden_size " + std::to_string(q.encoder_hidden_size) +
        " differs from vision_config.hidden_size " + std::to_string(vision_hidden_size));
  }
  return q;
}

// The config's text_config section: OPT's or T5's.
StatusOr<std::variant<OptConfig, T5Config>> ParseTextConfig(const nlohmann::json& section,
                                                            const std::string& where) {
  std::string text_type = "opt";
  RETURN_IF_ERROR(Fields(section, where).String("model_type", text_type));
  if (text_type == "opt") {
    ASSIGN_OR_RETURN(OptConfig opt, ParseOptConfig(section, where));
    return std::variant<OptConfig, T5Config>(std::move(opt));
  }
  if (text_type == "t5") {
    ASSIGN_OR_RETURN(T5Config t5, ParseT5Config(section, where));
    return std::variant<OptConfig, T5Config>(std::move(t5));
  }
  return UnimplementedError(where + ".model_type " + text_type +
                            ": llmctl builds BLIP-2 with OPT or T5 (Flan-T5)");
}

}  // namespace

Blip2ParameterCounts CountBlip2Parameters(const Blip2Config& c) {
  Blip2ParameterCounts n;
  const Blip2VisionConfig& v = c.vision;
  const int64_t cv = v.hidden_size;
  const int64_t grid = v.image_size / v.patch_size;
  n.vision = cv * 3 * v.patch_size * v.patch_size + cv  // patch embedding (conv with bias)
             + cv + (grid * grid + 1) * cv              // class token, positions
             + 2 * cv;                                  // post_layernorm
  const int64_t vision_layer = 4 * cv                   // two LayerNorms
                               + 3 * cv * cv + (v.qkv_bias ? 3 * cv : 0)  // qkv
                               + cv * cv + cv                             // projection
                               + 2 * cv * v.intermediate_size + v.intermediate_size + cv;  // MLP
  n.vision += v.num_hidden_layers * vision_layer;

  const Blip2QFormerConfig& q = c.qformer;
  const int64_t cq = q.hidden_size;
  auto attention_block = [&](int64_t context) {  // query, key, value, output dense, LayerNorm
    return cq * cq + cq + 2 * (context * cq + cq) + cq * cq + cq + 2 * cq;
  };
  n.qformer = c.num_query_tokens * cq + 2 * cq;  // query tokens, the input LayerNorm
  for (int64_t i = 0; i < q.num_hidden_layers; ++i) {
    n.qformer += attention_block(cq) + 2 * cq * q.intermediate_size + q.intermediate_size + cq +
                 2 * cq;  // FFN (intermediate_query, output_query) and its LayerNorm
    if (i % q.cross_attention_frequency == 0) n.qformer += attention_block(q.encoder_hidden_size);
  }

  n.projection = cq * c.text_hidden_size() + c.text_hidden_size();
  if (const T5Config* t = c.t5()) {
    const int64_t ct = t->d_model;
    const int64_t attention = 4 * ct * t->inner_dim();  // q, k, v (C -> H*D) and o, no biases
    const int64_t ffn = (t->gated_gelu ? 3 : 2) * ct * t->d_ff;
    const int64_t position_bias = t->relative_attention_num_buckets * t->num_heads;  // block 0's
    n.language_model = t->vocab_size * ct                                   // the shared embedding
                       + (t->tie_word_embeddings ? 0 : t->vocab_size * ct)  // lm_head
                       + 2 * ct                                             // the final norms
                       + 2 * position_bias;
    n.language_model += t->num_layers * (attention + ffn + 2 * ct);
    n.language_model +=
        t->num_decoder_layers * (2 * attention + ffn + 3 * ct);  // with cross-attention
    return n;
  }
  const OptConfig& o = *c.opt();
  const int64_t ct = o.hidden_size;
  n.language_model = o.vocab_size * ct + (o.max_position_embeddings + 2) * ct  // tokens, positions
                     + 2 * ct;                                                 // final LayerNorm
  n.language_model += o.num_hidden_layers * (4 * (ct * ct + ct)                // q, k, v, out
                                             + 2 * ct * o.ffn_dim + o.ffn_dim + ct  // fc1, fc2
                                             + 4 * ct);  // two LayerNorms
  return n;
}

std::optional<Blip2Config> Blip2Preset(const std::string& name) {
  Blip2Config c;  // the vision and Q-Former defaults are the published models'
  c.num_query_tokens = 32;
  if (name.starts_with("blip2-flan-t5-")) {
    T5Config t;  // google/flan-t5-xl and -xxl: T5 v1.1, 24 + 24 blocks, an untied head
    t.vocab_size = 32128;
    t.num_layers = 24;
    t.num_decoder_layers = 24;
    t.d_kv = 64;
    if (name == "blip2-flan-t5-xl") {
      t.d_model = 2048;
      t.d_ff = 5120;
      t.num_heads = 32;
    } else if (name == "blip2-flan-t5-xxl") {
      t.d_model = 4096;
      t.d_ff = 10240;
      t.num_heads = 64;
    } else {
      return std::nullopt;
    }
    c.text = t;
    c.image_token_index = 32100;  // after T5's 32,000 pieces and 100 sentinels
    return c;
  }
  OptConfig o;
  o.vocab_size = 50304;
  o.num_hidden_layers = 32;
  o.num_attention_heads = 32;
  if (name == "blip2-opt-2.7b") {
    o.hidden_size = 2560;
    o.ffn_dim = 10240;
  } else if (name == "blip2-opt-6.7b") {
    o.hidden_size = 4096;
    o.ffn_dim = 16384;
  } else {
    return std::nullopt;
  }
  c.text = o;
  c.image_token_index = 50265;
  return c;
}

StatusOr<Blip2Config> ParseBlip2Config(const nlohmann::json& config, const std::string& source) {
  if (!config.is_object()) return InvalidArgumentError(source + ": not a JSON object");
  if (!config.contains("model_type") || config["model_type"] != "blip-2") {
    const nlohmann::json type = config.value("model_type", nlohmann::json());
    return InvalidArgumentError(source + ": model_type " +
                                (type.is_string() ? type.get<std::string>()
                                 : type.is_null() ? std::string("(none)")
                                                  : ShortJson(type)) +
                                ", expected blip-2");
  }
  Blip2Config c;
  Fields top(config, source);
  RETURN_IF_ERROR(top.Int("num_query_tokens", c.num_query_tokens, kMaxQueryTokens));
  if (config.contains("image_token_index") && config["image_token_index"].is_number_integer()) {
    c.image_token_index = config["image_token_index"].get<int64_t>();
  }
  const nlohmann::json empty = nlohmann::json::object();
  auto section = [&](const char* name) -> const nlohmann::json& {
    return config.contains(name) && config[name].is_object() ? config[name] : empty;
  };
  ASSIGN_OR_RETURN(c.vision,
                   ParseVisionConfig(section("vision_config"), source + ": vision_config"));
  ASSIGN_OR_RETURN(c.qformer,
                   ParseQFormerConfig(section("qformer_config"), source + ": qformer_config",
                                      c.vision.hidden_size));
  ASSIGN_OR_RETURN(c.text, ParseTextConfig(section("text_config"), source + ": text_config"));
  if (c.image_token_index >= c.text_vocab_size()) {
    return InvalidArgumentError(
        source + ": image_token_index " + std::to_string(c.image_token_index) +
        " is outside the vocabulary (" + std::to_string(c.text_vocab_size()) + ")");
  }
  return c;
}

nlohmann::json ToHfConfigJson(const Blip2Config& c) {
  using Json = nlohmann::json;
  const Blip2VisionConfig& v = c.vision;
  const Blip2QFormerConfig& q = c.qformer;
  Json text;
  if (const T5Config* t = c.t5()) {
    text = {{"model_type", "t5"},
            {"architectures", Json::array({"T5ForConditionalGeneration"})},
            {"vocab_size", t->vocab_size},
            {"d_model", t->d_model},
            {"d_kv", t->d_kv},
            {"d_ff", t->d_ff},
            {"num_layers", t->num_layers},
            {"num_decoder_layers", t->num_decoder_layers},
            {"num_heads", t->num_heads},
            {"relative_attention_num_buckets", t->relative_attention_num_buckets},
            {"relative_attention_max_distance", t->relative_attention_max_distance},
            {"layer_norm_epsilon", t->layer_norm_epsilon},
            {"dropout_rate", t->dropout_rate},
            {"feed_forward_proj", t->gated_gelu ? "gated-gelu" : "relu"},
            {"tie_word_embeddings", t->tie_word_embeddings},
            {"pad_token_id", t->pad_token_id},
            {"decoder_start_token_id", t->decoder_start_token_id}};
  } else {
    const OptConfig& o = *c.opt();
    text = {{"model_type", "opt"},
            {"architectures", Json::array({"OPTForCausalLM"})},
            {"vocab_size", o.vocab_size},
            {"hidden_size", o.hidden_size},
            {"word_embed_proj_dim", o.hidden_size},
            {"ffn_dim", o.ffn_dim},
            {"num_hidden_layers", o.num_hidden_layers},
            {"num_attention_heads", o.num_attention_heads},
            {"max_position_embeddings", o.max_position_embeddings},
            {"pad_token_id", o.pad_token_id},
            {"dropout", o.dropout},
            {"attention_dropout", o.attention_dropout},
            {"activation_function", "relu"},
            {"do_layer_norm_before", true}};
  }
  return {{"model_type", "blip-2"},
          {"architectures", Json::array({"Blip2ForConditionalGeneration"})},
          {"num_query_tokens", c.num_query_tokens},
          {"image_token_index", c.image_token_index},
          {"vision_config",
           {{"hidden_size", v.hidden_size},
            {"intermediate_size", v.intermediate_size},
            {"num_hidden_layers", v.num_hidden_layers},
            {"num_attention_heads", v.num_attention_heads},
            {"image_size", v.image_size},
            {"patch_size", v.patch_size},
            {"layer_norm_eps", v.layer_norm_eps},
            {"qkv_bias", v.qkv_bias},
            {"attention_dropout", v.attention_dropout},
            {"hidden_act", "gelu"}}},
          {"qformer_config",
           {{"hidden_size", q.hidden_size},
            {"intermediate_size", q.intermediate_size},
            {"num_hidden_layers", q.num_hidden_layers},
            {"num_attention_heads", q.num_attention_heads},
            {"cross_attention_frequency", q.cross_attention_frequency},
            {"encoder_hidden_size", q.encoder_hidden_size},
            {"layer_norm_eps", q.layer_norm_eps},
            {"hidden_dropout_prob", q.hidden_dropout_prob},
            {"attention_probs_dropout_prob", q.attention_probs_dropout_prob},
            {"hidden_act", "gelu"}}},
          {"text_config", text}};
}

StatusOr<std::optional<Blip2Config>> ResolveBlip2Model(std::string_view model) {
  std::string_view name = model;
  if (name.starts_with("Salesforce/")) name.remove_prefix(11);
  if (std::optional<Blip2Config> preset = Blip2Preset(std::string(name))) return preset;
  std::error_code error;
  std::filesystem::path config_path{std::string(model)};
  if (std::filesystem::is_directory(config_path, error)) config_path /= "config.json";
  if (config_path.filename() != "config.json" ||
      !std::filesystem::is_regular_file(config_path, error)) {
    return std::optional<Blip2Config>();
  }
  // A real config.json is a few KB; the limit makes a wrong file fail fast.
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(config_path.string(), 1 << 20));
  const nlohmann::json json = ParseForeignJson(text);
  // A malformed file is ResolveModel's to report, with its own reader's message.
  if (!json.is_object() || !json.contains("model_type") || json["model_type"] != "blip-2") {
    return std::optional<Blip2Config>();
  }
  ASSIGN_OR_RETURN(Blip2Config config, ParseBlip2Config(json, config_path.string()));
  if (config.image_token_index < 0 || config.image_token_index >= config.text_vocab_size()) {
    return InvalidArgumentError(
        config_path.string() + ": image_token_index " + std::to_string(config.image_token_index) +
        " is not a token of the language model's vocabulary of " +
        std::to_string(config.text_vocab_size()) +
        " (configs older than transformers 4.47 lack it: set it to the tokenizer's <image> id)");
  }
  return std::optional<Blip2Config>(std::move(config));
}

}  // namespace llmctl
