// A trial's settings as plain typed fields, grouped the way the trial file is, parsed once from its
// TrialConfig: `config.settings().train.micro_batch_size`, where code once looked the key up by
// its name at every use. torchtitan's JobConfig, for llmctl.
//
// The key registry (common/trial_keys.h) stays the one source for YAML, JSON, `--set`, validation
// and docs; this file binds each of its keys to exactly one field (TrialSettingBindings), and
// trial_settings_test.cc proves the binding both ways: a key without a field, a field without a
// key, or an enum whose values differ from the key's `allowed` list fails it.
#ifndef LLMCTL_COMMON_TRIAL_SETTINGS_H_
#define LLMCTL_COMMON_TRIAL_SETTINGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/trial_keys.h"

namespace llmctl {

class TrialConfig;

// The values of the registry's kEnum keys, in the order of each key's `allowed` list (the test
// checks it). Name(value) gives the registry's spelling, for messages and JSON.
namespace trial {
enum class Init { kPretrained, kRandom };                           // init
enum class DataFormat { kAlpaca, kText, kImagefolder };             // data.format
enum class PromptTemplate { kAlpaca, kNone };                       // data.template
enum class Precision { k32True, kBf16True, kBf16Mixed, k16Mixed };  // precision
// optimizer; kAdam8bit and kDeepspeedCpu are the labs' spellings, which ApplyLabSpellings
// rewrites before a trial is validated.
enum class Optimizer { kAdamw, kSgd, kAdamw8bit, kAdam8bit, kDeepspeedCpu };
enum class Offload { kNone, kOptimizer, kFull };  // offload
// strategy; the deepspeed_* values are the labs' spellings (ApplyLabSpellings rewrites them).
enum class Strategy { kAuto, kDdp, kFsdp, kDeepspeedStage2Offload, kDeepspeedStage3Offload };
enum class Loss { kAuto, kCe, kChunkedCe };      // loss
enum class Kernels { kFused, kAten };            // kernels
enum class PeftMethod { kNone, kLora, kQlora };  // peft.method
enum class ComputeDtype { kBf16, kFp32 };        // peft.compute_dtype
enum class Device { kCpu, kCuda };               // device
}  // namespace trial

// The registry's spelling of each enum value ("bf16-true" for trial::Precision::kBf16True).
std::string_view Name(trial::Init value);
std::string_view Name(trial::DataFormat value);
std::string_view Name(trial::PromptTemplate value);
std::string_view Name(trial::Precision value);
std::string_view Name(trial::Optimizer value);
std::string_view Name(trial::Offload value);
std::string_view Name(trial::Strategy value);
std::string_view Name(trial::Loss value);
std::string_view Name(trial::Kernels value);
std::string_view Name(trial::PeftMethod value);
std::string_view Name(trial::ComputeDtype value);
std::string_view Name(trial::Device value);

// A kByteSize key's value: the bytes, and the text it was written with ("24GiB"), which messages
// quote back to the user.
struct ByteSizeSetting {
  uint64_t bytes = 0;
  std::string text;
};

// model, init, tokenizer.
struct ModelSettings {
  std::string name;  // model: a preset, a Hugging Face directory, node:/path or hf:ORG/NAME
  trial::Init init = trial::Init::kRandom;
  std::string tokenizer;  // "" when unset
};

// data.*
struct DataSettings {
  std::string path;  // "" when unset
  trial::DataFormat format = trial::DataFormat::kAlpaca;
  std::string caption_column;
  trial::PromptTemplate prompt_template = trial::PromptTemplate::kAlpaca;  // data.template
  bool mask_prompt = false;
  int64_t samples = 0;
  int64_t max_seq_length = 0;
};

// train.*, optimizer and seed.
struct TrainSettings {
  int64_t micro_batch_size = 0;
  int64_t global_batch_size = 0;  // micro_batch_size while unset
  double lr = 0;
  int64_t warmup_steps = 0;
  int64_t max_steps = 0;
  int64_t epochs = 0;
  std::vector<double> betas;
  double eps = 0;
  double weight_decay = 0;
  double grad_clip = 0;
  double momentum = 0;
  trial::Optimizer optimizer = trial::Optimizer::kAdamw;
  int64_t seed = 0;
};

// Precision and the memory-saving techniques: precision, offload, optimizer_in_backward, loss,
// kernels, activation_checkpointing.
struct MemorySettings {
  trial::Precision precision = trial::Precision::k32True;
  trial::Offload offload = trial::Offload::kNone;
  bool optimizer_in_backward = false;
  trial::Loss loss = trial::Loss::kAuto;
  trial::Kernels kernels = trial::Kernels::kFused;
  bool activation_checkpointing = false;
};

// peft.* and freeze (which weights train).
struct PeftSettings {
  trial::PeftMethod method = trial::PeftMethod::kNone;
  int64_t r = 0;
  double alpha = 0;
  double dropout = 0;
  std::vector<std::string> targets;
  bool double_quant = false;
  trial::ComputeDtype compute_dtype = trial::ComputeDtype::kBf16;
  bool save_merged = false;
  std::string adapter;              // "" when unset
  std::vector<std::string> freeze;  // freeze: BLIP-2 parts kept frozen
};

// strategy, nodes, ddp.*, fsdp.*.
struct ParallelSettings {
  trial::Strategy strategy = trial::Strategy::kAuto;
  int64_t nodes = 0;
  ByteSizeSetting ddp_bucket_size;          // ddp.bucket_size
  bool fsdp_reshard_after_forward = false;  // fsdp.reshard_after_forward
};

// device, devices, device_memory.
struct DeviceSettings {
  trial::Device kind = trial::Device::kCpu;  // device
  int64_t count = 0;                         // devices, per node
  std::optional<ByteSizeSetting> memory;     // device_memory; nullopt: no budget
};

// profile.*
struct ProfileSettings {
  int64_t steps = 0;
  int64_t first_step = 0;
  bool memory_history = false;
};

// What a run writes, and how often: snapshot_every, log_every, output_dir, checkpoint_every.
struct OutputSettings {
  int64_t snapshot_every = 0;
  int64_t log_every = 0;
  std::string dir;  // output_dir; "" when unset
  int64_t checkpoint_every = 0;
};

// Every key of the registry, one field each. The member initializers above are placeholders:
// the values come from the TrialConfig (its registry defaults included), never from here.
struct TrialSettings {
  ModelSettings model;
  DataSettings data;
  TrainSettings train;
  MemorySettings memory;
  PeftSettings peft;
  ParallelSettings parallel;
  DeviceSettings device;
  ProfileSettings profile;
  OutputSettings output;
};

// The fields of `config`, each key read once. TrialConfig checked every value when it was set, so
// this cannot fail. Callers read TrialConfig::settings(), which holds the result; this is how it
// is formed.
TrialSettings ParseTrialSettings(const TrialConfig& config);

// One key's binding to its field, the table ParseTrialSettings fills the fields by.
struct TrialSettingBinding {
  std::string_view key;
  // The field's address in `settings`, for the check that no two keys share a field.
  const void* (*field)(const TrialSettings& settings);
  // The field's value as the registry writes it (FormatKeyValue's text; "" for no value), for
  // the check that every key's value survives the parse.
  std::string (*format)(const TrialSettings& settings);
};

// Every binding, in the registry's order.
const std::vector<TrialSettingBinding>& TrialSettingBindings();

}  // namespace llmctl

#endif  // LLMCTL_COMMON_TRIAL_SETTINGS_H_
