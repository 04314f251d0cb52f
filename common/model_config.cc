// ParseHfConfigJson, LoadHfConfig, ToHfConfigJson and ValidateModelConfig (model_config.h): a
// ModelConfig read from and written as a Hugging Face config.json, and its consistency checks.
#include "common/model_config.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "common/files.h"
#include "common/foreign_json.h"
#include "common/model_bounds.h"
#include "common/text.h"

namespace llmctl {
namespace {

using Json = nlohmann::json;

// The model types whose architecture is the LLaMA decoder llmctl's trainer implements.
constexpr std::string_view kSupportedModelTypes[] = {"llama", "mistral", "qwen2"};

std::string_view JsonTypeName(const Json& value) {
  switch (value.type()) {
    case Json::value_t::null:
      return "null";
    case Json::value_t::object:
      return "an object";
    case Json::value_t::array:
      return "a list";
    case Json::value_t::string:
      return "a string";
    case Json::value_t::boolean:
      return "a boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return "an integer";
    case Json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

// Reads typed fields of one JSON object and words every error as "FILE: field 'NAME' ...".
class FieldReader {
 public:
  FieldReader(const Json& object, std::string_view filename, std::string prefix = "")
      : object_(object), filename_(filename), prefix_(std::move(prefix)) {}

  // The field's value, or null when it is absent or JSON null (both mean "use the default").
  const Json* Find(std::string_view name) const {
    auto it = object_.find(std::string(name));
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  Status Error(std::string_view name, std::string_view problem) const {
    return InvalidArgumentError(std::string(filename_) + ": field '" + prefix_ + std::string(name) +
                                "' " + std::string(problem));
  }

  Status Missing(std::string_view name) const {
    return InvalidArgumentError(std::string(filename_) + ": missing required field '" + prefix_ +
                                std::string(name) + "'");
  }

  Status WrongType(std::string_view name, std::string_view expected, const Json& value) const {
    return Error(name, "must be " + std::string(expected) + ", got " +
                           std::string(JsonTypeName(value)) + " " + ShortJson(value));
  }

  StatusOr<std::optional<int64_t>> OptionalInt(std::string_view name) const {
    const Json* value = Find(name);
    if (value == nullptr) return std::optional<int64_t>();
    ASSIGN_OR_RETURN(int64_t number, AsInt(name, *value));
    return std::optional<int64_t>(number);
  }

  StatusOr<int64_t> AsInt(std::string_view name, const Json& value) const {
    if (value.is_number_unsigned()) {
      if (value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Error(name, "is too large: " + ShortJson(value));
      }
      return static_cast<int64_t>(value.get<uint64_t>());
    }
    if (value.is_number_integer()) return value.get<int64_t>();
    return WrongType(name, "an integer", value);
  }

  StatusOr<int64_t> RequiredPositiveInt(std::string_view name) const {
    ASSIGN_OR_RETURN(std::optional<int64_t> value, OptionalInt(name));
    if (!value) return Missing(name);
    if (*value <= 0) return Error(name, "must be positive, got " + std::to_string(*value));
    return *value;
  }

  StatusOr<std::optional<int64_t>> OptionalPositiveInt(std::string_view name) const {
    ASSIGN_OR_RETURN(std::optional<int64_t> value, OptionalInt(name));
    if (value && *value <= 0) return Error(name, "must be positive, got " + std::to_string(*value));
    return value;
  }

  StatusOr<std::optional<double>> OptionalNumber(std::string_view name) const {
    const Json* value = Find(name);
    if (value == nullptr) return std::optional<double>();
    if (!value->is_number()) return WrongType(name, "a number", *value);
    return std::optional<double>(value->get<double>());
  }

  StatusOr<std::optional<bool>> OptionalBool(std::string_view name) const {
    const Json* value = Find(name);
    if (value == nullptr) return std::optional<bool>();
    if (!value->is_boolean()) return WrongType(name, "true or false", *value);
    return std::optional<bool>(value->get<bool>());
  }

  StatusOr<std::optional<std::string>> OptionalString(std::string_view name) const {
    const Json* value = Find(name);
    if (value == nullptr) return std::optional<std::string>();
    if (!value->is_string()) return WrongType(name, "a string", *value);
    return std::optional<std::string>(value->get<std::string>());
  }

 private:
  const Json& object_;
  std::string_view filename_;
  std::string prefix_;
};

// transformers 5 writes "rope_parameters" (rope_theta inside it, rope_type "default" when
// unscaled); earlier versions wrote "rope_scaling" beside a top-level rope_theta. Reads either;
// sets *rope_theta when the object carries one.
StatusOr<std::optional<RopeScaling>> ParseRopeScaling(const FieldReader& top,
                                                      std::string_view filename,
                                                      double* rope_theta) {
  std::string key = "rope_scaling";
  const Json* value = top.Find(key);
  if (value == nullptr || value->is_null()) {
    key = "rope_parameters";
    value = top.Find(key);
  }
  if (value == nullptr || value->is_null()) return std::optional<RopeScaling>();
  if (!value->is_object()) return top.WrongType(key, "an object or null", *value);
  const FieldReader reader(*value, filename, key + ".");
  ASSIGN_OR_RETURN(std::optional<double> theta, reader.OptionalNumber("rope_theta"));
  if (theta) *rope_theta = *theta;
  // transformers wrote "type" before it wrote "rope_type"; either names the kind.
  ASSIGN_OR_RETURN(std::optional<std::string> rope_type, reader.OptionalString("rope_type"));
  if (!rope_type) {
    ASSIGN_OR_RETURN(rope_type, reader.OptionalString("type"));
  }
  if (!rope_type) return reader.Missing("rope_type");
  if (*rope_type == "default") {
    return std::optional<RopeScaling>();  // plain RoPE, written explicitly
  }
  if (*rope_type != "llama3") {
    return reader.Error("rope_type", "is '" + OnOneLine(*rope_type, 64) +
                                         "', which llmctl does not implement (supported: llama3; "
                                         "linear, dynamic, yarn and longrope scaling are not)");
  }
  RopeScaling scaling;
  scaling.rope_type = *rope_type;
  const std::pair<std::string_view, double*> factors[] = {
      {"factor", &scaling.factor},
      {"low_freq_factor", &scaling.low_freq_factor},
      {"high_freq_factor", &scaling.high_freq_factor},
  };
  for (const auto& [name, target] : factors) {
    ASSIGN_OR_RETURN(std::optional<double> number, reader.OptionalNumber(name));
    if (!number) return reader.Missing(name);
    *target = *number;
  }
  ASSIGN_OR_RETURN(std::optional<int64_t> original,
                   reader.OptionalInt("original_max_position_embeddings"));
  if (!original) return reader.Missing("original_max_position_embeddings");
  scaling.original_max_position_embeddings = *original;
  return std::optional<RopeScaling>(scaling);
}

// model_type, which must be one llmctl trains.
Status ReadModelType(const FieldReader& reader, ModelConfig& config) {
  ASSIGN_OR_RETURN(std::optional<std::string> model_type, reader.OptionalString("model_type"));
  if (model_type) config.model_type = *model_type;
  if (std::find(std::begin(kSupportedModelTypes), std::end(kSupportedModelTypes),
                config.model_type) == std::end(kSupportedModelTypes)) {
    return reader.Error("model_type",
                        "is '" + OnOneLine(config.model_type, 64) +
                            "', which llmctl cannot train; supported: llama, mistral, "
                            "qwen2 (LLaMA-family decoders)");
  }
  return Status::Ok();
}

// The sizes: vocabulary, widths, layers, heads and positions.
Status ReadShape(const FieldReader& reader, std::string_view filename, ModelConfig& config) {
  ASSIGN_OR_RETURN(config.vocab_size, reader.RequiredPositiveInt("vocab_size"));
  ASSIGN_OR_RETURN(config.hidden_size, reader.RequiredPositiveInt("hidden_size"));
  ASSIGN_OR_RETURN(config.intermediate_size, reader.RequiredPositiveInt("intermediate_size"));
  ASSIGN_OR_RETURN(config.num_hidden_layers, reader.RequiredPositiveInt("num_hidden_layers"));
  ASSIGN_OR_RETURN(config.num_attention_heads, reader.RequiredPositiveInt("num_attention_heads"));

  ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                   reader.OptionalPositiveInt("num_key_value_heads"));
  config.num_key_value_heads = kv_heads.value_or(config.num_attention_heads);

  ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, reader.OptionalPositiveInt("head_dim"));
  if (head_dim) {
    config.head_dim = *head_dim;
  } else {
    // Only a derived head_dim needs hidden_size to split evenly; models that state it (Mistral
    // Nemo) may not.
    if (config.hidden_size % config.num_attention_heads != 0) {
      return InvalidArgumentError(
          std::string(filename) + ": field 'hidden_size' (" + std::to_string(config.hidden_size) +
          ") is not divisible by 'num_attention_heads' (" +
          std::to_string(config.num_attention_heads) + ") and no 'head_dim' is given");
    }
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }

  ASSIGN_OR_RETURN(std::optional<int64_t> max_positions,
                   reader.OptionalPositiveInt("max_position_embeddings"));
  config.max_position_embeddings = max_positions.value_or(2048);
  return Status::Ok();
}

// Tied embeddings, the attention and MLP biases, and the sliding window, as each model type reads
// them.
Status ReadArchitectureFlags(const FieldReader& reader, ModelConfig& config) {
  ASSIGN_OR_RETURN(std::optional<bool> tied, reader.OptionalBool("tie_word_embeddings"));
  config.tie_word_embeddings = tied.value_or(false);

  ASSIGN_OR_RETURN(std::optional<bool> attention_bias, reader.OptionalBool("attention_bias"));
  if (config.model_type == "qwen2") {
    config.attention_qkv_bias = true;
    config.attention_output_bias = false;
  } else {
    config.attention_qkv_bias = attention_bias.value_or(false);
    config.attention_output_bias = attention_bias.value_or(false);
  }
  ASSIGN_OR_RETURN(std::optional<bool> mlp_bias, reader.OptionalBool("mlp_bias"));
  config.mlp_bias = mlp_bias.value_or(false);

  // Mistral states a window (null from v0.2 on); Qwen2 states one but uses it only with
  // use_sliding_window.
  ASSIGN_OR_RETURN(std::optional<int64_t> window, reader.OptionalPositiveInt("sliding_window"));
  if (config.model_type == "mistral") {
    config.sliding_window = window;
  } else if (config.model_type == "qwen2") {
    ASSIGN_OR_RETURN(std::optional<bool> use_window, reader.OptionalBool("use_sliding_window"));
    if (use_window.value_or(false)) config.sliding_window = window;
  }
  return Status::Ok();
}

// bos_token_id, and eos_token_id: one id or a list of them.
Status ReadSpecialTokens(const FieldReader& reader, ModelConfig& config) {
  ASSIGN_OR_RETURN(config.bos_token_id, reader.OptionalInt("bos_token_id"));
  const Json* eos = reader.Find("eos_token_id");
  if (eos == nullptr) return Status::Ok();
  if (eos->is_array()) {
    for (const Json& id : *eos) {
      ASSIGN_OR_RETURN(int64_t value, reader.AsInt("eos_token_id", id));
      config.eos_token_ids.push_back(value);
    }
  } else {
    ASSIGN_OR_RETURN(int64_t value, reader.AsInt("eos_token_id", *eos));
    config.eos_token_ids.push_back(value);
  }
  if (!config.eos_token_ids.empty()) config.eos_token_id = config.eos_token_ids.front();
  return Status::Ok();
}

StatusOr<ModelConfig> ParseHfConfigObject(const Json& root, std::string_view filename) {
  if (!root.is_object()) {
    return InvalidArgumentError(std::string(filename) +
                                ": expected a JSON object at the top level, got " +
                                std::string(JsonTypeName(root)));
  }
  const FieldReader reader(root, filename);
  ModelConfig config;
  RETURN_IF_ERROR(ReadModelType(reader, config));
  RETURN_IF_ERROR(ReadShape(reader, filename, config));

  ASSIGN_OR_RETURN(std::optional<double> eps, reader.OptionalNumber("rms_norm_eps"));
  if (eps) config.rms_norm_eps = *eps;
  ASSIGN_OR_RETURN(std::optional<double> theta, reader.OptionalNumber("rope_theta"));
  if (theta) config.rope_theta = *theta;
  ASSIGN_OR_RETURN(config.rope_scaling, ParseRopeScaling(reader, filename, &config.rope_theta));

  RETURN_IF_ERROR(ReadArchitectureFlags(reader, config));
  RETURN_IF_ERROR(ReadSpecialTokens(reader, config));

  // transformers 4.56 renamed torch_dtype to dtype.
  ASSIGN_OR_RETURN(std::optional<std::string> dtype, reader.OptionalString("torch_dtype"));
  if (!dtype) {
    ASSIGN_OR_RETURN(dtype, reader.OptionalString("dtype"));
  }
  config.torch_dtype = dtype.value_or("");

  ASSIGN_OR_RETURN(std::optional<std::string> activation, reader.OptionalString("hidden_act"));
  config.hidden_act = activation.value_or("silu");

  Status valid = ValidateModelConfig(config);
  if (!valid.ok()) return valid.WithContext(filename);
  return config;
}

}  // namespace

namespace {

Status FieldError(std::string_view field, std::string problem) {
  return InvalidArgumentError("field '" + std::string(field) + "' " + problem);
}

// Every size positive and within common/model_bounds.h's bound.
Status ValidateSizes(const ModelConfig& config) {
  struct Size {
    std::string_view field;
    int64_t value;
    int64_t bound;
  };
  const Size sizes[] = {
      {"vocab_size", config.vocab_size, model_bounds::kMaxVocabulary},
      {"hidden_size", config.hidden_size, model_bounds::kMaxWidth},
      {"intermediate_size", config.intermediate_size, model_bounds::kMaxWidth},
      {"num_hidden_layers", config.num_hidden_layers, model_bounds::kMaxLayers},
      {"num_attention_heads", config.num_attention_heads, model_bounds::kMaxHeads},
      {"num_key_value_heads", config.num_key_value_heads, model_bounds::kMaxHeads},
      {"head_dim", config.head_dim, model_bounds::kMaxWidth},
      {"max_position_embeddings", config.max_position_embeddings, model_bounds::kMaxPositions},
  };
  for (const Size& size : sizes) {
    if (size.value <= 0) {
      return FieldError(size.field, "must be positive, got " + std::to_string(size.value));
    }
    if (size.value > size.bound) {
      return FieldError(size.field, "is " + std::to_string(size.value) + ", more than " +
                                        std::to_string(size.bound) +
                                        ", far past any published model's");
    }
  }
  return Status::Ok();
}

Status ValidateRopeScaling(const RopeScaling& scaling) {
  if (scaling.rope_type != "llama3") {
    return FieldError("rope_scaling.rope_type",
                      "is '" + OnOneLine(scaling.rope_type, 64) + "'; supported: llama3");
  }
  if (!(scaling.factor > 0)) return FieldError("rope_scaling.factor", "must be positive");
  if (!(scaling.low_freq_factor > 0)) {
    return FieldError("rope_scaling.low_freq_factor", "must be positive");
  }
  if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
    return FieldError("rope_scaling.high_freq_factor",
                      "must be greater than 'rope_scaling.low_freq_factor' (the blend between them "
                      "divides by their difference)");
  }
  if (scaling.original_max_position_embeddings <= 0) {
    return FieldError("rope_scaling.original_max_position_embeddings", "must be positive");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateModelConfig(const ModelConfig& config) {
  if (std::find(std::begin(kSupportedModelTypes), std::end(kSupportedModelTypes),
                config.model_type) == std::end(kSupportedModelTypes)) {
    return FieldError("model_type", "is '" + OnOneLine(config.model_type, 64) +
                                        "'; supported: llama, mistral, qwen2");
  }
  RETURN_IF_ERROR(ValidateSizes(config));
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return FieldError("num_attention_heads",
                      "(" + std::to_string(config.num_attention_heads) +
                          ") is not divisible by 'num_key_value_heads' (" +
                          std::to_string(config.num_key_value_heads) +
                          "): each key/value head must serve the same number of query heads");
  }
  if (config.head_dim % 2 != 0) {
    return FieldError("head_dim",
                      "(" + std::to_string(config.head_dim) +
                          ") must be even: rotary embeddings rotate pairs of dimensions");
  }
  if (!(config.rms_norm_eps > 0)) return FieldError("rms_norm_eps", "must be positive");
  if (!(config.rope_theta > 0)) return FieldError("rope_theta", "must be positive");
  if (config.rope_scaling) RETURN_IF_ERROR(ValidateRopeScaling(*config.rope_scaling));
  if (config.sliding_window && *config.sliding_window <= 0) {
    return FieldError("sliding_window", "must be positive");
  }
  if (config.hidden_act != "silu") {
    return FieldError("hidden_act",
                      "is '" + OnOneLine(config.hidden_act, 64) +
                          "'; LLaMA-family MLPs use 'silu' (SwiGLU), the only one llmctl "
                          "implements");
  }
  return Status::Ok();
}

StatusOr<ModelConfig> ParseHfConfigJson(std::string_view json_text, std::string_view filename) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& error) {
    // Not only parse_error: a number too large for a double ("1e999") throws out_of_range.406.
    return InvalidArgumentError(std::string(filename) + ": invalid JSON: " +
                                std::string(WithoutJsonCategory(error.what())));
  }
  try {
    return ParseHfConfigObject(root, filename);
  } catch (const Json::exception& error) {  // defensive: the reader checks types before every get<>
    return InvalidArgumentError(std::string(filename) + ": " + error.what());
  }
}

StatusOr<ModelConfig> LoadHfConfig(const std::string& model_dir) {
  const std::filesystem::path path = std::filesystem::path(model_dir) / "config.json";
  // A real config.json is a few KB; the limit makes a wrong file fail fast.
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path.string(), 1 << 20));
  return ParseHfConfigJson(text, path.string());
}

nlohmann::json ToHfConfigJson(const ModelConfig& config) {
  Json json = Json::object();
  const char* architecture = config.model_type == "mistral" ? "MistralForCausalLM"
                             : config.model_type == "qwen2" ? "Qwen2ForCausalLM"
                                                            : "LlamaForCausalLM";
  json["architectures"] = Json::array({architecture});
  json["model_type"] = config.model_type;
  json["vocab_size"] = config.vocab_size;
  json["hidden_size"] = config.hidden_size;
  json["intermediate_size"] = config.intermediate_size;
  json["num_hidden_layers"] = config.num_hidden_layers;
  json["num_attention_heads"] = config.num_attention_heads;
  json["num_key_value_heads"] = config.num_key_value_heads;
  json["head_dim"] = config.head_dim;
  json["max_position_embeddings"] = config.max_position_embeddings;
  json["rms_norm_eps"] = config.rms_norm_eps;
  json["rope_theta"] = config.rope_theta;
  if (config.rope_scaling) {
    json["rope_scaling"] = {
        {"rope_type", config.rope_scaling->rope_type},
        {"factor", config.rope_scaling->factor},
        {"low_freq_factor", config.rope_scaling->low_freq_factor},
        {"high_freq_factor", config.rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", config.rope_scaling->original_max_position_embeddings},
    };
  } else {
    json["rope_scaling"] = nullptr;
  }
  json["tie_word_embeddings"] = config.tie_word_embeddings;
  if (config.model_type != "qwen2") json["attention_bias"] = config.attention_qkv_bias;
  json["mlp_bias"] = config.mlp_bias;
  if (config.model_type == "qwen2") json["use_sliding_window"] = config.sliding_window.has_value();
  if (config.sliding_window) json["sliding_window"] = *config.sliding_window;
  if (config.bos_token_id) json["bos_token_id"] = *config.bos_token_id;
  if (config.eos_token_ids.size() > 1) {
    json["eos_token_id"] = config.eos_token_ids;
  } else if (config.eos_token_id) {
    json["eos_token_id"] = *config.eos_token_id;
  }
  if (!config.torch_dtype.empty()) json["torch_dtype"] = config.torch_dtype;
  json["hidden_act"] = config.hidden_act;
  return json;
}

}  // namespace llmctl
