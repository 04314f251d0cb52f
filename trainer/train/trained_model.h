// The model a trial trains, whichever family it is (the LLaMA decoders, BLIP-2): what the trial
// loop needs of it. The loop knows the step; this knows what one forward of a micro-batch is.
#ifndef LLMCTL_TRAINER_TRAIN_TRAINED_MODEL_H_
#define LLMCTL_TRAINER_TRAIN_TRAINED_MODEL_H_

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/blip2_config.h"
#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/kernels/fused_ops.h"
#include "trainer/model/llama.h"
#include "trainer/model/projection.h"
#include "trainer/train/batches.h"

namespace llmctl::trainer {

// A trial's `model`, resolved: a LLaMA-family shape or BLIP-2's.
using TrialModelConfig = std::variant<ModelConfig, Blip2Config>;

// BLIP-2 when `model` names it (ResolveBlip2Model), else the LLaMA family's ResolveModel.
StatusOr<TrialModelConfig> ResolveTrialModel(const std::string& model);

// What can be checked of the trial once its model's family is known (a directory's config.json):
// the family's own rules (--set may have changed data.format since the experiment was parsed) and
// every input file, before anything loads (what `llmctl submit` checked on the user's machine,
// checked again where the trial runs).
Status CheckTrialForModel(const TrialConfig& config, const TrialModelConfig& model);

// The family's micro-batches: text for the LLaMA family, image-caption pairs for BLIP-2; the
// shard of rank `rank` of `world_size`.
StatusOr<std::unique_ptr<BatchSource>> OpenTrialBatches(const TrialConfig& config,
                                                        const TrialModelConfig& model, int rank,
                                                        int64_t world_size);

class TrainedModel {
 public:
  virtual ~TrainedModel() = default;

  virtual torch::nn::Module& module() = 0;
  // The micro-batch's mean cross-entropy over its label tokens (a float32 scalar), with the graph
  // for backward. `chunked`: over kLossChunkTokens tokens at a time, never holding all logits.
  virtual torch::Tensor Loss(const MicroBatch& batch, bool chunked) = 0;
  // peft.save_merged: `dir` as a Hugging Face model directory with every adapter merged
  // (SaveMerged).
  virtual Status SaveMerged(const std::string& dir) = 0;
  // PEFT's task_type for this model's adapters ("" for none, as get_peft_model leaves BLIP-2's).
  virtual std::string adapter_task_type() const = 0;
  // FSDP's per-block gathers around each block of the model's stacks.
  virtual void SetLayerHooks(LayerHooks* hooks) = 0;
  // The FSDP unit of a parameter, by its name: its block's number (as SetLayerHooks' calls number
  // the blocks), -1 for the root.
  virtual int64_t LayerOf(const std::string& parameter_name) const = 0;
  // Freezes the named parts (BLIP-2: kBlip2Parts, "qformer" with the query tokens): they get no
  // gradient and no optimizer state. InvalidArgument for a name the model has no part of.
  virtual Status Freeze(const std::vector<std::string>& parts) = 0;
};

struct ModelBuildOptions {
  std::string init;       // "pretrained" (the directory `model_dir`'s weights) or "random"
  std::string model_dir;  // the trial's `model`
  torch::Dtype dtype = torch::kFloat32;
  torch::Device device{torch::kCPU};
  std::optional<Nf4Options> nf4;  // QLoRA's NF4 base weights for the language model's projections
  bool activation_checkpointing = false;
  // The decoder block's RMSNorm, SwiGLU and RoPE, T5's norms and gated-GELU (the trial key
  // `kernels`).
  Kernels kernels = Kernels::kAten;
};

// Builds `config`'s model with parameters of `options.dtype` on `options.device`: random draws are
// Hugging Face's initialisation (seeded by the caller), pretrained weights load by name. Errors
// name the directory and the tensor.
StatusOr<std::unique_ptr<TrainedModel>> BuildTrainedModel(const TrialModelConfig& config,
                                                          const ModelBuildOptions& options);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_TRAINED_MODEL_H_
