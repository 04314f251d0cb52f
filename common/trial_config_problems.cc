// FindConfigProblem and ValidateTrialConfig (trial_config.h): the rules a trial's keys must keep
// together, each problem naming the keys it involves.
#include <algorithm>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/model_config.h"
#include "common/trial_config.h"
#include "common/trial_settings.h"

namespace llmctl {
namespace {

std::string Str(int64_t value) { return std::to_string(value); }

// One problem, for the rules below to return.
std::optional<ConfigProblem> Problem(std::vector<std::string> keys, std::string message) {
  return ConfigProblem{std::move(keys), std::move(message)};
}

// The labs' DeepSpeed spellings ApplyLabSpellings left as written: combinations it cannot rewrite.
std::optional<ConfigProblem> FindLabSpellingProblem(const TrialSettings& s) {
  if (s.train.optimizer == trial::Optimizer::kDeepspeedCpu) {
    return Problem({"optimizer", "strategy"},
                   "optimizer deepspeed_cpu (DeepSpeedCPUAdam) runs only with strategy: "
                   "deepspeed_stage_2_offload; in llmctl's words: optimizer: adamw and offload: "
                   "optimizer");
  }
  for (const trial::Strategy deepspeed :
       {trial::Strategy::kDeepspeedStage2Offload, trial::Strategy::kDeepspeedStage3Offload}) {
    if (s.parallel.strategy == deepspeed) {
      return Problem({"strategy", "optimizer"}, "strategy " + std::string(Name(deepspeed)) +
                                                    " offloads AdamW's state, but optimizer is " +
                                                    std::string(Name(s.train.optimizer)) +
                                                    "; use optimizer: adamw (or deepspeed_cpu)");
    }
  }
  return std::nullopt;
}

// offload's settings against the optimizer, the strategy and the gradient checks.
std::optional<ConfigProblem> FindOffloadProblem(const TrialSettings& s) {
  // offload: full is the shards' offload: there are shards only under fsdp over several ranks.
  if (s.memory.offload == trial::Offload::kFull && (s.parallel.strategy != trial::Strategy::kFsdp ||
                                                    (s.device.count < 2 && s.parallel.nodes < 2))) {
    return Problem({"offload", "strategy"},
                   "offload: full keeps fsdp's parameter shards, their gradients and AdamW's state "
                   "in host memory, so it needs strategy: fsdp over 2 or more devices; on one "
                   "device use offload: optimizer");
  }
  const bool offload = s.memory.offload == trial::Offload::kOptimizer;
  if (offload && s.train.optimizer != trial::Optimizer::kAdamw) {
    return Problem({"offload", "optimizer"},
                   "offload: optimizer keeps AdamW's fp32 state on the host, but optimizer is " +
                       std::string(Name(s.train.optimizer)) +
                       "; use optimizer: adamw or offload: none");
  }
  // Offload moves each gradient to the host as it is produced, where neither the global-norm clip
  // nor the loss scaler's unscale-and-check (both over the device .grad tensors) sees it.
  if (offload && s.train.grad_clip > 0) {
    return Problem({"offload", "train.grad_clip"},
                   "offload: optimizer moves gradients to the host as backward produces them, "
                   "where train.grad_clip does not reach; set train.grad_clip: 0 or offload: none");
  }
  if (offload && s.memory.precision == trial::Precision::k16Mixed) {
    return Problem({"offload", "precision"},
                   "offload: optimizer moves gradients to the host as backward produces them, "
                   "where 16-mixed loss scaling cannot check them for overflow; use bf16-mixed or "
                   "bf16-true");
  }
  return std::nullopt;
}

// What the data-parallel strategies do not combine with.
std::optional<ConfigProblem> FindStrategyProblem(const TrialSettings& s) {
  const bool offload = s.memory.offload == trial::Offload::kOptimizer;
  // DDP all-reduces the gradients that backward accumulates in .grad; offload moves them to the
  // host and optimizer_in_backward consumes them before the other ranks' gradients are known.
  if (s.parallel.strategy == trial::Strategy::kDdp && (offload || s.memory.optimizer_in_backward)) {
    const std::string other = offload ? "offload" : "optimizer_in_backward";
    return Problem({"strategy", other},
                   "strategy: ddp averages the gradients across ranks after backward, which " +
                       other + " does not wait for; use strategy: auto or turn " + other + " off");
  }
  // FSDP here shards every parameter as a trainable flat shard, reduces gradients in backward,
  // and clips over the ranks; what it does not build yet is refused by name.
  if (s.parallel.strategy == trial::Strategy::kFsdp) {
    if (offload) {
      return Problem(
          {"strategy", "offload"},
          "strategy: fsdp with offload: optimizer would keep a second, host copy of each "
          "shard; use offload: full (the shards themselves, their gradients and AdamW's "
          "state in host memory: ZeRO-3 offload) or offload: none");
    }
    if (s.memory.optimizer_in_backward) {
      return Problem({"strategy", "optimizer_in_backward"},
                     "strategy: fsdp reduce-scatters the gradients into shards after each unit's "
                     "backward; optimizer_in_backward is not built for shards here; use strategy: "
                     "auto or turn optimizer_in_backward off");
    }
    if (s.peft.save_merged) {
      return Problem({"strategy", "peft.save_merged"},
                     "strategy: fsdp writes the adapter from its shards, but merging it into the "
                     "base weights is not built for shards yet; set peft.save_merged: false (the "
                     "adapter in output_dir/adapter merges with PEFT's merge_and_unload)");
    }
    if (s.memory.precision == trial::Precision::k16Mixed) {
      return Problem({"strategy", "precision"},
                     "strategy: fsdp has no sharded loss scaler for 16-mixed yet; use bf16-mixed, "
                     "bf16-true or 32-true");
    }
  }
  return std::nullopt;
}

// optimizer_in_backward consumes each gradient as backward produces it: nothing may wait for them.
std::optional<ConfigProblem> FindOptimizerInBackwardProblem(const TrialSettings& s) {
  if (s.memory.optimizer_in_backward) {
    const int64_t micro = s.train.micro_batch_size;
    const int64_t global = s.train.global_batch_size;
    const int64_t devices = s.device.count;
    // FindConfigProblem has checked micro x devices x nodes for overflow before this runs.
    if (global != micro * devices) {
      return Problem(
          {"optimizer_in_backward", "train.global_batch_size"},
          "optimizer_in_backward updates each parameter while backward runs, so gradients "
          "cannot accumulate: train.global_batch_size (" +
              Str(global) + ") must equal train.micro_batch_size x devices (" +
              Str(micro * devices) + ")");
    }
    if (s.train.grad_clip > 0) {
      return Problem({"optimizer_in_backward", "train.grad_clip"},
                     "optimizer_in_backward updates each parameter before the other gradients "
                     "exist, so the global norm train.grad_clip needs is never known; set "
                     "train.grad_clip: 0");
    }
    if (s.memory.precision == trial::Precision::k16Mixed) {
      return Problem({"optimizer_in_backward", "precision"},
                     "optimizer_in_backward cannot skip a step whose gradients overflowed, which "
                     "16-mixed loss scaling needs; use bf16-mixed or bf16-true");
    }
    if (s.memory.offload == trial::Offload::kOptimizer) {
      return Problem({"optimizer_in_backward", "offload"},
                     "optimizer_in_backward and offload: optimizer cannot be combined; choose one");
    }
  }
  return std::nullopt;
}

// The peft keys against peft.method, and the adapters' own values.
std::optional<ConfigProblem> FindAdapterProblem(const TrialConfig& config) {
  const TrialSettings& s = config.settings();
  const trial::PeftMethod method = s.peft.method;
  if (method == trial::PeftMethod::kNone) {
    for (std::string_view key : TrialKeysInGroup("peft")) {
      if (key != "peft.method" && config.IsSet(key)) {
        return Problem({std::string(key), "peft.method"},
                       std::string(key) +
                           " applies to adapters, but peft.method is none; set peft.method: lora "
                           "or qlora, or remove " +
                           std::string(key));
      }
    }
    return std::nullopt;
  }
  if (s.peft.r < 1) {
    return Problem({"peft.r"}, "peft.r must be at least 1, got " + Str(s.peft.r));
  }
  if (!(s.peft.alpha > 0)) {
    return Problem({"peft.alpha"},
                   "peft.alpha must be positive, got " + FormatKeyValue(s.peft.alpha));
  }
  const double dropout = s.peft.dropout;
  if (dropout < 0 || dropout >= 1) {
    return Problem({"peft.dropout"},
                   "peft.dropout must be in [0, 1), got " + FormatKeyValue(dropout));
  }
  const std::vector<std::string>& targets = s.peft.targets;
  if (targets.empty()) {
    return Problem({"peft.targets"},
                   "peft.targets is empty: name the projections that get adapters, e.g. [q_proj, "
                   "v_proj]");
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (std::find(kLoraTargets.begin(), kLoraTargets.end(), targets[i]) == kLoraTargets.end()) {
      std::string known;
      for (std::string_view name : kLoraTargets)
        known += (known.empty() ? "" : ", ") + std::string(name);
      return Problem({"peft.targets"}, "peft.targets: unknown projection '" + targets[i] +
                                           "' (known: " + known + ")");
    }
    if (std::find(targets.begin(), targets.begin() + static_cast<std::ptrdiff_t>(i), targets[i]) !=
        targets.begin() + static_cast<std::ptrdiff_t>(i)) {
      return Problem({"peft.targets"}, "peft.targets: '" + targets[i] + "' is listed twice");
    }
  }
  if (method == trial::PeftMethod::kQlora && s.memory.precision == trial::Precision::k16Mixed &&
      s.peft.compute_dtype == trial::ComputeDtype::kBf16) {
    return Problem({"peft.compute_dtype", "precision"},
                   "peft.compute_dtype bf16 with precision 16-mixed: fp16 autocast runs every "
                   "matmul in fp16, so each NF4 weight would be rounded to bf16 and then again to "
                   "fp16 (and 16-mixed is for devices without bf16); set peft.compute_dtype: fp32 "
                   "or use precision bf16-mixed");
  }
  if (method == trial::PeftMethod::kLora) {
    for (std::string_view key : {"peft.double_quant", "peft.compute_dtype"}) {
      if (config.IsSet(key)) {
        return Problem({std::string(key), "peft.method"},
                       std::string(key) +
                           " applies to NF4 base weights, but peft.method is lora; use "
                           "peft.method: qlora or remove " +
                           std::string(key));
      }
    }
  }
  return std::nullopt;
}

// The memory-saving techniques' settings that cannot run together.
std::optional<ConfigProblem> FindTechniqueProblem(const TrialConfig& config) {
  const TrialSettings& s = config.settings();
  for (auto* find : {FindLabSpellingProblem, FindOffloadProblem, FindStrategyProblem,
                     FindOptimizerInBackwardProblem}) {
    if (std::optional<ConfigProblem> found = find(s)) return found;
  }
  return FindAdapterProblem(config);
}

// The profile group: its other keys only mean something with profile.steps, and the profiled
// steps must be steps the run takes.
std::optional<ConfigProblem> FindProfileProblem(const TrialConfig& config) {
  const TrialSettings& s = config.settings();
  const int64_t steps = s.profile.steps;
  if (steps == 0) {
    for (std::string_view key : {"profile.first_step", "profile.memory_history"}) {
      if (config.IsSet(key)) {
        return Problem({std::string(key)}, std::string(key) +
                                               " applies to profiled steps, but profile.steps is "
                                               "0; set profile.steps (e.g. 2) or remove " +
                                               std::string(key));
      }
    }
    return std::nullopt;
  }
  const int64_t first = s.profile.first_step;
  const int64_t max_steps = s.train.max_steps;
  // Both are at least 0 here (FindConfigProblem checks them first); their sum may not fit.
  const std::optional<int64_t> end = CheckedAdd(first, steps);
  if (!end) {
    return Problem({"profile.first_step", "profile.steps"},
                   "profile.first_step + profile.steps overflows: profile fewer or earlier steps");
  }
  if (max_steps > 0 && *end > max_steps) {
    return Problem({"profile.first_step", "profile.steps", "train.max_steps"},
                   "profile: steps " + Str(first) + " to " + Str(*end - 1) +
                       " are profiled, but train.max_steps " + Str(max_steps) +
                       " ends the run after step " + Str(max_steps - 1));
  }
  return std::nullopt;
}

// data.format imagefolder (BLIP-2's captions) and the keys that only it takes.
std::optional<ConfigProblem> FindImageFolderProblem(const TrialConfig& config) {
  const TrialSettings& s = config.settings();
  const bool images = s.data.format == trial::DataFormat::kImagefolder;
  const std::vector<std::string>& frozen = s.peft.freeze;
  if (!images) {
    if (!frozen.empty()) {
      return Problem({"freeze", "data.format"},
                     "freeze names BLIP-2's parts, which train on data.format imagefolder, but "
                     "data.format is " +
                         std::string(Name(s.data.format)) + "; remove freeze");
    }
    if (config.IsSet("data.caption_column")) {
      return Problem({"data.caption_column", "data.format"},
                     "data.caption_column applies to data.format imagefolder, but data.format is " +
                         std::string(Name(s.data.format)) + "; remove data.caption_column");
    }
    return std::nullopt;
  }
  for (std::string_view key : {"data.template", "data.mask_prompt"}) {
    if (config.IsSet(key)) {
      return Problem({std::string(key), "data.format"},
                     std::string(key) +
                         " shapes instruction records, and data.format imagefolder holds "
                         "captions: remove " +
                         std::string(key));
    }
  }
  if (s.data.caption_column.empty()) {
    return Problem({"data.caption_column"},
                   "data.caption_column is empty: name the metadata column of the captions");
  }
  for (size_t i = 0; i < frozen.size(); ++i) {
    if (std::find(kBlip2Parts.begin(), kBlip2Parts.end(), frozen[i]) == kBlip2Parts.end()) {
      std::string known;
      for (std::string_view part : kBlip2Parts)
        known += (known.empty() ? "" : ", ") + std::string(part);
      return Problem({"freeze"},
                     "freeze: unknown part '" + frozen[i] + "' (BLIP-2's parts: " + known + ")");
    }
  }
  if (frozen.size() == kBlip2Parts.size() && s.peft.method == trial::PeftMethod::kNone) {
    return Problem(
        {"freeze", "peft.method"},
        "freeze lists every part of BLIP-2 and peft.method is none: nothing would train");
  }
  return std::nullopt;
}

// The keys every trial needs a value of.
std::optional<ConfigProblem> FindRequiredProblem(const TrialSettings& s) {
  if (s.model.name.empty())
    return Problem({"model"}, "model is required: a preset name or a model directory");
  if (s.data.path.empty()) {
    return Problem({"data.path"},
                   "data.path is required: the training data, a JSON-lines file (e.g. data: {path: "
                   "train.jsonl})");
  }
  return std::nullopt;
}

std::optional<ConfigProblem> FindCountProblem(const TrialSettings& s) {
  // Counts that must be at least 1, and those that may also be 0 (meaning "off" or "all").
  struct Minimum {
    std::string_view key;
    int64_t value;
    int64_t minimum;
  };
  const Minimum at_least_one[] = {
      {"data.max_seq_length", s.data.max_seq_length, 2},
      {"train.micro_batch_size", s.train.micro_batch_size, 1},
      {"train.global_batch_size", s.train.global_batch_size, 1},
      {"train.epochs", s.train.epochs, 1},
      {"devices", s.device.count, 1},
      {"nodes", s.parallel.nodes, 1},
      {"log_every", s.output.log_every, 1},
  };
  for (const auto& [key, value, minimum] : at_least_one) {
    if (value < minimum) {
      std::string why =
          key == "data.max_seq_length" ? " (an input token and its next-token target)" : "";
      return Problem({std::string(key)}, std::string(key) + " must be at least " + Str(minimum) +
                                             why + ", got " + Str(value));
    }
  }
  const std::pair<std::string_view, int64_t> not_negative[] = {
      {"data.samples", s.data.samples},
      {"train.warmup_steps", s.train.warmup_steps},
      {"train.max_steps", s.train.max_steps},
      {"seed", s.train.seed},
      {"snapshot_every", s.output.snapshot_every},
      {"checkpoint_every", s.output.checkpoint_every},
      {"profile.steps", s.profile.steps},
      {"profile.first_step", s.profile.first_step},
  };
  for (const auto& [key, value] : not_negative) {
    if (value < 0) {
      return Problem({std::string(key)},
                     std::string(key) + " must not be negative, got " + Str(value));
    }
  }
  return std::nullopt;
}

// The ranks (nodes x devices) and the batch they divide.
std::optional<ConfigProblem> FindBatchProblem(const TrialSettings& s) {
  // Nodes x devices ranks (Lightning's num_nodes x devices) need more than one process each:
  // only the data-parallel strategies start them.
  const int64_t nodes = s.parallel.nodes;
  if (const trial::Strategy strategy = s.parallel.strategy;
      nodes > 1 && strategy != trial::Strategy::kDdp && strategy != trial::Strategy::kFsdp) {
    return Problem(
        {"nodes", "strategy"},
        "nodes: " + Str(nodes) + " runs " + Str(nodes) +
            " x devices ranks, which only strategy ddp or fsdp starts, but strategy is " +
            std::string(Name(strategy)) + "; use strategy: ddp or fsdp, or nodes: 1");
  }

  const int64_t micro = s.train.micro_batch_size;
  const int64_t global = s.train.global_batch_size;
  const int64_t devices = s.device.count;
  // Every rank on every node takes micro-batches. Each is at least 1 here; the product may not fit
  // (it would wrap, possibly to 0, and the modulo below would then divide by it).
  const std::optional<int64_t> checked_per_pass = CheckedProduct({micro, devices, nodes});
  if (!checked_per_pass) {
    return Problem({"train.micro_batch_size", "devices", "nodes"},
                   "train.micro_batch_size x devices x nodes overflows: " + Str(micro) + " x " +
                       Str(devices) + " x " + Str(nodes) + " examples per pass is not a size");
  }
  const int64_t per_pass = *checked_per_pass;
  if (global % per_pass != 0) {
    std::vector<std::string> keys = {"train.global_batch_size", "train.micro_batch_size"};
    if (devices > 1) keys.push_back("devices");
    if (nodes > 1) keys.push_back("nodes");
    std::string per_step = "train.micro_batch_size (" + Str(micro) + ")";
    if (devices > 1) per_step += " x devices (" + Str(devices) + ")";
    if (nodes > 1) per_step += " x nodes (" + Str(nodes) + ")";
    if (devices > 1 || nodes > 1) per_step += " = " + Str(per_pass);
    return Problem(keys, "train.global_batch_size (" + Str(global) + ") must be a multiple of " +
                             per_step + ": each optimizer step accumulates whole micro-batches");
  }
  return std::nullopt;
}

// The optimizer's hyperparameters.
std::optional<ConfigProblem> FindOptimizerSettingProblem(const TrialSettings& s) {
  const double lr = s.train.lr;
  if (lr < 0)
    return Problem({"train.lr"}, "train.lr must not be negative, got " + FormatKeyValue(lr));
  const std::vector<double>& betas = s.train.betas;
  if (betas.size() != 2) {
    return Problem({"train.betas"}, "train.betas must be exactly two numbers [beta1, beta2], got " +
                                        FormatKeyValue(betas));
  }
  for (double beta : betas) {
    if (beta < 0 || beta >= 1) {
      return Problem({"train.betas"},
                     "train.betas must each be in [0, 1), got " + FormatKeyValue(betas));
    }
  }
  if (!(s.train.eps > 0)) {
    return Problem({"train.eps"}, "train.eps must be positive, got " + FormatKeyValue(s.train.eps));
  }
  const std::pair<std::string_view, double> not_negative_numbers[] = {
      {"train.weight_decay", s.train.weight_decay}, {"train.grad_clip", s.train.grad_clip}};
  for (const auto& [key, value] : not_negative_numbers) {
    if (value < 0) {
      return Problem({std::string(key)},
                     std::string(key) + " must not be negative, got " + FormatKeyValue(value));
    }
  }
  const double momentum = s.train.momentum;
  if (momentum < 0 || momentum >= 1) {
    return Problem({"train.momentum"},
                   "train.momentum must be in [0, 1), got " + FormatKeyValue(momentum));
  }
  if (momentum != 0 && s.train.optimizer != trial::Optimizer::kSgd) {
    return Problem({"train.momentum", "optimizer"},
                   "train.momentum applies only to optimizer sgd, but optimizer is " +
                       std::string(Name(s.train.optimizer)) +
                       "; remove train.momentum or set optimizer: sgd");
  }
  return std::nullopt;
}

// data.format text: the keys that shape instruction records.
std::optional<ConfigProblem> FindTextDataProblem(const TrialConfig& config) {
  const TrialSettings& s = config.settings();
  if (s.data.format == trial::DataFormat::kText) {
    if (config.IsSet("data.template") && s.data.prompt_template != trial::PromptTemplate::kNone) {
      return Problem({"data.template", "data.format"},
                     "data.template " + std::string(Name(s.data.prompt_template)) +
                         " needs instruction records, but data.format is text; use data.template: "
                         "none or data.format: alpaca");
    }
    if (config.IsSet("data.mask_prompt") && s.data.mask_prompt) {
      return Problem(
          {"data.mask_prompt", "data.format"},
          "data.mask_prompt: true needs a prompt to mask, but data.format text has none; "
          "remove data.mask_prompt or use data.format: alpaca");
    }
  }
  return std::nullopt;
}

// What the model allows: published weights for init: pretrained, and (where `model` is known) the
// sequence length.
std::optional<ConfigProblem> FindModelProblem(const TrialSettings& s, const ModelConfig* model) {
  if (s.model.init == trial::Init::kPretrained) {
    const ModelConfig* preset = FindPreset(s.model.name);
    if (preset != nullptr && preset->hf_repo_id.empty()) {
      return Problem({"init", "model"}, "init: pretrained needs published weights, and model " +
                                            s.model.name + " has none; use init: random");
    }
  }

  if (model != nullptr) {
    const int64_t length = s.data.max_seq_length;
    if (length > model->max_position_embeddings) {
      return Problem({"data.max_seq_length", "model"},
                     "data.max_seq_length (" + Str(length) + ") exceeds the model's " +
                         "max_position_embeddings (" + Str(model->max_position_embeddings) + ")");
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ConfigProblem> FindConfigProblem(const TrialConfig& config,
                                               const ModelConfig* model) {
  const TrialSettings& s = config.settings();
  for (auto* find : {FindRequiredProblem, FindCountProblem}) {
    if (std::optional<ConfigProblem> found = find(s)) return found;
  }
  if (std::optional<ConfigProblem> found = FindProfileProblem(config)) return found;
  for (auto* find : {FindBatchProblem, FindOptimizerSettingProblem}) {
    if (std::optional<ConfigProblem> found = find(s)) return found;
  }
  if (std::optional<ConfigProblem> found = FindTechniqueProblem(config)) return found;
  if (s.device.memory && s.device.memory->bytes == 0) {
    return Problem({"device_memory"},
                   "device_memory must be more than 0 bytes (leave it unset for no "
                   "budget)");
  }
  if (std::optional<ConfigProblem> found = FindImageFolderProblem(config)) return found;
  if (std::optional<ConfigProblem> found = FindTextDataProblem(config)) return found;
  return FindModelProblem(s, model);
}

Status ValidateTrialConfig(const TrialConfig& config, const ModelConfig* model) {
  std::optional<ConfigProblem> problem = FindConfigProblem(config, model);
  if (!problem) return Status::Ok();
  return InvalidArgumentError(problem->message);
}

std::optional<ConfigProblem> FindModelFamilyProblem(const TrialConfig& config, bool blip2) {
  const std::string& model = config.settings().model.name;
  const bool images = config.settings().data.format == trial::DataFormat::kImagefolder;
  if (blip2 && !images) {
    return Problem({"data.format", "model"},
                   "model " + model +
                       " is BLIP-2, which trains on images and captions: set data.format: "
                       "imagefolder");
  }
  if (!blip2 && images) {
    return Problem({"data.format", "model"},
                   "data.format imagefolder is for BLIP-2 models, and model " + model +
                       " is a LLaMA-family text model");
  }
  return std::nullopt;
}

}  // namespace llmctl
