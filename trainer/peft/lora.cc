#include "trainer/peft/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "common/atomic_file.h"
#include "common/files.h"
#include "common/foreign_json.h"
#include "common/inputs/trial_inputs.h"
#include "common/model_config.h"
#include "common/safetensors/safetensors.h"
#include "trainer/model/weights.h"
#include "trainer/train/checkpoints.h"

namespace llmctl::trainer {
namespace {

using nlohmann::json;

// PEFT's prefix for a causal LM's tensors: PeftModel.base_model (LoraModel) .model (the
// transformers model).
constexpr std::string_view kPeftPrefix = "base_model.model.";

std::string_view LastSegment(std::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == std::string_view::npos ? name : name.substr(dot + 1);
}

// The targets in kLoraTargets' order, so files do not depend on how the trial listed them.
std::vector<std::string> SortedTargets(const std::vector<std::string>& targets) {
  std::vector<std::string> sorted;
  for (std::string_view name : kLoraTargets) {
    if (std::find(targets.begin(), targets.end(), name) != targets.end()) sorted.emplace_back(name);
  }
  return sorted;
}

// The metadata transformers and PEFT write into safetensors files (transformers refuses other
// formats).
std::map<std::string, std::string> TorchFormat() { return {{"format", "pt"}}; }

Status WriteJson(const std::string& path, const json& value) {
  const std::string text = value.dump(2) + "\n";
  return WriteFileAtomically(path, [&](int fd) { return WriteAll(fd, text.data(), text.size()); });
}

Status CreateDirectory(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return UnavailableError("cannot create " + dir + ": " + error.message());
  return Status::Ok();
}

// Checks a PEFT adapter_config.json against the adapters the trial asked for. Malformed files are
// DataLoss; well-formed files describing another adapter are InvalidArgument.
Status CheckAdapterConfig(const json& file, const LoraConfig& config, const std::string& path) {
  if (!file.is_object()) return DataLossError(path + ": expected a JSON object");
  auto field = [&](const char* name) -> const json* {
    auto it = file.find(name);
    return it == file.end() ? nullptr : &*it;
  };
  auto missing = [&](const char* name, const char* type) {
    return DataLossError(path + ": field '" + name + "' is missing or not " + type);
  };
  auto differs = [&](const char* name, const json& value, const std::string& key,
                     const json& want) {
    return InvalidArgumentError(path + ": " + name + " is " + value.dump() + ", but " + key +
                                " is " + want.dump() + " (set " + key + " to match the adapter)");
  };
  auto unsupported = [&](const char* name, const json& value) {
    return InvalidArgumentError(path + ": " + name + " " + value.dump() +
                                " is not supported (llmctl runs plain LoRA)");
  };

  const json* peft_type = field("peft_type");
  if (peft_type == nullptr || !peft_type->is_string()) return missing("peft_type", "a string");
  if (*peft_type != "LORA") {
    return InvalidArgumentError(path + ": peft_type is " + peft_type->dump() +
                                "; llmctl loads LORA adapters only");
  }
  const json* r = field("r");
  if (r == nullptr || !r->is_number_integer()) return missing("r", "an integer");
  if (r->get<int64_t>() != config.options.r) return differs("r", *r, "peft.r", config.options.r);
  const json* alpha = field("lora_alpha");
  if (alpha == nullptr || !alpha->is_number()) return missing("lora_alpha", "a number");
  if (alpha->get<double>() != config.options.alpha) {
    return differs("lora_alpha", *alpha, "peft.alpha", config.options.alpha);
  }
  const json* targets = field("target_modules");
  if (targets == nullptr || !targets->is_array()) {
    // PEFT also takes one string, a regular expression over module names.
    return missing("target_modules", "a list of module names");
  }
  std::vector<std::string> names;
  for (const json& name : *targets) {
    if (!name.is_string()) return missing("target_modules", "a list of module names");
    names.push_back(name.get<std::string>());
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> want = config.targets;
  std::sort(want.begin(), want.end());
  if (names != want)
    return differs("target_modules", *targets, "peft.targets", SortedTargets(want));
  for (const char* flag : {"use_rslora", "use_dora", "fan_in_fan_out", "lora_bias"}) {
    const json* value = field(flag);
    if (value != nullptr && value->is_boolean() && value->get<bool>())
      return unsupported(flag, *value);
  }
  if (const json* bias = field("bias"); bias != nullptr && *bias != "none") {
    return unsupported("bias", *bias);
  }
  for (const char* pattern : {"rank_pattern", "alpha_pattern"}) {
    const json* value = field(pattern);
    if (value != nullptr && !value->is_null() && !value->empty())
      return unsupported(pattern, *value);
  }
  if (const json* layers = field("layers_to_transform"); layers != nullptr && !layers->is_null()) {
    return unsupported("layers_to_transform", *layers);
  }
  return Status::Ok();
}

// Tensors PEFT also saves when an embedding layer is targeted (save_embedding_layers): copies of
// the frozen base weights, which come from the base model here.
bool IsEmbeddingLayerCopy(std::string_view name) {
  for (std::string_view suffix : {"embed_tokens.weight", "embed_tokens.base_layer.weight",
                                  "lm_head.weight", "lm_head.base_layer.weight"}) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

}  // namespace

std::optional<LoraConfig> LoraConfigFor(const PeftSettings& peft) {
  if (peft.method == trial::PeftMethod::kNone) return std::nullopt;
  LoraConfig config;
  config.options.r = peft.r;
  config.options.alpha = peft.alpha;
  config.options.dropout = peft.dropout;
  config.targets = peft.targets;
  if (peft.method == trial::PeftMethod::kQlora) {
    config.nf4 = Nf4Options{.double_quant = peft.double_quant,
                            .compute_dtype = peft.compute_dtype == trial::ComputeDtype::kFp32
                                                 ? torch::kFloat32
                                                 : torch::kBFloat16};
  }
  return config;
}

bool IsAdapterParameter(std::string_view name) {
  return name.find(".lora_A.") != std::string_view::npos ||
         name.find(".lora_B.") != std::string_view::npos;
}

void ApplyLora(LlamaForCausalLM& model, const LoraConfig& config) { ApplyLora(*model, config); }

void ApplyLora(torch::nn::Module& model, const LoraConfig& config) {
  for (torch::Tensor& param : model.parameters()) param.requires_grad_(false);
  for (auto& [name, projection] : NamedProjections(model)) {
    const std::string_view target = LastSegment(name);
    if (std::find(config.targets.begin(), config.targets.end(), target) != config.targets.end()) {
      projection->AddAdapter(config.options);
    }
  }
}

Status LoadAdapter(LlamaForCausalLM& model, const LoraConfig& config, const std::string& dir) {
  return LoadAdapter(*model, config, dir);
}

Status LoadAdapter(torch::nn::Module& model, const LoraConfig& config, const std::string& dir) {
  const std::string config_path = dir + "/" + kAdapterConfigFile;
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path, kMaxAdapterConfigBytes));
  const json file = ParseForeignJson(text);
  if (file.is_discarded()) return DataLossError(config_path + ": not valid JSON");
  RETURN_IF_ERROR(CheckAdapterConfig(file, config, config_path));

  const std::string weights_path = dir + "/" + kAdapterWeightsFile;
  ASSIGN_OR_RETURN(auto weights, safetensors::SafetensorsFile::Open(weights_path));
  std::set<std::string, std::less<>> used;
  for (auto& item : model.named_parameters()) {
    if (!IsAdapterParameter(item.key())) continue;
    const std::string name = std::string(kPeftPrefix) + item.key();
    const safetensors::TensorView* view = weights->Find(name);
    if (view == nullptr) return DataLossError(weights_path + ": tensor '" + name + "' is missing");
    RETURN_IF_ERROR(CopyTensorFromView(*view, item.value(), weights_path));
    used.insert(name);
  }
  for (const safetensors::TensorView& view : weights->tensors()) {
    if (used.contains(view.name) || IsEmbeddingLayerCopy(view.name)) continue;
    return DataLossError(weights_path + ": unexpected tensor '" + view.name +
                         "' (not a LoRA adapter of the projections adapter_config.json targets)");
  }
  return Status::Ok();
}

Status CheckLoraTargets(torch::nn::Module& model, const LoraConfig& config) {
  std::vector<std::string> kinds;  // the model's projection names' last parts, in module order
  for (const auto& [name, projection] : NamedProjections(model)) {
    const std::string kind = name.substr(name.rfind('.') + 1);
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) kinds.push_back(kind);
  }
  for (const std::string& target : config.targets) {
    if (std::find(kinds.begin(), kinds.end(), target) != kinds.end()) continue;
    std::string known;
    for (const std::string& kind : kinds) known += (known.empty() ? "" : ", ") + kind;
    return InvalidArgumentError("peft.targets: this model has no projection named " + target +
                                " (its projections: " + known + ")");
  }
  return Status::Ok();
}

Status SaveAdapter(LlamaForCausalLM& model, const LoraConfig& config, const std::string& base_model,
                   const std::string& dir) {
  return SaveAdapter(*model, config, base_model, "CAUSAL_LM", dir);
}

Status SaveAdapter(torch::nn::Module& model, const LoraConfig& config,
                   const std::string& base_model, const std::string& task_type,
                   const std::string& dir) {
  return SaveAdapter(ModelState(model), config, base_model, task_type, dir);
}

Status SaveAdapter(const NamedTensors& model_state, const LoraConfig& config,
                   const std::string& base_model, const std::string& task_type,
                   const std::string& dir) {
  RETURN_IF_ERROR(CreateDirectory(dir));
  NamedTensors tensors;
  for (const auto& [name, tensor] : model_state) {
    if (IsAdapterParameter(name)) tensors.emplace_back(std::string(kPeftPrefix) + name, tensor);
  }
  RETURN_IF_ERROR(WriteTensors(dir + "/" + kAdapterWeightsFile, tensors, TorchFormat()));
  // PEFT's LoraConfig fields for plain LoRA; the ones left out take PEFT's defaults when it loads.
  const json adapter_config{
      {"peft_type", "LORA"},
      {"task_type", task_type.empty() ? json(nullptr) : json(task_type)},
      {"base_model_name_or_path", base_model},
      {"revision", nullptr},
      {"inference_mode", true},
      {"r", config.options.r},
      // PEFT's lora_alpha is an int unless it has a fraction.
      {"lora_alpha", std::floor(config.options.alpha) == config.options.alpha
                         ? json(static_cast<int64_t>(config.options.alpha))
                         : json(config.options.alpha)},
      {"lora_dropout", config.options.dropout},
      {"target_modules", SortedTargets(config.targets)},
      {"exclude_modules", nullptr},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_rslora", false},
      {"use_dora", false},
      {"lora_bias", false},
      {"init_lora_weights", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", json::object()},
      {"alpha_pattern", json::object()},
  };
  return WriteJson(dir + "/" + kAdapterConfigFile, adapter_config);
}

Status SaveMerged(
    torch::nn::Module& model,
    const std::function<nlohmann::json(const std::vector<std::string>& untied)>& config_json,
    const std::string& dir) {
  RETURN_IF_ERROR(CreateDirectory(dir));
  torch::NoGradGuard no_grad;
  // "<projection>.weight" -> W + delta, and the dequantised W of NF4 bases without an adapter
  std::map<std::string, torch::Tensor> merged_weights;
  std::set<std::string> nf4_bases;
  for (auto& [name, projection] : NamedProjections(model)) {
    if (!projection->has_adapter() && !projection->is_quantized()) continue;
    torch::Tensor weight = projection->DenseWeight();
    if (projection->has_adapter()) weight = weight + projection->MergedDelta();
    merged_weights[name + ".weight"] = weight;
    if (projection->is_quantized()) nf4_bases.insert(name + ".weight");
  }
  NamedTensors tensors;
  for (const auto& item : model.named_parameters()) {
    if (IsAdapterParameter(item.key())) continue;
    auto merged = merged_weights.extract(item.key());
    tensors.emplace_back(item.key(), merged.empty() ? item.value() : merged.mapped());
  }
  // What is left has no parameter of its own: NF4 bases, and a tied head, now its own matrix.
  std::vector<std::string> untied;
  for (auto& [name, weight] : merged_weights) {
    tensors.emplace_back(name, weight);
    if (!nf4_bases.contains(name)) untied.push_back(name);
  }
  RETURN_IF_ERROR(WriteTensors(dir + "/model.safetensors", tensors, TorchFormat()));
  return WriteJson(dir + "/config.json", config_json(untied));
}

Status SaveMerged(LlamaForCausalLM& model, const std::string& dir) {
  return SaveMerged(
      *model,
      [&](const std::vector<std::string>& untied) {
        ModelConfig config = model->config();
        if (std::find(untied.begin(), untied.end(), "lm_head.weight") != untied.end()) {
          config.tie_word_embeddings = false;
        }
        return ToHfConfigJson(config);
      },
      dir);
}

}  // namespace llmctl::trainer
