// FindPreset, PresetNames, CanonicalPresetName and ResolveModel (model_config.h): the built-in
// models, and what a model named in an experiment is: a preset, a hub reference or a directory.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "common/model_config.h"
#include "common/spelling.h"
#include "common/text.h"

namespace llmctl {
namespace {

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
  message +=
      ": not a preset (" + Join(candidates, ", ") + ") and not a directory containing config.json";
  return NotFoundError(message);
}

}  // namespace llmctl
