#include "common/model_config.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "common/files.h"
#include "common/spelling.h"
#include "common/text.h"

namespace llmctl {
namespace {

using Json = nlohmann::json;

// The model types whose architecture is the LLaMA decoder llmctl's trainer implements.
constexpr std::string_view kSupportedModelTypes[] = {"llama", "mistral", "qwen2"};

// True when `value` nests at most `levels` lists or objects deep.
bool NestsAtMost(const Json& value, int levels) {
  if (!value.is_structured()) return true;
  if (levels == 0) return false;
  for (const Json& item : value) {
    if (!NestsAtMost(item, levels - 1)) return false;
  }
  return true;
}

std::string ShortJson(const Json& value) {
  // dump() recurses once per level: a deeply nested value in a wrong-typed field would overflow the
  // stack just to be cut to 40 characters.
  if (!NestsAtMost(value, 16)) return value.is_array() ? "[...]" : "{...}";
  std::string text = value.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  return text;
}

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

std::string JoinNames(const std::vector<std::string>& names) {
  std::string joined;
  for (const std::string& name : names) {
    if (!joined.empty()) joined += ", ";
    joined += name;
  }
  return joined;
}

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
    return reader.Error("rope_type", "is '" + *rope_type +
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
                        "is '" + config.model_type +
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

struct Preset {
  std::string name;
  std::vector<std::string> aliases;
  ModelConfig config;
};

ModelConfig LlamaShape(int64_t vocab, int64_t hidden, int64_t intermediate, int64_t layers,
                       int64_t heads, int64_t kv_heads, int64_t max_positions, double eps) {
  ModelConfig config;
  config.model_type = "llama";
  config.vocab_size = vocab;
  config.hidden_size = hidden;
  config.intermediate_size = intermediate;
  config.num_hidden_layers = layers;
  config.num_attention_heads = heads;
  config.num_key_value_heads = kv_heads;
  config.head_dim = hidden / heads;
  config.max_position_embeddings = max_positions;
  config.rms_norm_eps = eps;
  config.rope_theta = 10000.0;
  return config;
}

// Published shapes, from each repository's config.json (cross-checked with LitGPT's config table).
const std::vector<Preset>& Presets() {
  static const std::vector<Preset>* const presets = [] {
    auto* list = new std::vector<Preset>();
    auto with_tokens = [](ModelConfig config, std::string dtype, std::string repo) {
      config.bos_token_id = 1;
      config.eos_token_id = 2;
      config.eos_token_ids = {2};
      config.torch_dtype = std::move(dtype);
      config.hf_repo_id = std::move(repo);
      return config;
    };
    list->push_back({"tinyllama-1.1b",
                     {"TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T"},
                     with_tokens(LlamaShape(32000, 2048, 5632, 22, 32, 4, 2048, 1e-5), "float32",
                                 "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T")});
    list->push_back({"open_llama_3b",
                     {"openlm-research/open_llama_3b"},
                     with_tokens(LlamaShape(32000, 3200, 8640, 26, 32, 32, 2048, 1e-6), "float16",
                                 "openlm-research/open_llama_3b")});
    list->push_back({"open_llama_7b",
                     {"openlm-research/open_llama_7b"},
                     with_tokens(LlamaShape(32000, 4096, 11008, 32, 32, 32, 2048, 1e-6), "float16",
                                 "openlm-research/open_llama_7b")});
    list->push_back({"open_llama_13b",
                     {"openlm-research/open_llama_13b"},
                     with_tokens(LlamaShape(32000, 5120, 13824, 40, 40, 40, 2048, 1e-6), "float16",
                                 "openlm-research/open_llama_13b")});
    // Small enough to train for a few steps on a laptop CPU in seconds, yet with every feature the
    // big ones have that changes memory: GQA (2 KV heads for 4 query heads) and tied embeddings.
    // Its token ids come from the demo tokenizer, so none are fixed here.
    ModelConfig demo = LlamaShape(2048, 128, 352, 4, 4, 2, 512, 1e-5);
    demo.tie_word_embeddings = true;
    demo.torch_dtype = "float32";
    list->push_back({"llmctl-demo", {}, demo});
    return list;
  }();
  return *presets;
}

const Preset* FindPresetEntry(std::string_view name) {
  for (const Preset& preset : Presets()) {
    if (EqualsIgnoreCase(preset.name, name)) return &preset;
    for (const std::string& alias : preset.aliases) {
      if (EqualsIgnoreCase(alias, name)) return &preset;
    }
  }
  return nullptr;
}

}  // namespace

Status ValidateModelConfig(const ModelConfig& config) {
  auto field_error = [](std::string_view field, std::string problem) {
    return InvalidArgumentError("field '" + std::string(field) + "' " + problem);
  };
  if (std::find(std::begin(kSupportedModelTypes), std::end(kSupportedModelTypes),
                config.model_type) == std::end(kSupportedModelTypes)) {
    return field_error("model_type",
                       "is '" + config.model_type + "'; supported: llama, mistral, qwen2");
  }
  const std::pair<std::string_view, int64_t> sizes[] = {
      {"vocab_size", config.vocab_size},
      {"hidden_size", config.hidden_size},
      {"intermediate_size", config.intermediate_size},
      {"num_hidden_layers", config.num_hidden_layers},
      {"num_attention_heads", config.num_attention_heads},
      {"num_key_value_heads", config.num_key_value_heads},
      {"head_dim", config.head_dim},
      {"max_position_embeddings", config.max_position_embeddings},
  };
  for (const auto& [field, value] : sizes) {
    if (value <= 0) return field_error(field, "must be positive, got " + std::to_string(value));
  }
  if (config.num_attention_heads % config.num_key_value_heads != 0) {
    return field_error("num_attention_heads",
                       "(" + std::to_string(config.num_attention_heads) +
                           ") is not divisible by 'num_key_value_heads' (" +
                           std::to_string(config.num_key_value_heads) +
                           "): each key/value head must serve the same number of query heads");
  }
  if (config.head_dim % 2 != 0) {
    return field_error("head_dim",
                       "(" + std::to_string(config.head_dim) +
                           ") must be even: rotary embeddings rotate pairs of dimensions");
  }
  if (!(config.rms_norm_eps > 0)) return field_error("rms_norm_eps", "must be positive");
  if (!(config.rope_theta > 0)) return field_error("rope_theta", "must be positive");
  if (config.rope_scaling) {
    const RopeScaling& scaling = *config.rope_scaling;
    if (scaling.rope_type != "llama3") {
      return field_error("rope_scaling.rope_type",
                         "is '" + scaling.rope_type + "'; supported: llama3");
    }
    if (!(scaling.factor > 0)) return field_error("rope_scaling.factor", "must be positive");
    if (!(scaling.low_freq_factor > 0)) {
      return field_error("rope_scaling.low_freq_factor", "must be positive");
    }
    if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
      return field_error(
          "rope_scaling.high_freq_factor",
          "must be greater than 'rope_scaling.low_freq_factor' (the blend between them "
          "divides by their difference)");
    }
    if (scaling.original_max_position_embeddings <= 0) {
      return field_error("rope_scaling.original_max_position_embeddings", "must be positive");
    }
  }
  if (config.sliding_window && *config.sliding_window <= 0) {
    return field_error("sliding_window", "must be positive");
  }
  if (config.hidden_act != "silu") {
    return field_error("hidden_act",
                       "is '" + config.hidden_act +
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
    // nlohmann's what() starts with "[json.exception.parse_error.101] "; the rest says where and
    // why.
    std::string what = error.what();
    const size_t bracket = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && bracket != std::string::npos)
      what = what.substr(bracket + 2);
    return InvalidArgumentError(std::string(filename) + ": invalid JSON: " + what);
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

const ModelConfig* FindPreset(std::string_view name) {
  const Preset* preset = FindPresetEntry(name);
  return preset == nullptr ? nullptr : &preset->config;
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const Preset& preset : Presets()) names.push_back(preset.name);
  return names;
}

std::string CanonicalPresetName(std::string_view name) {
  const Preset* preset = FindPresetEntry(name);
  return preset == nullptr ? "" : preset->name;
}

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

namespace {

bool IsRepoIdChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

// The hub's rule for one half of a repository id.
bool IsRepoIdPart(std::string_view part) {
  return !part.empty() && part.size() <= 96 &&
         std::all_of(part.begin(), part.end(), IsRepoIdChar) &&
         part.find("--") == std::string_view::npos && part.find("..") == std::string_view::npos &&
         part.front() != '.' && part.front() != '-' && part.back() != '.' && part.back() != '-';
}

}  // namespace

bool IsHubModelRef(std::string_view model) { return model.starts_with(kHubModelPrefix); }

StatusOr<HubModelRef> MakeHubModelRef(std::string_view repo, std::string_view revision) {
  const size_t slash = repo.find('/');
  if (slash == std::string_view::npos || !IsRepoIdPart(repo.substr(0, slash)) ||
      !IsRepoIdPart(repo.substr(slash + 1))) {
    return InvalidArgumentError(
        "'" + std::string(repo) +
        "' is not a Hugging Face repository id: expected ORG/NAME, each part 1-96 letters, digits, "
        "'.', '_' or '-' (e.g. TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T)");
  }
  if (revision.empty()) revision = "main";
  const bool revision_ok = revision.size() <= 255 &&
                           std::all_of(revision.begin(), revision.end(),
                                       [](char c) { return IsRepoIdChar(c) || c == '/'; }) &&
                           revision.find("..") == std::string_view::npos &&
                           revision.front() != '/' && revision.back() != '/' &&
                           revision.find("//") == std::string_view::npos;
  if (!revision_ok) {
    return InvalidArgumentError("'" + std::string(revision) +
                                "' is not a revision: expected a branch, tag or commit of letters, "
                                "digits, '.', '_', '-' and '/'");
  }
  return HubModelRef{std::string(repo), std::string(revision)};
}

StatusOr<HubModelRef> ParseHubModelRef(std::string_view model) {
  if (!IsHubModelRef(model)) {
    return InvalidArgumentError("'" + std::string(model) + "' does not start with hf:");
  }
  std::string_view rest = model.substr(kHubModelPrefix.size());
  std::string_view revision;
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    revision = rest.substr(at + 1);
    rest = rest.substr(0, at);
    if (revision.empty()) {
      return InvalidArgumentError("model " + std::string(model) +
                                  ": nothing after '@'; write hf:ORG/NAME or hf:ORG/NAME@REVISION");
    }
  }
  auto ref = MakeHubModelRef(rest, revision);
  if (!ref.ok()) return ref.status().WithContext("model " + std::string(model));
  return ref;
}

std::string HubModelRefText(const HubModelRef& ref) {
  return std::string(kHubModelPrefix) + ref.repo + "@" + ref.revision;
}

StatusOr<ModelConfig> ResolveModel(std::string_view model) {
  if (const ModelConfig* preset = FindPreset(model)) return *preset;
  if (IsHubModelRef(model)) {
    ASSIGN_OR_RETURN(const HubModelRef ref, ParseHubModelRef(model));
    return FailedPreconditionError(
        "model " + std::string(model) +
        " is on the Hugging Face hub, and llm-train only reads models on disk: submit the "
        "experiment with llmctl (its agent downloads the model), or download it yourself "
        "(huggingface-cli download " +
        ref.repo + " --revision " + ref.revision + " --local-dir DIR) and set model: DIR");
  }
  const std::vector<std::string> names = PresetNames();
  std::error_code error;
  const std::filesystem::path path{std::string(model)};
  if (!model.empty() && std::filesystem::is_directory(path, error)) {
    if (!std::filesystem::exists(path / "config.json", error)) {
      return NotFoundError(
          "model directory '" + std::string(model) +
          "' has no config.json (a Hugging Face model directory holds config.json and "
          "the weights)");
    }
    return LoadHfConfig(path.string());
  }
  if (!model.empty() && path.filename() == "config.json" &&
      std::filesystem::is_regular_file(path, error)) {
    return LoadHfConfig(path.parent_path().string());
  }
  std::vector<std::string_view> candidates(names.begin(), names.end());
  const std::string_view suggestion = ClosestMatch(model, candidates);
  std::string message = "unknown model '" + std::string(model) + "'";
  if (!suggestion.empty()) message += " (did you mean '" + std::string(suggestion) + "'?)";
  message += ": not a preset (" + JoinNames(names) + ") and not a directory containing config.json";
  return NotFoundError(message);
}

}  // namespace llmctl
