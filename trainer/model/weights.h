// Building a model: random initialisation, or weights from a Hugging Face directory's safetensors.
#ifndef LLMCTL_TRAINER_MODEL_WEIGHTS_H_
#define LLMCTL_TRAINER_MODEL_WEIGHTS_H_

#include <torch/torch.h>

#include <optional>
#include <string>

#include "common/model_config.h"
#include "common/status.h"
#include "common/blip2_config.h"
#include "trainer/model/blip2.h"
#include "trainer/model/llama.h"
#include "common/safetensors/safetensors.h"

namespace llmctl::trainer {

// Builds the model with parameters of `dtype` on `device`. init "random" draws Hugging Face's
// initialisation (seeded by the caller's torch::manual_seed); init "pretrained" loads `model_dir`'s
// model.safetensors (or its sharded index). Errors name the file and the tensor. With `nf4` the
// decoder projections are NF4 (QLoRA): their dense weights never exist all at once, only one at a
// time while it is quantised.
StatusOr<LlamaForCausalLM> BuildModel(const ModelConfig& config, const std::string& init,
                                      const std::string& model_dir, torch::Dtype dtype,
                                      torch::Device device,
                                      const std::optional<Nf4Options>& nf4 = std::nullopt);

// The same for BLIP-2 (LoadBlip2Weights, Blip2ForConditionalGeneration::InitializeRandom): every
// parameter in `dtype`, the Q-Former's too, as Lightning's bf16-true converts the whole module
// (transformers' own from_pretrained(dtype=bf16) would keep the Q-Former in fp32).
StatusOr<Blip2ForConditionalGeneration> BuildBlip2Model(
    const Blip2Config& config, const std::string& init, const std::string& model_dir,
    torch::Dtype dtype, torch::Device device, const std::optional<Nf4Options>& nf4 = std::nullopt);

// Hugging Face's initialisation (_init_weights) of either family: normal(0, std) for linear,
// convolution and embedding weights and for free parameters (BLIP-2's class and position embeddings
// and query tokens); zero biases; LayerNorms and RMSNorms one (and zero). Module by module, each
// module's own parameters in registration order; an NF4 base draws its dense weight (one at a
// time) where a dense one would be, so the same seed gives the same weights, quantised.
// Deterministic under torch::manual_seed.
void InitializeLikeHuggingFace(torch::nn::Module& model, double std);

// Copies every parameter from `checkpoint` by Hugging Face name, converting dtype tensor by tensor
// straight from the memory-mapped file into the parameter (no second full copy of the model). An
// NF4 base weight is read into one dense tensor, quantised, and the dense tensor dropped.
Status LoadWeights(LlamaForCausalLM& model, const safetensors::ShardedCheckpoint& checkpoint,
                   const std::string& source);

// Every NF4 base weight under `model` (its Projections' "<name>.weight" in the checkpoint): read into
// one dense tensor, quantised, the dense tensor dropped, one at a time. Errors name `source` and the
// tensor.
Status LoadNf4BaseWeights(torch::nn::Module& model,
                          const safetensors::ShardedCheckpoint& checkpoint,
                          const std::string& source);

// Copies a floating-point tensor of a file into `param` (same shape, any float dtype), converting
// the dtype; DataLoss naming `source` and the tensor on another shape or a non-float dtype.
Status CopyTensorFromView(const safetensors::TensorView& view, torch::Tensor& param,
                          const std::string& source);

// The safetensors dtype of a tensor dtype; Unimplemented for dtypes the format lacks.
StatusOr<safetensors::DType> SafetensorsDtype(torch::Dtype dtype);

// A zero-copy tensor over a view's bytes (valid while the file stays open).
torch::Tensor TensorFromView(const safetensors::TensorView& view);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MODEL_WEIGHTS_H_
