// FindConfigProblem and ValidateTrialConfig (trial_config.h): the rules a trial's keys must keep
// together, each problem naming the keys it involves.
#include <algorithm>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/model_config.h"
#include "common/trial_config.h"

namespace llmctl {
namespace {

std::string Str(int64_t value) { return std::to_string(value); }

// One problem, for the rules below to return.
std::optional<ConfigProblem> Problem(std::vector<std::string> keys, std::string message) {
  return ConfigProblem{std::move(keys), std::move(message)};
}

// The memory-saving techniques' settings that cannot run together.
std::optional<ConfigProblem> FindTechniqueProblem(const TrialConfig& config) {
  const std::string optimizer = config.GetString("optimizer");
  if (optimizer == "deepspeed_cpu") {
    return Problem({"optimizer", "strategy"},
                   "optimizer deepspeed_cpu (DeepSpeedCPUAdam) runs only with strategy: "
                   "deepspeed_stage_2_offload; in llmctl's words: optimizer: adamw and offload: "
                   "optimizer");
  }
  for (const char* deepspeed : {"deepspeed_stage_2_offload", "deepspeed_stage_3_offload"}) {
    if (config.GetString("strategy") == deepspeed) {
      return Problem({"strategy", "optimizer"}, std::string("strategy ") + deepspeed +
                                                    " offloads AdamW's state, but optimizer is " +
                                                    optimizer +
                                                    "; use optimizer: adamw (or deepspeed_cpu)");
    }
  }
  // offload: full is the shards' offload: there are shards only under fsdp over several ranks.
  if (config.GetString("offload") == "full" &&
      (config.GetString("strategy") != "fsdp" ||
       (config.GetInt("devices") < 2 && config.GetInt("nodes") < 2))) {
    return Problem({"offload", "strategy"},
                   "offload: full keeps fsdp's parameter shards, their gradients and AdamW's state "
                   "in host memory, so it needs strategy: fsdp over 2 or more devices; on one "
                   "device use offload: optimizer");
  }
  const bool offload = config.GetString("offload") == "optimizer";
  if (offload && optimizer != "adamw") {
    return Problem({"offload", "optimizer"},
                   "offload: optimizer keeps AdamW's fp32 state on the host, but optimizer is " +
                       optimizer + "; use optimizer: adamw or offload: none");
  }
  // Offload moves each gradient to the host as it is produced, where neither the global-norm clip
  // nor the loss scaler's unscale-and-check (both over the device .grad tensors) sees it.
  if (offload && config.GetFloat("train.grad_clip") > 0) {
    return Problem({"offload", "train.grad_clip"},
                   "offload: optimizer moves gradients to the host as backward produces them, "
                   "where train.grad_clip does not reach; set train.grad_clip: 0 or offload: none");
  }
  if (offload && config.GetString("precision") == "16-mixed") {
    return Problem({"offload", "precision"},
                   "offload: optimizer moves gradients to the host as backward produces them, "
                   "where 16-mixed loss scaling cannot check them for overflow; use bf16-mixed or "
                   "bf16-true");
  }
  // DDP all-reduces the gradients that backward accumulates in .grad; offload moves them to the
  // host and optimizer_in_backward consumes them before the other ranks' gradients are known.
  if (config.GetString("strategy") == "ddp" &&
      (offload || config.GetBool("optimizer_in_backward"))) {
    const std::string other = offload ? "offload" : "optimizer_in_backward";
    return Problem({"strategy", other},
                   "strategy: ddp averages the gradients across ranks after backward, which " +
                       other + " does not wait for; use strategy: auto or turn " + other + " off");
  }
  // FSDP here shards every parameter as a trainable flat shard, reduces gradients in backward,
  // and clips over the ranks; what it does not build yet is refused by name.
  if (config.GetString("strategy") == "fsdp") {
    if (offload) {
      return Problem(
          {"strategy", "offload"},
          "strategy: fsdp with offload: optimizer would keep a second, host copy of each "
          "shard; use offload: full (the shards themselves, their gradients and AdamW's "
          "state in host memory: ZeRO-3 offload) or offload: none");
    }
    if (config.GetBool("optimizer_in_backward")) {
      return Problem({"strategy", "optimizer_in_backward"},
                     "strategy: fsdp reduce-scatters the gradients into shards after each unit's "
                     "backward; optimizer_in_backward is not built for shards here; use strategy: "
                     "auto or turn optimizer_in_backward off");
    }
    if (config.GetBool("peft.save_merged")) {
      return Problem({"strategy", "peft.save_merged"},
                     "strategy: fsdp writes the adapter from its shards, but merging it into the "
                     "base weights is not built for shards yet; set peft.save_merged: false (the "
                     "adapter in output_dir/adapter merges with PEFT's merge_and_unload)");
    }
    if (config.GetString("precision") == "16-mixed") {
      return Problem({"strategy", "precision"},
                     "strategy: fsdp has no sharded loss scaler for 16-mixed yet; use bf16-mixed, "
                     "bf16-true or 32-true");
    }
  }
  if (config.GetBool("optimizer_in_backward")) {
    const int64_t micro = config.GetInt("train.micro_batch_size");
    const int64_t global = config.GetInt("train.global_batch_size");
    const int64_t devices = config.GetInt("devices");
    // FindConfigProblem has checked micro x devices x nodes for overflow before this runs.
    if (global != micro * devices) {
      return Problem(
          {"optimizer_in_backward", "train.global_batch_size"},
          "optimizer_in_backward updates each parameter while backward runs, so gradients "
          "cannot accumulate: train.global_batch_size (" +
              Str(global) + ") must equal train.micro_batch_size x devices (" +
              Str(micro * devices) + ")");
    }
    if (config.GetFloat("train.grad_clip") > 0) {
      return Problem({"optimizer_in_backward", "train.grad_clip"},
                     "optimizer_in_backward updates each parameter before the other gradients "
                     "exist, so the global norm train.grad_clip needs is never known; set "
                     "train.grad_clip: 0");
    }
    if (config.GetString("precision") == "16-mixed") {
      return Problem({"optimizer_in_backward", "precision"},
                     "optimizer_in_backward cannot skip a step whose gradients overflowed, which "
                     "16-mixed loss scaling needs; use bf16-mixed or bf16-true");
    }
    if (offload) {
      return Problem({"optimizer_in_backward", "offload"},
                     "optimizer_in_backward and offload: optimizer cannot be combined; choose one");
    }
  }

  const std::string method = config.GetString("peft.method");
  if (method == "none") {
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
  if (config.GetInt("peft.r") < 1) {
    return Problem({"peft.r"}, "peft.r must be at least 1, got " + Str(config.GetInt("peft.r")));
  }
  if (!(config.GetFloat("peft.alpha") > 0)) {
    return Problem({"peft.alpha"}, "peft.alpha must be positive, got " +
                                       FormatKeyValue(config.GetFloat("peft.alpha")));
  }
  const double dropout = config.GetFloat("peft.dropout");
  if (dropout < 0 || dropout >= 1) {
    return Problem({"peft.dropout"},
                   "peft.dropout must be in [0, 1), got " + FormatKeyValue(dropout));
  }
  const std::vector<std::string> targets = config.GetStringList("peft.targets");
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
  if (method == "qlora" && config.GetString("precision") == "16-mixed" &&
      config.GetString("peft.compute_dtype") == "bf16") {
    return Problem({"peft.compute_dtype", "precision"},
                   "peft.compute_dtype bf16 with precision 16-mixed: fp16 autocast runs every "
                   "matmul in fp16, so each NF4 weight would be rounded to bf16 and then again to "
                   "fp16 (and 16-mixed is for devices without bf16); set peft.compute_dtype: fp32 "
                   "or use precision bf16-mixed");
  }
  if (method == "lora") {
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

// The profile group: its other keys only mean something with profile.steps, and the profiled
// steps must be steps the run takes.
std::optional<ConfigProblem> FindProfileProblem(const TrialConfig& config) {
  const int64_t steps = config.GetInt("profile.steps");
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
  const int64_t first = config.GetInt("profile.first_step");
  const int64_t max_steps = config.GetInt("train.max_steps");
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
  const bool images = config.GetString("data.format") == "imagefolder";
  const std::vector<std::string> frozen = config.GetStringList("freeze");
  if (!images) {
    if (!frozen.empty()) {
      return Problem({"freeze", "data.format"},
                     "freeze names BLIP-2's parts, which train on data.format imagefolder, but "
                     "data.format is " +
                         config.GetString("data.format") + "; remove freeze");
    }
    if (config.IsSet("data.caption_column")) {
      return Problem({"data.caption_column", "data.format"},
                     "data.caption_column applies to data.format imagefolder, but data.format is " +
                         config.GetString("data.format") + "; remove data.caption_column");
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
  if (config.GetString("data.caption_column").empty()) {
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
  if (frozen.size() == kBlip2Parts.size() && config.GetString("peft.method") == "none") {
    return Problem(
        {"freeze", "peft.method"},
        "freeze lists every part of BLIP-2 and peft.method is none: nothing would train");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ConfigProblem> FindConfigProblem(const TrialConfig& config,
                                               const ModelConfig* model) {
  const std::string model_name = config.GetString("model");
  if (model_name.empty())
    return Problem({"model"}, "model is required: a preset name or a model directory");
  if (config.GetString("data.path").empty()) {
    return Problem({"data.path"},
                   "data.path is required: the training data, a JSON-lines file (e.g. data: {path: "
                   "train.jsonl})");
  }

  // Counts that must be at least 1, and those that may also be 0 (meaning "off" or "all").
  const std::pair<std::string_view, int64_t> at_least_one[] = {
      {"data.max_seq_length", 2},
      {"train.micro_batch_size", 1},
      {"train.global_batch_size", 1},
      {"train.epochs", 1},
      {"devices", 1},
      {"nodes", 1},
      {"log_every", 1},
  };
  for (const auto& [key, minimum] : at_least_one) {
    const int64_t value = config.GetInt(key);
    if (value < minimum) {
      std::string why =
          key == "data.max_seq_length" ? " (an input token and its next-token target)" : "";
      return Problem({std::string(key)}, std::string(key) + " must be at least " + Str(minimum) +
                                             why + ", got " + Str(value));
    }
  }
  for (std::string_view key :
       {"data.samples", "train.warmup_steps", "train.max_steps", "seed", "snapshot_every",
        "checkpoint_every", "profile.steps", "profile.first_step"}) {
    const int64_t value = config.GetInt(key);
    if (value < 0) {
      return Problem({std::string(key)},
                     std::string(key) + " must not be negative, got " + Str(value));
    }
  }
  if (std::optional<ConfigProblem> found = FindProfileProblem(config)) return found;

  // Nodes x devices ranks (Lightning's num_nodes x devices) need more than one process each:
  // only the data-parallel strategies start them.
  const int64_t nodes = config.GetInt("nodes");
  if (const std::string strategy = config.GetString("strategy");
      nodes > 1 && strategy != "ddp" && strategy != "fsdp") {
    return Problem(
        {"nodes", "strategy"},
        "nodes: " + Str(nodes) + " runs " + Str(nodes) +
            " x devices ranks, which only strategy ddp or fsdp starts, but strategy is " +
            strategy + "; use strategy: ddp or fsdp, or nodes: 1");
  }

  const int64_t micro = config.GetInt("train.micro_batch_size");
  const int64_t global = config.GetInt("train.global_batch_size");
  const int64_t devices = config.GetInt("devices");
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

  const double lr = config.GetFloat("train.lr");
  if (lr < 0)
    return Problem({"train.lr"}, "train.lr must not be negative, got " + FormatKeyValue(lr));
  const std::vector<double> betas = config.GetFloatList("train.betas");
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
  if (!(config.GetFloat("train.eps") > 0)) {
    return Problem({"train.eps"}, "train.eps must be positive, got " +
                                      FormatKeyValue(config.GetFloat("train.eps")));
  }
  for (std::string_view key : {"train.weight_decay", "train.grad_clip"}) {
    const double value = config.GetFloat(key);
    if (value < 0) {
      return Problem({std::string(key)},
                     std::string(key) + " must not be negative, got " + FormatKeyValue(value));
    }
  }
  const double momentum = config.GetFloat("train.momentum");
  if (momentum < 0 || momentum >= 1) {
    return Problem({"train.momentum"},
                   "train.momentum must be in [0, 1), got " + FormatKeyValue(momentum));
  }
  if (momentum != 0 && config.GetString("optimizer") != "sgd") {
    return Problem({"train.momentum", "optimizer"},
                   "train.momentum applies only to optimizer sgd, but optimizer is " +
                       config.GetString("optimizer") +
                       "; remove train.momentum or set optimizer: sgd");
  }

  if (std::optional<ConfigProblem> found = FindTechniqueProblem(config)) return found;

  if (const std::optional<uint64_t> budget = config.GetByteSize("device_memory");
      budget && *budget == 0) {
    return Problem({"device_memory"},
                   "device_memory must be more than 0 bytes (leave it unset for no "
                   "budget)");
  }

  if (std::optional<ConfigProblem> found = FindImageFolderProblem(config)) return found;

  if (config.GetString("data.format") == "text") {
    if (config.IsSet("data.template") && config.GetString("data.template") != "none") {
      return Problem({"data.template", "data.format"},
                     "data.template " + config.GetString("data.template") +
                         " needs instruction records, but data.format is text; use data.template: "
                         "none or data.format: alpaca");
    }
    if (config.IsSet("data.mask_prompt") && config.GetBool("data.mask_prompt")) {
      return Problem(
          {"data.mask_prompt", "data.format"},
          "data.mask_prompt: true needs a prompt to mask, but data.format text has none; "
          "remove data.mask_prompt or use data.format: alpaca");
    }
  }

  if (config.GetString("init") == "pretrained") {
    const ModelConfig* preset = FindPreset(model_name);
    if (preset != nullptr && preset->hf_repo_id.empty()) {
      return Problem({"init", "model"}, "init: pretrained needs published weights, and model " +
                                            model_name + " has none; use init: random");
    }
  }

  if (model != nullptr) {
    const int64_t length = config.GetInt("data.max_seq_length");
    if (length > model->max_position_embeddings) {
      return Problem({"data.max_seq_length", "model"},
                     "data.max_seq_length (" + Str(length) + ") exceeds the model's " +
                         "max_position_embeddings (" + Str(model->max_position_embeddings) + ")");
    }
  }
  return std::nullopt;
}

Status ValidateTrialConfig(const TrialConfig& config, const ModelConfig* model) {
  std::optional<ConfigProblem> problem = FindConfigProblem(config, model);
  if (!problem) return Status::Ok();
  return InvalidArgumentError(problem->message);
}

std::optional<ConfigProblem> FindModelFamilyProblem(const TrialConfig& config, bool blip2) {
  const std::string model = config.GetString("model");
  const bool images = config.GetString("data.format") == "imagefolder";
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
