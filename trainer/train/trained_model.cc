#include "trainer/train/trained_model.h"

#include "common/inputs/trial_inputs.h"
#include "trainer/model/blip2.h"
#include "trainer/model/loss.h"
#include "trainer/model/weights.h"
#include "trainer/peft/lora.h"
#include "trainer/train/caption_batches.h"

namespace llmctl::trainer {
namespace {

class LlamaModelHolder final : public TrainedModel {
 public:
  LlamaModelHolder(LlamaForCausalLM model, const ModelBuildOptions& options)
      : model_(std::move(model)) {
    options_.activation_checkpointing = options.activation_checkpointing;
    options_.kernels = options.kernels;
  }

  torch::nn::Module& module() override { return *model_; }
  Status SaveMerged(const std::string& dir) override { return trainer::SaveMerged(model_, dir); }
  std::string adapter_task_type() const override { return "CAUSAL_LM"; }

  torch::Tensor Loss(const MicroBatch& batch, bool chunked) override {
    const torch::Tensor hidden = model_->Hidden(batch.input_ids, options_);   // (B, T, C)
    if (!chunked) return CausalLmLoss(model_->Logits(hidden), batch.labels);  // logits (B, T, V)
    return ChunkedCausalLmLoss(
        hidden, batch.labels,
        [model = model_](const torch::Tensor& h) mutable { return model->Logits(h); },
        model_->OutputParameters(), kLossChunkTokens, model_->PlainOutputWeight());
  }

  void SetLayerHooks(LayerHooks* hooks) override { options_.layer_hooks = hooks; }

  // "model.layers.<i>.…" -> i.
  int64_t LayerOf(const std::string& name) const override {
    static const std::string kPrefix = "model.layers.";
    return name.starts_with(kPrefix) ? std::stoll(name.substr(kPrefix.size())) : -1;
  }

  Status Freeze(const std::vector<std::string>& parts) override {
    if (parts.empty()) return Status::Ok();
    return InvalidArgumentError("freeze: the LLaMA family's model has no parts to freeze (" +
                                parts.front() + " is BLIP-2's)");
  }

 private:
  LlamaForCausalLM model_;
  LlamaOptions options_;
};

class Blip2ModelHolder final : public TrainedModel {
 public:
  Blip2ModelHolder(Blip2ForConditionalGeneration model, Blip2Config config)
      : model_(std::move(model)), config_(std::move(config)) {}

  // T5's head, when an adapter made it its own matrix, is no longer tied (T5 v1.0's); OPT's has
  // no projection of its own, so no adapter unties it.
  Status SaveMerged(const std::string& dir) override {
    return trainer::SaveMerged(
        *model_,
        [this](const std::vector<std::string>& untied) {
          Blip2Config config = config_;
          if (auto* t5 = std::get_if<T5Config>(&config.text); t5 != nullptr && !untied.empty()) {
            t5->tie_word_embeddings = false;
          }
          return ToHfConfigJson(config);
        },
        dir);
  }

  torch::nn::Module& module() override { return *model_; }
  std::string adapter_task_type() const override { return ""; }

  torch::Tensor Loss(const MicroBatch& batch, bool chunked) override {
    return model_->Loss(batch.pixel_values, batch.input_ids, batch.attention_mask, batch.labels,
                        chunked);
  }

  void SetLayerHooks(LayerHooks* hooks) override { model_->SetLayerHooks(hooks); }
  int64_t LayerOf(const std::string& name) const override { return model_->LayerOf(name); }

  Status Freeze(const std::vector<std::string>& parts) override {
    for (const std::string& part : parts) {
      torch::nn::Module* module = nullptr;
      for (const auto& child : model_->named_children()) {
        if (child.key() == part) module = child.value().get();
      }
      if (module == nullptr) return InvalidArgumentError("freeze: BLIP-2 has no part " + part);
      for (torch::Tensor& p : module->parameters()) p.requires_grad_(false);
      // The learned queries are the Q-Former's input, a parameter of the model itself.
      if (part == "qformer") model_->query_tokens.requires_grad_(false);
    }
    return Status::Ok();
  }

 private:
  Blip2ForConditionalGeneration model_;
  Blip2Config config_;
};

}  // namespace

StatusOr<TrialModelConfig> ResolveTrialModel(const std::string& model) {
  ASSIGN_OR_RETURN(std::optional<Blip2Config> blip2, ResolveBlip2Model(model));
  if (blip2) return TrialModelConfig(std::move(*blip2));
  ASSIGN_OR_RETURN(ModelConfig llama, ResolveModel(model));
  return TrialModelConfig(std::move(llama));
}

Status CheckTrialForModel(const TrialConfig& config, const TrialModelConfig& model) {
  const ModelConfig* llama = std::get_if<ModelConfig>(&model);
  if (std::optional<ConfigProblem> problem = FindModelFamilyProblem(config, llama == nullptr)) {
    return InvalidArgumentError(problem->message);
  }
  return TrialInputsChecker().Check(config, llama).status();
}

StatusOr<std::unique_ptr<BatchSource>> OpenTrialBatches(const TrialConfig& config,
                                                        const TrialModelConfig& model, int rank,
                                                        int64_t world_size) {
  if (const Blip2Config* blip2 = std::get_if<Blip2Config>(&model)) {
    return OpenCaptionBatches(config, *blip2, rank, static_cast<int>(world_size));
  }
  return OpenBatches(config, std::get<ModelConfig>(model).vocab_size, rank,
                     static_cast<int>(world_size));
}

StatusOr<std::unique_ptr<TrainedModel>> BuildTrainedModel(const TrialModelConfig& config,
                                                          const ModelBuildOptions& options) {
  if (const Blip2Config* blip2 = std::get_if<Blip2Config>(&config)) {
    ASSIGN_OR_RETURN(Blip2ForConditionalGeneration model,
                     BuildBlip2Model(*blip2, options.init, options.model_dir, options.dtype,
                                     options.device, options.nf4));
    model->SetActivationCheckpointing(options.activation_checkpointing);
    model->SetKernels(options.kernels);
    return std::unique_ptr<TrainedModel>(new Blip2ModelHolder(std::move(model), *blip2));
  }
  ASSIGN_OR_RETURN(LlamaForCausalLM model,
                   BuildModel(std::get<ModelConfig>(config), options.init, options.model_dir,
                              options.dtype, options.device, options.nf4));
  return std::unique_ptr<TrainedModel>(new LlamaModelHolder(std::move(model), options));
}

}  // namespace llmctl::trainer
