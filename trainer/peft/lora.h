// LoRA with Hugging Face PEFT's semantics and files: adapters on the named projections, everything
// else frozen; adapters read from and written to PEFT's adapter directories (adapter_config.json +
// adapter_model.safetensors), and the merged model written as a Hugging Face model directory.
//
// Our parameter names are PEFT's on-disk names without "base_model.model.":
// "model.layers.0.self_attn.q_proj.lora_A.weight" is PEFT's
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".
#ifndef LLMCTL_TRAINER_PEFT_LORA_H_
#define LLMCTL_TRAINER_PEFT_LORA_H_

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/trial_settings.h"
#include "trainer/model/llama.h"
#include "trainer/model/projection.h"
#include "trainer/train/checkpoints.h"

namespace llmctl::trainer {

struct LoraConfig {
  LoraOptions options;
  std::vector<std::string> targets;  // projection names from kLoraTargets, e.g. q_proj, lm_head
  // QLoRA: the decoder projections' base weights are NF4 (BuildModel's `nf4`); nullopt for LoRA.
  std::optional<Nf4Options> nf4;
};

// The adapter settings of a trial (peft.r, peft.alpha, peft.dropout, peft.targets, and for qlora
// peft.double_quant and peft.compute_dtype); nullopt for peft.method none.
std::optional<LoraConfig> LoraConfigFor(const PeftSettings& peft);

// Freezes every parameter of `model` and adds a trainable adapter to every projection named in
// config.targets (lm_head included when embeddings are tied: its base is then the embedding
// matrix). Draws lora_A from the default generator: seed first for reproducible runs.
// Any model whose projections are Projections (LLaMA's, BLIP-2's language model); the LLaMA
// overload is for the trainer's holder.
void ApplyLora(torch::nn::Module& model, const LoraConfig& config);
void ApplyLora(LlamaForCausalLM& model, const LoraConfig& config);

// Every name in config.targets names projections of `model` (the last part of their module names):
// InvalidArgument naming the target and the model's projection names otherwise, since peft.targets
// accepts every family's names (o_proj is LLaMA's, out_proj OPT's).
Status CheckLoraTargets(torch::nn::Module& model, const LoraConfig& config);

// Whether a parameter name belongs to an adapter ("….lora_A.weight", "….lora_B.weight").
bool IsAdapterParameter(std::string_view name);

// Copies the adapter in PEFT directory `dir` into the adapters ApplyLora added. adapter_config.json
// must describe the same adapter (peft_type LORA, r, lora_alpha, target_modules equal to `config`;
// no rsLoRA, DoRA, biases, fan_in_fan_out or per-layer patterns); adapter_model.safetensors must
// hold exactly the adapter tensors, in a floating-point dtype and the model's shapes. Errors name
// the file and the field or tensor.
Status LoadAdapter(torch::nn::Module& model, const LoraConfig& config, const std::string& dir);
Status LoadAdapter(LlamaForCausalLM& model, const LoraConfig& config, const std::string& dir);

// Writes `dir`/adapter_config.json and `dir`/adapter_model.safetensors as PEFT's save_pretrained
// does, so PeftModel.from_pretrained(base, dir) loads them. `base_model` goes into
// base_model_name_or_path; `task_type` into task_type ("" writes null, as get_peft_model without a
// task does for BLIP-2). The LLaMA overload writes CAUSAL_LM.
Status SaveAdapter(torch::nn::Module& model, const LoraConfig& config,
                   const std::string& base_model, const std::string& task_type,
                   const std::string& dir);
// The same from the model's named tensors (a checkpoint's model state: under fsdp the shards
// gathered by name), of which it writes the adapters'.
Status SaveAdapter(const NamedTensors& model_state, const LoraConfig& config,
                   const std::string& base_model, const std::string& task_type,
                   const std::string& dir);
Status SaveAdapter(LlamaForCausalLM& model, const LoraConfig& config, const std::string& base_model,
                   const std::string& dir);

// Writes `dir`/config.json and `dir`/model.safetensors (Hugging Face names, the parameters' dtype)
// with every adapter merged into its base weight: W + (lora_B @ lora_A) * alpha / r. NF4 base
// weights are dequantised to the parameters' dtype first, so a QLoRA model is written dense, as
// PEFT's merge_and_unload of a dequantised 4-bit model gives it. A tied output projection with an
// adapter no longer equals the embedding matrix, so it is written as its own weight: `config_json`
// gets the names of such weights (none, or the head's) and returns the config.json to write (which
// then says the head is not tied).
Status SaveMerged(
    torch::nn::Module& model,
    const std::function<nlohmann::json(const std::vector<std::string>& untied)>& config_json,
    const std::string& dir);
// The LLaMA family's: its config.json, tie_word_embeddings false once lm_head.weight is its own.
Status SaveMerged(LlamaForCausalLM& model, const std::string& dir);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_PEFT_LORA_H_
