#include "trainer/model/weights.h"

#include <functional>
#include <utility>

#include "common/inputs/trial_inputs.h"

namespace llmctl::trainer {
namespace {

// The dtypes both formats have, in one table for both directions.
constexpr std::pair<safetensors::DType, torch::Dtype> kDtypes[] = {
    {safetensors::DType::kF64, torch::kFloat64}, {safetensors::DType::kF32, torch::kFloat32},
    {safetensors::DType::kF16, torch::kFloat16}, {safetensors::DType::kBF16, torch::kBFloat16},
    {safetensors::DType::kI64, torch::kInt64},   {safetensors::DType::kI32, torch::kInt32},
    {safetensors::DType::kI16, torch::kInt16},   {safetensors::DType::kI8, torch::kInt8},
    {safetensors::DType::kU8, torch::kUInt8},    {safetensors::DType::kBool, torch::kBool},
};

torch::Dtype TorchDtype(safetensors::DType dtype) {
  for (const auto& [file_dtype, torch_dtype] : kDtypes) {
    if (file_dtype == dtype) return torch_dtype;
  }
  return torch::kUInt8;  // unreachable: every safetensors::DType is in the table
}

// Sets the default dtype while alive so module constructors allocate parameters directly in the
// run's dtype (no fp32 copy first).
class ScopedDefaultDtype {
 public:
  explicit ScopedDefaultDtype(torch::Dtype dtype) : previous_(torch::get_default_dtype()) {
    torch::set_default_dtype(caffe2::scalarTypeToTypeMeta(dtype));
  }
  ~ScopedDefaultDtype() { torch::set_default_dtype(previous_); }

 private:
  caffe2::TypeMeta previous_;
};

}  // namespace

StatusOr<safetensors::DType> SafetensorsDtype(torch::Dtype dtype) {
  for (const auto& [file_dtype, torch_dtype] : kDtypes) {
    if (torch_dtype == dtype) return file_dtype;
  }
  return UnimplementedError("safetensors has no dtype for " + std::string(c10::toString(dtype)));
}

torch::Tensor TensorFromView(const safetensors::TensorView& view) {
  // from_blob never frees; the mapping is read-only, so the tensor must only be read.
  return torch::from_blob(const_cast<std::byte*>(view.bytes.data()), view.shape,
                          torch::TensorOptions().dtype(TorchDtype(view.dtype)));
}

Status CopyTensorFromView(const safetensors::TensorView& view, torch::Tensor& param,
                          const std::string& source) {
  if (!param.sizes().equals(view.shape)) {
    return DataLossError(source + ": tensor '" + view.name + "' has shape " +
                         safetensors::ShapeString(view.shape) + ", expected " +
                         safetensors::ShapeString({param.sizes().data(), param.sizes().size()}));
  }
  if (!safetensors::IsFloatingPoint(view.dtype)) {
    return DataLossError(source + ": tensor '" + view.name + "' has dtype " +
                         std::string(safetensors::DTypeName(view.dtype)) +
                         ", expected a floating-point type");
  }
  torch::NoGradGuard no_grad;
  param.copy_(TensorFromView(view));
  return Status::Ok();
}

Status LoadWeights(LlamaForCausalLM& model, const safetensors::ShardedCheckpoint& checkpoint,
                   const std::string& source) {
  // Names, shapes and dtypes from the headers, by the rule `llmctl submit` applies too.
  RETURN_IF_ERROR(CheckCheckpointTensors(checkpoint, model->config(), source));
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const safetensors::TensorView* view = checkpoint.Find(name);
    if (view == nullptr) return DataLossError(source + ": tensor '" + name + "' is missing");
    RETURN_IF_ERROR(CopyTensorFromView(*view, item.value(), source));
  }
  return LoadNf4BaseWeights(*model, checkpoint, source);
}

Status LoadNf4BaseWeights(torch::nn::Module& model,
                          const safetensors::ShardedCheckpoint& checkpoint,
                          const std::string& source) {
  for (auto& [module_name, projection] : NamedProjections(model)) {
    if (!projection->is_quantized()) continue;
    const std::string name = module_name + ".weight";
    const safetensors::TensorView* view = checkpoint.Find(name);
    if (view == nullptr) return DataLossError(source + ": tensor '" + name + "' is missing");
    torch::Tensor dense = projection->EmptyDenseWeight();  // (O, I), freed after quantising
    RETURN_IF_ERROR(CopyTensorFromView(*view, dense, source));
    projection->SetBaseWeight(dense);
  }
  return Status::Ok();
}

namespace {

// Either family's model with parameters of `dtype` on `device`: `make` constructs it, then
// init "pretrained" loads `model_dir`'s checkpoint with `load`, init "random" draws Hugging Face's
// initialisation.
template <typename Model>
StatusOr<Model> Build(const std::string& init, const std::string& model_dir, torch::Dtype dtype,
                      torch::Device device, const std::function<Model()>& make,
                      const std::function<Status(Model&, const safetensors::ShardedCheckpoint&)>& load) {
  std::unique_ptr<safetensors::ShardedCheckpoint> checkpoint;
  if (init == "pretrained") {
    ASSIGN_OR_RETURN(checkpoint, safetensors::ShardedCheckpoint::Open(model_dir));
  } else if (init != "random") {
    return InvalidArgumentError("init: expected pretrained or random, got '" + init + "'");
  }
  Model model{nullptr};
  {
    ScopedDefaultDtype default_dtype(dtype);
    model = make();
  }
  if (!device.is_cpu()) model->to(device);
  if (checkpoint) {
    RETURN_IF_ERROR(load(model, *checkpoint));
  } else {
    model->InitializeRandom();
  }
  return model;
}

}  // namespace

void InitializeLikeHuggingFace(torch::nn::Module& model, double std) {
  torch::NoGradGuard no_grad;
  // Module by module, each module's own parameters in registration order: the order
  // named_parameters() visits them, with an NF4 base drawn where its dense "weight" would be
  // (first).
  for (const auto& module : model.named_modules()) {
    auto projection = std::dynamic_pointer_cast<ProjectionImpl>(module.value());
    if (projection && projection->is_quantized()) {
      projection->SetBaseWeight(projection->EmptyDenseWeight().normal_(0.0, std));
    }
    const bool norm =
        std::dynamic_pointer_cast<torch::nn::LayerNormImpl>(module.value()) != nullptr ||
        std::dynamic_pointer_cast<RmsNormImpl>(module.value()) != nullptr;
    for (auto& item : module.value()->named_parameters(/*recurse=*/false)) {
      torch::Tensor& p = item.value();
      if (norm) {
        p.fill_(item.key() == "weight" ? 1.0 : 0.0);
      } else if (item.key() == "bias") {
        p.zero_();
      } else {
        p.normal_(0.0, std);
      }
    }
  }
}

StatusOr<Blip2ForConditionalGeneration> BuildBlip2Model(const Blip2Config& config,
                                                        const std::string& init,
                                                        const std::string& model_dir,
                                                        torch::Dtype dtype, torch::Device device,
                                                        const std::optional<Nf4Options>& nf4) {
  return Build<Blip2ForConditionalGeneration>(
      init, model_dir, dtype, device,
      [&] { return Blip2ForConditionalGeneration(config, nf4); },
      [&](Blip2ForConditionalGeneration& model, const safetensors::ShardedCheckpoint& checkpoint) {
        return LoadBlip2Weights(model, checkpoint, model_dir);
      });
}

StatusOr<LlamaForCausalLM> BuildModel(const ModelConfig& config, const std::string& init,
                                      const std::string& model_dir, torch::Dtype dtype,
                                      torch::Device device, const std::optional<Nf4Options>& nf4) {
  return Build<LlamaForCausalLM>(
      init, model_dir, dtype, device, [&] { return LlamaForCausalLM(config, nf4); },
      [&](LlamaForCausalLM& model, const safetensors::ShardedCheckpoint& checkpoint) {
        return LoadWeights(model, checkpoint, model_dir);
      });
}

}  // namespace llmctl::trainer
