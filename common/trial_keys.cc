#include "common/trial_keys.h"

#include <cstdint>
#include <vector>

namespace llmctl {
namespace {

// The registry's keys, group by group in documentation order (BuildTrialKeys joins them).

// model, init, tokenizer: what is trained, from what, and how its text is split.
std::vector<KeySpec> ModelKeys() {
  using K = KeyType;
  return {
      {"model",
       K::kString,
       "llmctl-demo",
       {},
       "Preset name (tinyllama-1.1b, open_llama_3b, open_llama_7b, open_llama_13b, llmctl-demo; "
       "BLIP-2: blip2-opt-2.7b, blip2-opt-6.7b, blip2-flan-t5-xl, blip2-flan-t5-xxl), a Hugging "
       "Face model directory holding config.json (LLaMA family, or blip-2 with OPT or T5), or "
       "hf:ORG/NAME[@REVISION] (downloaded by "
       "the agent; llm-train alone refuses it)"},
      {"init",
       K::kEnum,
       "random",
       {"pretrained", "random"},
       "Start from the model's published weights or from a seeded random initialisation"},
      {"tokenizer",
       K::kPath,
       "",
       {},
       "tokenizer.json, or a directory holding one; unset: the model directory's (presets have no "
       "files, so they need one)"},
  };
}

// data.*: the training data and how its records become tokens.
std::vector<KeySpec> DataKeys() {
  using K = KeyType;
  return {
      {"data.path",
       K::kPath,
       "",
       {},
       "Training data (required): a JSON-lines file, or for data.format imagefolder a directory"},
      {"data.format",
       K::kEnum,
       "alpaca",
       {"alpaca", "text", "imagefolder"},
       "alpaca: {instruction, input, output} records; text: {text} records; imagefolder (BLIP-2 "
       "models): images beside metadata.jsonl or metadata.csv naming each file_name and its "
       "caption (Hugging Face's imagefolder layout)"},
      {"data.caption_column",
       K::kString,
       "text",
       {},
       "data.format imagefolder: the metadata column that holds each image's caption"},
      {"data.template",
       K::kEnum,
       "alpaca",
       {"alpaca", "none"},
       "Prompt template wrapped around Alpaca records"},
      {"data.mask_prompt",
       K::kBool,
       "true",
       {},
       "Train on the response only: the prompt's tokens do not count in the loss"},
      {"data.samples",
       K::kInt,
       "0",
       {},
       "Use the first N records of the data (0 = all); the labs' num_train_samples",
       {},
       int64_t{1} << 40},
      {"data.max_seq_length",
       K::kInt,
       "512",
       {},
       "Truncate every example to this many tokens; at most the model's max_position_embeddings "
       "(BLIP-2: the caption's tokens, BOS included, as the labs' tokenizer max_length 50 counts "
       "them; the image's query positions come on top)",
       {},
       int64_t{1} << 24},
  };
}

// train.*: batches, steps and the optimizer's hyperparameters.
std::vector<KeySpec> TrainKeys() {
  using K = KeyType;
  return {
      {"train.micro_batch_size",
       K::kInt,
       "1",
       {},
       "Examples per forward/backward pass on each device",
       {},
       int64_t{1} << 20},
      {"train.global_batch_size",
       K::kInt,
       "",
       {},
       "Examples per optimizer step; a multiple of micro_batch_size x devices x nodes (the rest "
       "is gradient accumulation)",
       "train.micro_batch_size",
       int64_t{1} << 30},
      {"train.lr", K::kFloat, "2e-4", {}, "Peak learning rate"},
      {"train.warmup_steps",
       K::kInt,
       "0",
       {},
       "Optimizer steps of linear learning-rate warmup from 0",
       {},
       int64_t{1} << 32},
      {"train.max_steps",
       K::kInt,
       "0",
       {},
       "Stop after this many optimizer steps (0 = as many as train.epochs take)",
       {},
       int64_t{1} << 32},
      {"train.epochs",
       K::kInt,
       "1",
       {},
       "Passes over the data when train.max_steps is 0",
       {},
       int64_t{1} << 20},
      {"train.betas", K::kFloatList, "[0.9, 0.95]", {}, "AdamW's beta1 and beta2"},
      {"train.eps", K::kFloat, "1e-8", {}, "AdamW's epsilon"},
      {"train.weight_decay", K::kFloat, "0.0", {}, "Decoupled weight decay"},
      {"train.grad_clip",
       K::kFloat,
       "0.0",
       {},
       "Clip the global gradient norm to this value (0 = no clipping)"},
      {"train.momentum", K::kFloat, "0.0", {}, "SGD momentum (optimizer: sgd only)"},
  };
}

// precision, optimizer, offload, strategy, optimizer_in_backward, loss, kernels: how a step
// computes and where its state lives.
std::vector<KeySpec> TechniqueKeys() {
  using K = KeyType;
  return {
      {"precision",
       K::kEnum,
       "32-true",
       {"32-true", "bf16-true", "bf16-mixed", "16-mixed"},
       "Weights and compute: fp32; bf16 throughout; bf16 compute with fp32 weights; fp16 compute "
       "with "
       "fp32 weights and loss scaling"},
      {"optimizer",
       K::kEnum,
       "adamw",
       {"adamw", "sgd", "adamw_8bit", "adam_8bit", "deepspeed_cpu"},
       "adamw: fp32-state AdamW; sgd: no state; adamw_8bit (alias adam_8bit): bitsandbytes' "
       "blockwise "
       "8-bit AdamW; deepspeed_cpu: the labs' name, only with strategy deepspeed_stage_2_offload "
       "(becomes adamw + offload: optimizer)"},
      {"offload",
       K::kEnum,
       "none",
       {"none", "optimizer", "full"},
       "optimizer: fp32 master weights and AdamW state live in host memory and the step runs there "
       "(DeepSpeed stage-2 offload); full, with strategy fsdp: the parameter shards themselves, "
       "their gradients and the optimizer state live in host memory, each unit is copied to the "
       "device to be gathered, and the step runs on the host (FSDP2's CPUOffloadPolicy, DeepSpeed "
       "stage-3 offload)"},
      {"strategy",
       K::kEnum,
       "auto",
       {"auto", "ddp", "fsdp", "deepspeed_stage_2_offload", "deepspeed_stage_3_offload"},
       "auto: one process; ddp: data-parallel over `devices` ranks (c10d: Gloo on cpu, NCCL on "
       "cuda), each rank a shard of the data, gradients averaged by bucketed all-reduce during "
       "backward (llm-train --nproc N); fsdp: fully sharded data parallel over `devices` ranks "
       "(FSDP2's fully_shard: each decoder layer a unit, parameters, gradients and optimizer state "
       "in 1/N flat shards, layers all-gathered around their forward and backward, gradients "
       "reduce-scattered); deepspeed_stage_2_offload (the labs' Lightning strategy) "
       "becomes offload: optimizer, deepspeed_stage_3_offload becomes strategy: fsdp with "
       "offload: full"},
      {"optimizer_in_backward",
       K::kBool,
       "false",
       {},
       "Update each parameter as soon as its gradient is ready and free the gradient (no gradient "
       "accumulation or global-norm clipping)"},
      {"loss",
       K::kEnum,
       "auto",
       {"auto", "ce", "chunked_ce"},
       "ce: cross-entropy over the full (B, T, V) logits, as transformers computes it; chunked_ce: "
       "over chunks of tokens with the gradient formed in forward (fused linear cross-entropy), "
       "never holding all logits or their gradient; auto: chunked_ce under kernels: fused, ce "
       "under kernels: aten"},
      {"kernels",
       K::kEnum,
       "fused",
       {"fused", "aten"},
       "The decoder block's RMSNorm, SwiGLU and rotary embedding (LLaMA family), T5's norms and "
       "gated-GELU (BLIP-2 with Flan-T5). aten: the ATen composition transformers runs, keeping "
       "exactly its tensors (the labs' tables); fused: each one op with its own backward "
       "(trainer/kernels), keeping only RMSNorm's input and per-row rstd and the gated MLP's two "
       "projections (and, where LLaMA's down_proj trains, not its input: it is recomputed)"},
  };
}

// peft.* and freeze: which weights train.
std::vector<KeySpec> PeftKeys() {
  using K = KeyType;
  return {
      {"peft.method",
       K::kEnum,
       "none",
       {"none", "lora", "qlora"},
       "none: train every weight; lora: frozen base + low-rank adapters (Hugging Face PEFT); "
       "qlora: "
       "the same over NF4-quantised base weights (bitsandbytes)"},
      {"peft.r", K::kInt, "8", {}, "LoRA rank", {}, int64_t{1} << 16},
      {"peft.alpha", K::kFloat, "8", {}, "LoRA alpha; adapters are scaled by alpha / r"},
      {"peft.dropout", K::kFloat, "0.0", {}, "Dropout on the adapters' input (not the base path)"},
      {"peft.targets",
       K::kStringList,
       "[q_proj, v_proj]",
       {},
       "Projections that get adapters: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
       "down_proj, lm_head (LLaMA); q_proj, k_proj, v_proj, out_proj, fc1, fc2 (BLIP-2's OPT); q, "
       "k, v, o, wi_0, wi_1, wo (BLIP-2's Flan-T5)"},
      {"peft.double_quant",
       K::kBool,
       "true",
       {},
       "qlora: quantise the NF4 block scales again (8-bit, blocks of 256), ~0.4 bit/param less"},
      {"peft.compute_dtype",
       K::kEnum,
       "bf16",
       {"bf16", "fp32"},
       "qlora: the dtype NF4 weights are dequantised to for each matmul"},
      {"peft.save_merged",
       K::kBool,
       "false",
       {},
       "Also write the model with adapters merged into the base weights (output_dir/merged)"},
      {"peft.adapter",
       K::kPath,
       "",
       {},
       "A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) to start from; "
       "its r and targets must equal peft.r and peft.targets"},
      {"freeze",
       K::kStringList,
       "[]",
       {},
       "BLIP-2: parts kept frozen (no gradients, no optimizer state): vision_model, qformer (with "
       "the query tokens), language_projection, language_model; the labs train all of them"},
  };
}

// activation_checkpointing, then the devices a trial runs on and how it spreads over them
// (device, devices, nodes, ddp.*, fsdp.*, device_memory).
std::vector<KeySpec> DeviceKeys() {
  using K = KeyType;
  return {
      {"activation_checkpointing",
       K::kBool,
       "false",
       {},
       "Recompute each decoder layer's activations in backward instead of keeping them"},
      {"device", K::kEnum, "cpu", {"cpu", "cuda"}, "Where training runs"},
      {"devices",
       K::kInt,
       "1",
       {},
       "Number of devices (one worker process each)",
       {},
       int64_t{1} << 12},
      {"nodes",
       K::kInt,
       "1",
       {},
       "Number of nodes the trial spans, each with `devices` devices (Lightning's num_nodes x "
       "devices: nodes x devices ranks); more than 1 only with strategy ddp or fsdp. The "
       "controller places it on that many agents at once and starts node rank 0 first, whose "
       "host serves the ranks' rendezvous",
       {},
       int64_t{1} << 16},
      {"ddp.bucket_size",
       K::kByteSize,
       "25MiB",
       {},
       "strategy ddp: gradients are all-reduced in flat buckets of about this size, in reverse "
       "parameter order (PyTorch DDP's bucket_cap_mb)"},
      {"fsdp.reshard_after_forward",
       K::kBool,
       "true",
       {},
       "strategy fsdp: free each layer's gathered parameters after its forward and gather them "
       "again for its backward (ZeRO-3, FSDP2's default); false keeps them gathered from forward "
       "until their gradients are reduced (ZeRO-2: every layer gathered at the loss, one "
       "all-gather per layer fewer)"},
      {"device_memory",
       K::kByteSize,
       "",
       {},
       "Memory budget per device, e.g. 24GiB; exceeding it is an out-of-memory outcome (unset = no "
       "budget)"},
  };
}

// seed, snapshots, profiling, logging, output and checkpoints: what a run records.
std::vector<KeySpec> RunKeys() {
  using K = KeyType;
  return {
      {"seed", K::kInt, "42", {}, "Seed for initialisation, data order and dropout"},
      {"snapshot_every",
       K::kInt,
       "50",
       {},
       "Memory snapshots at steps 0 and 1, then every N optimizer steps (0 = steps 0 and 1 only)",
       {},
       int64_t{1} << 32},
      {"profile.steps",
       K::kInt,
       "0",
       {},
       "Profile this many optimizer steps from profile.first_step (0 = none): a Kineto trace "
       "(output_dir/profile/trace-steps-A-B.json, for ui.perfetto.dev) and the allocator's "
       "history (memory-steps-A-B.pickle, for pytorch.org/memory_viz)",
       {},
       int64_t{1} << 32},
      {"profile.first_step",
       K::kInt,
       "2",
       {},
       "The first profiled step (counted from 0); the default skips the first steps' one-time "
       "work (optimizer state creation, kernel warm-up)",
       {},
       int64_t{1} << 32},
      {"profile.memory_history",
       K::kBool,
       "true",
       {},
       "Record the allocator's history of the profiled steps (memory-steps-A-B.pickle)"},
      {"log_every",
       K::kInt,
       "1",
       {},
       "Log loss and throughput every N optimizer steps",
       {},
       int64_t{1} << 32},
      {"output_dir",
       K::kPath,
       "",
       {},
       "Where checkpoints and adapters go; under llmctl a relative path inside the run's output/ "
       "(unset = output/ itself), for llm-train alone any directory"},
      {"checkpoint_every",
       K::kInt,
       "0",
       {},
       "Save a checkpoint every N optimizer steps (0 = never)",
       {},
       int64_t{1} << 32},
  };
}

const std::vector<KeySpec>* BuildTrialKeys() {
  auto* keys = new std::vector<KeySpec>;
  for (auto* group :
       {ModelKeys, DataKeys, TrainKeys, TechniqueKeys, PeftKeys, DeviceKeys, RunKeys}) {
    const std::vector<KeySpec> part = group();
    keys->insert(keys->end(), part.begin(), part.end());
  }
  return keys;
}

}  // namespace

const std::vector<KeySpec>& TrialKeys() {
  static const std::vector<KeySpec>* const keys = BuildTrialKeys();
  return *keys;
}

}  // namespace llmctl
