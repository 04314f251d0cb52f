// One trial's settings: a value for every key in the registry (common/trial_keys.h), typed, with
// defaults, a JSON mapping and the checks that catch impossible combinations before any GPU time is
// spent.
#ifndef LLMCTL_COMMON_TRIAL_CONFIG_H_
#define LLMCTL_COMMON_TRIAL_CONFIG_H_

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_keys.h"
#include "common/trial_settings.h"

namespace llmctl {

// The value of one key. Which alternative a key uses follows its KeyType: kBool -> bool, kInt ->
// int64_t, kFloat -> double, kString/kEnum/kPath/kByteSize -> std::string (a byte size keeps the
// text it was written with, "24GiB"), kFloatList -> std::vector<double>, kStringList ->
// std::vector<std::string>.
using KeyValue =
    std::variant<bool, int64_t, double, std::string, std::vector<double>, std::vector<std::string>>;

// Parses `text` (a YAML scalar or a `--set` value) as a value of `spec`'s type. Booleans:
// true/false, yes/no, on/off (any case). Lists: "[0.9, 0.95]" or "0.9, 0.95". Enums must be one of
// spec.allowed, byte sizes what ParseByteSize accepts, numbers finite. InvalidArgument messages
// name the key and the text: "train.micro_batch_size: expected an integer, got 'abc'". Does not
// accept "" (see TrialConfig::SetFromText).
StatusOr<KeyValue> ParseKeyValue(const KeySpec& spec, std::string_view text);

// The same for a list-typed key whose items arrive separately (a YAML sequence).
StatusOr<KeyValue> ParseKeyValueList(const KeySpec& spec, const std::vector<std::string>& items);

// The value as YAML flow text: true, 16, 2e-04, bf16-true, [0.9, 0.95] (numbers in the shortest
// form that reads back exactly).
std::string FormatKeyValue(const KeyValue& value);

class TrialConfig {
 public:
  // Every key at its registry default; keys without one hold no value.
  TrialConfig();

  // Sets `key` to `value` after checking the type (an integer is accepted for a number), enum
  // membership and byte-size syntax; an empty string for a key with no default clears it back to
  // "no value". InvalidArgument for an unknown key (with the nearest key, if any) or a wrong value.
  Status Set(std::string_view key, KeyValue value);

  // `--set key=value`: parses `text` with ParseKeyValue. Empty text clears a key that has no
  // default
  // (`--set device_memory=` removes the budget) and is an error for the others.
  Status SetFromText(std::string_view key, std::string_view text);

  // True when the key was given explicitly (even if to its default value); false for defaults.
  bool IsSet(std::string_view key) const;

  // The value the trainer sees: the set value, else the default, else the default_from key's value;
  // nullopt for a key with no value, or an unknown key.
  std::optional<KeyValue> Get(std::string_view key) const;

  // Typed reads. Asking for an unknown key or with the wrong getter for its type is a programming
  // error and aborts with a message (key names are constants in the code, so tests catch it).
  // GetString serves kString, kEnum, kPath and kByteSize (the text) keys, "" when there is no
  // value.
  std::string GetString(std::string_view key) const;
  int64_t GetInt(std::string_view key) const;  // 0 when there is no value
  double GetFloat(std::string_view key) const;
  bool GetBool(std::string_view key) const;
  std::vector<double> GetFloatList(std::string_view key) const;
  std::vector<std::string> GetStringList(std::string_view key) const;
  std::optional<uint64_t> GetByteSize(std::string_view key) const;  // nullopt when unset

  // Every key's effective value as a typed field (common/trial_settings.h), kept in step with
  // each Set: `config.settings().train.micro_batch_size`. How code outside the parsing edge and
  // the registry reads a trial's settings.
  const TrialSettings& settings() const { return settings_; }

  // The keys that were set and their values, nested like the YAML ({"train": {"lr": 0.001}, ...});
  // null for a key set to "no value". What the controller stores and sends to agents: a key is in
  // the JSON exactly when it is set, so FromJson(ToJson()) keeps which keys were set (checks such
  // as "peft.r without peft.method" look at that), and the defaults have one home, the registry.
  nlohmann::json ToJson() const;

  // Every key's effective value, nested the same way, null for keys with no value: a self-contained
  // record of what a run used (the trainer's `start` event, checkpoints, reports). Not for
  // FromJson, which would count every key as set.
  nlohmann::json EffectiveJson() const;

  // The inverse of ToJson; accepts nested or dotted keys and any subset of them (the rest keep
  // defaults). Every key present counts as set. InvalidArgument for unknown keys or wrong types.
  static StatusOr<TrialConfig> FromJson(const nlohmann::json& json);

  // Equal when every key has the same effective value (whether it was set or defaulted does not
  // matter).
  friend bool operator==(const TrialConfig& a, const TrialConfig& b);

 private:
  struct Entry {
    std::optional<KeyValue> value;
    bool explicitly_set = false;
  };
  const Entry* FindEntry(std::string_view key) const;
  const Entry& EntryForGetter(std::string_view key, std::initializer_list<KeyType> types) const;
  Status SetEntry(std::string_view key, KeyValue value);
  Status SetEntryFromText(std::string_view key, std::string_view text);

  std::vector<Entry> entries_;  // parallel to TrialKeys()
  TrialSettings settings_;      // ParseTrialSettings(*this), formed again by every Set
};

// The projections `peft.targets` may name: Hugging Face's module names in LLaMA-family models
// (q/k/v/o_proj, gate/up/down_proj, lm_head), in OPT (q/k/v_proj, out_proj, fc1, fc2) and in T5
// (q, k, v, o, wi_0, wi_1, wi, wo), BLIP-2's language models. The trainer checks that each names a
// projection of the model it builds.
inline constexpr std::array<std::string_view, 19> kLoraTargets = {
    "q_proj",    "k_proj", "v_proj", "o_proj", "out_proj", "gate_proj", "up_proj",
    "down_proj", "fc1",    "fc2",    "q",      "k",        "v",         "o",
    "wi_0",      "wi_1",   "wi",     "wo",     "lm_head"};

// The parts of BLIP-2 the `freeze` key may name: Blip2ForConditionalGeneration's children.
inline constexpr std::array<std::string_view, 4> kBlip2Parts = {
    "vision_model", "qformer", "language_projection", "language_model"};

// Rewrites the labs' spellings to llmctl's: optimizer adam_8bit -> adamw_8bit; strategy
// deepspeed_stage_2_offload with optimizer deepspeed_cpu (DeepSpeedCPUAdam) or adamw -> optimizer
// adamw + offload: optimizer (strategy back to auto). Other combinations are left for
// FindConfigProblem to explain. Call once every value is set, before validating.
void ApplyLabSpellings(TrialConfig& config);

// One reason a trial cannot run. `keys` are the keys involved, the one most likely to need changing
// first, so a caller that knows where each key was written can point there.
struct ConfigProblem {
  std::vector<std::string> keys;
  std::string
      message;  // names the keys and values: "train.global_batch_size (10) must be a multiple ..."
};

// The first problem found, or nullopt. `model` (may be null when the model cannot be loaded here)
// enables the model-dependent checks, e.g. data.max_seq_length <= max_position_embeddings. Checks:
// data.path given; sizes and counts positive; global batch a multiple of micro batch x devices; lr
// >= 0; exactly two betas in [0, 1); eps > 0; momentum in [0, 1) and only with sgd; `init:
// pretrained` only for models with weights; text data with no prompt template or prompt masking
// asked for; memory-saving techniques that cannot run together (offload with a non-AdamW optimizer,
// optimizer_in_backward with accumulation, clipping or loss scaling) and adapter settings that do
// not fit peft.method.
std::optional<ConfigProblem> FindConfigProblem(const TrialConfig& config, const ModelConfig* model);

// What the model's family allows: BLIP-2 (`blip2`) trains on data.format imagefolder and the LLaMA
// family on text. For the callers that know the family
// (the experiment parser where the model is on this machine, llm-train).
std::optional<ConfigProblem> FindModelFamilyProblem(const TrialConfig& config, bool blip2);

// Tokens per chunk of the chunked loss (trainer/model/loss.h), which forms each chunk's
// gradients in forward. Measured on the 110M bench model (1,024 tokens, C = 768, V = 32,000,
// fused kernels, 2 threads, Zen 4; tokens/s over 4 steps, allocator peak):
//                      fp32             bf16-true
//   full logits (ce)   236-238 2,319 MB  409 1,356 MB
//   128 tokens         227-230 2,060 MB  419-424 1,047 MB
//   256 tokens         239-249 2,092 MB  421 1,079 MB
//   512 tokens         244 2,158 MB
// Below 256, fp32 loses 4%: each chunk adds its weight gradient (V, C) into the sum with an inner
// dimension of only the chunk's tokens. A chunk holds 2 x 4 B x tokens x V at most (the float32
// logits and log-sum-exp's temporary), fixed while the full logits grow with B·T.
inline constexpr int64_t kLossChunkTokens = 256;

// Whether the loss is chunked (trainer/model/loss.h): `loss: chunked_ce`, or `loss: auto` under
// `kernels: fused`, where it lowers the peak on every model measured (docs/benchmarks.md).
bool UsesChunkedLoss(const TrialConfig& config);

// Whether llm-train's LLaMA MLP runs as FusedSwiGluLinear (trainer/model/llama.cc), which
// recomputes the SwiGLU product for down_proj's weight gradient instead of keeping it: kernels
// fused, a full fine-tune (down_proj plain and trained) without an MLP bias, and no cast for
// autocast to make: not under bf16-mixed or 16-mixed, but under fsdp, whose gathered weights are in
// the compute dtype already. The estimator's reading of the trainer's choice from the tensors.
bool UsesSwiGluLinear(const TrialConfig& config, const ModelConfig& model);

// The ranks each of the trial's nodes starts: its devices under strategy ddp or fsdp, else 1.
// The agent starts that many; the controller accepts event lines only from a node's own ranks.
int64_t RanksPerNode(const TrialConfig& config);

// The trial's data-parallel ranks: devices x nodes under strategy ddp or fsdp, else 1.
int64_t DataParallelRanks(const TrialConfig& config);

// FindConfigProblem as a Status: InvalidArgument with the problem's message, or OK.
Status ValidateTrialConfig(const TrialConfig& config, const ModelConfig* model);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_TRIAL_CONFIG_H_
