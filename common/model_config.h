// Model shapes for the LLaMA family (LLaMA 1/2/3, TinyLlama, OpenLLaMA, Mistral, Qwen2, SmolLM):
// what a Hugging Face config.json says, parsed and checked, plus built-in presets so experiments
// can name a model without a directory. No LibTorch here: the controller and the agent use these
// shapes too.
#ifndef LLMCTL_COMMON_MODEL_CONFIG_H_
#define LLMCTL_COMMON_MODEL_CONFIG_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace llmctl {

// Llama 3.1's frequency-dependent RoPE scaling (config.json "rope_scaling" with rope_type
// "llama3"). Wavelengths longer than original_max_position_embeddings / low_freq_factor are divided
// by `factor`, shorter than original_max_position_embeddings / high_freq_factor are kept, and the
// band between is blended.
struct RopeScaling {
  std::string rope_type;  // "llama3", the only kind llmctl implements
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  int64_t original_max_position_embeddings = 0;

  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  std::string model_type = "llama";  // "llama", "mistral" or "qwen2"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // MLP width (gate/up projections)
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // < num_attention_heads means grouped-query attention
  int64_t head_dim = 0;  // usually hidden_size / num_attention_heads; some models set it apart
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;  // lm_head shares the embedding matrix (counted once)
  // config.json's attention_bias puts a bias on q, k, v and o; Qwen2 has one on q, k, v only
  // (hard-coded in its modelling code, absent from its config.json), hence two flags.
  bool attention_qkv_bias = false;
  bool attention_output_bias = false;
  bool mlp_bias = false;
  // Attention sees only the last N positions (Mistral v0.1); unset means full causal attention.
  std::optional<int64_t> sliding_window;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;  // the first of eos_token_ids
  std::vector<int64_t> eos_token_ids;   // Llama 3 instruct models stop on any of several
  std::string torch_dtype;          // dtype of the published weights ("bfloat16"); "" if not stated
  std::string hidden_act = "silu";  // the only activation the LLaMA MLP uses
  // Presets only: the Hugging Face repository whose weights `init: pretrained` loads; "" when there
  // are none.
  std::string hf_repo_id;

  bool operator==(const ModelConfig&) const = default;
};

// Parses the text of a Hugging Face config.json. `filename` names the file in messages, e.g.
// "models/tiny/config.json: missing required field 'hidden_size'". Required: vocab_size,
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads. Defaults follow
// transformers' LlamaConfig (num_key_value_heads = num_attention_heads, head_dim = hidden_size /
// num_attention_heads, max_position_embeddings 2048, rms_norm_eps 1e-6, rope_theta 10000, no
// biases, untied embeddings). Returns InvalidArgument for malformed JSON, wrong field types,
// non-positive sizes, inconsistent head counts, an activation other than silu, unknown model_type
// or rope_scaling type.
StatusOr<ModelConfig> ParseHfConfigJson(std::string_view json_text, std::string_view filename);

// Reads `model_dir`/config.json. NotFound when the file is missing; parse errors as above.
StatusOr<ModelConfig> LoadHfConfig(const std::string& model_dir);

// The config.json a Hugging Face model directory would hold for `config` (for checkpoints llmctl
// writes); ParseHfConfigJson(ToHfConfigJson(c).dump(), ...) gives back `c` except hf_repo_id.
nlohmann::json ToHfConfigJson(const ModelConfig& config);

// Consistency checks shared by the parser and the presets; InvalidArgument names the field.
Status ValidateModelConfig(const ModelConfig& config);

// Built-in models: "tinyllama-1.1b", "open_llama_3b", "open_llama_7b", "open_llama_13b" (published
// configs) and "llmctl-demo" (a tiny model that trains in seconds on a CPU; it has no pretrained
// weights). Names are matched case-insensitively, and each published preset also answers to its
// Hugging Face repository id (e.g. "openlm-research/open_llama_7b"). Returns null for anything
// else.
const ModelConfig* FindPreset(std::string_view name);

// Canonical preset names, in a fixed order.
std::vector<std::string> PresetNames();

// The canonical name of the preset `name` refers to (e.g. an HF repository id maps to
// "open_llama_7b"), or "" when it is not a preset.
std::string CanonicalPresetName(std::string_view name);

// Exact number of parameters: embeddings, attention and MLP projections (with their biases), the
// RMSNorm weights and the LM head, which is not counted again when tied to the embeddings.
// TinyLlama 1.1B: 1,100,048,384; LLaMA 7B: 6,738,415,616.
uint64_t ParameterCount(const ModelConfig& config);

// One tensor of a Hugging Face checkpoint of a model.
struct CheckpointTensor {
  std::string name;            // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // projections (out, in), as nn.Linear stores them
};

// The tensors a Hugging Face checkpoint of `config` holds, which are also llm-train's parameters by
// the same names and shapes (trainer/model/llama_test checks the two agree): the embedding; per
// layer q, k, v, o (with their biases), gate, up, down (with theirs) and the two norms; the final
// norm; lm_head unless tied. Lists CheckpointTensorCount(config) entries: check that count against
// a checkpoint before listing, as a config.json may claim any number of layers.
std::vector<CheckpointTensor> CheckpointTensors(const ModelConfig& config);
int64_t CheckpointTensorCount(const ModelConfig& config);

// A model on the Hugging Face hub as an experiment names it: `hf:ORG/NAME` or
// `hf:ORG/NAME@REVISION`. Only an llmctl agent downloads it (agent/hub.h); the controller takes it
// on trust, and the agent replaces it with the prepared directory before llm-train sees it.
struct HubModelRef {
  std::string repo;      // "ORG/NAME"
  std::string revision;  // a branch, tag or commit; "main" when the reference names none

  bool operator==(const HubModelRef&) const = default;
};

inline constexpr std::string_view kHubModelPrefix = "hf:";

// True when `model` starts with "hf:" (it is then a hub reference or an error, never a path).
bool IsHubModelRef(std::string_view model);

// Checks a repository id (ORG/NAME, each 1-96 of [A-Za-z0-9._-], no "--" or "..") and a
// revision (1-255 of [A-Za-z0-9._/-], no "..", no leading or trailing '/'); "" means "main".
// InvalidArgument naming the bad part.
StatusOr<HubModelRef> MakeHubModelRef(std::string_view repo, std::string_view revision);

// Parses "hf:ORG/NAME[@REVISION]"; InvalidArgument as above, quoting the whole value.
StatusOr<HubModelRef> ParseHubModelRef(std::string_view model);

// "hf:ORG/NAME@REVISION".
std::string HubModelRefText(const HubModelRef& ref);

// `model` as an experiment names it: a preset name (or alias), else a directory holding
// config.json. NotFound when it is neither, naming the presets and the closest one when the text
// looks like a typo; errors from config.json as above. A hub reference (hf:...) is
// FailedPrecondition: only an llmctl agent downloads it (llm-train runs on what is on disk).
StatusOr<ModelConfig> ResolveModel(std::string_view model);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_MODEL_CONFIG_H_
