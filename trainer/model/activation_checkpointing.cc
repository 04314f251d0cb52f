#include "trainer/model/activation_checkpointing.h"

#include <ATen/autocast_mode.h>

#include <mutex>
#include <optional>
#include <vector>

namespace llmctl::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Keeps the block alive in the autograd graph until backward has run (or the graph is freed).
struct RecomputeHolder : torch::CustomClassHolder {
  explicit RecomputeHolder(BlockOfInputs f) : block(std::move(f)) {}
  BlockOfInputs block;
};

// The default generators a block's random ops draw from: the CPU's always, and the input's device's
// (PyTorch's checkpoint preserves the same: its preserve_rng_state).
std::vector<at::Generator> Generators(const torch::Device& device) {
  std::vector<at::Generator> generators = {at::globalContext().defaultGenerator(torch::kCPU)};
  if (!device.is_cpu()) generators.push_back(at::globalContext().defaultGenerator(device));
  return generators;
}

// Every input reaches the rerun as a leaf, so their gradients come back through this node and never
// through a captured tensor's own graph.
struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static torch::Tensor forward(AutogradContext* ctx, torch::TensorList inputs,
                               c10::intrusive_ptr<RecomputeHolder> holder) {
    ctx->save_for_backward(inputs.vec());
    const AutocastSettings autocast = AutocastSettings::Current();
    ctx->saved_data["cpu_autocast"] = autocast.cpu_enabled;
    ctx->saved_data["cpu_dtype"] = static_cast<int64_t>(autocast.cpu_dtype);
    ctx->saved_data["cuda_autocast"] = autocast.cuda_enabled;
    ctx->saved_data["cuda_dtype"] = static_cast<int64_t>(autocast.cuda_dtype);
    ctx->saved_data["block"] = c10::IValue::make_capsule(holder);
    // The rerun draws the same random numbers (dropout's masks) as this forward.
    std::vector<torch::Tensor> rng_states;
    for (at::Generator& generator : Generators(inputs[0].device())) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      rng_states.push_back(generator.get_state());
    }
    ctx->saved_data["rng_states"] = rng_states;
    torch::NoGradGuard no_grad;
    return holder->block(inputs.vec());
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const tensor_list saved = ctx->get_saved_variables();
    auto holder =
        c10::static_intrusive_pointer_cast<RecomputeHolder>(ctx->saved_data["block"].toCapsule());
    const AutocastSettings autocast{
        ctx->saved_data["cpu_autocast"].toBool(),
        static_cast<at::ScalarType>(ctx->saved_data["cpu_dtype"].toInt()),
        ctx->saved_data["cuda_autocast"].toBool(),
        static_cast<at::ScalarType>(ctx->saved_data["cuda_dtype"].toInt())};
    // The first input (the residual stream) always reruns as needing a gradient, so the block's
    // parameters get theirs even when nothing upstream does; the others as they were.
    std::vector<torch::Tensor> inputs;
    for (size_t i = 0; i < saved.size(); ++i) {
      inputs.push_back(saved[i].detach().requires_grad_(i == 0 || saved[i].requires_grad()));
    }
    torch::Tensor output;
    {
      // Forks the generators: the forward's states for the rerun, the current ones back after.
      std::vector<at::Generator> generators = Generators(inputs[0].device());
      const std::vector<torch::Tensor> forward_states =
          ctx->saved_data["rng_states"].toTensorVector();
      std::vector<torch::Tensor> current_states;
      for (size_t i = 0; i < generators.size(); ++i) {
        std::lock_guard<std::mutex> lock(generators[i].mutex());
        current_states.push_back(generators[i].get_state());
        generators[i].set_state(forward_states[i]);
      }
      {
        torch::AutoGradMode grad_on(true);
        ScopedAutocast scoped(autocast);
        output = holder->block(inputs);
      }
      for (size_t i = 0; i < generators.size(); ++i) {
        std::lock_guard<std::mutex> lock(generators[i].mutex());
        generators[i].set_state(current_states[i]);
      }
    }
    torch::autograd::backward({output}, {grad_outputs[0]});
    tensor_list grads;
    for (const torch::Tensor& input : inputs) grads.push_back(input.grad());
    grads.emplace_back();  // the holder
    return grads;
  }
};

}  // namespace

AutocastSettings AutocastSettings::Current() {
  return {at::autocast::is_autocast_enabled(at::kCPU), at::autocast::get_autocast_dtype(at::kCPU),
          at::autocast::is_autocast_enabled(at::kCUDA),
          at::autocast::get_autocast_dtype(at::kCUDA)};
}

void AutocastSettings::Apply() const {
  at::autocast::set_autocast_enabled(at::kCPU, cpu_enabled);
  at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
  at::autocast::set_autocast_enabled(at::kCUDA, cuda_enabled);
  at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
}

ScopedAutocast::ScopedAutocast(const AutocastSettings& settings)
    : previous_(AutocastSettings::Current()) {
  settings.Apply();
}

ScopedAutocast::~ScopedAutocast() { previous_.Apply(); }

torch::Tensor CheckpointedForward(std::function<torch::Tensor(const torch::Tensor&)> block,
                                  const torch::Tensor& input) {
  return CheckpointedForward(
      [block = std::move(block)](const std::vector<torch::Tensor>& x) { return block(x[0]); },
      {input});
}

torch::Tensor CheckpointedForward(
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> block,
    const torch::Tensor& input, const torch::Tensor& context) {
  return CheckpointedForward(
      [block = std::move(block)](const std::vector<torch::Tensor>& x) { return block(x[0], x[1]); },
      {input, context});
}

torch::Tensor CheckpointedForward(BlockOfInputs block, const std::vector<torch::Tensor>& inputs) {
  return CheckpointFunction::apply(torch::TensorList(inputs),
                                   c10::make_intrusive<RecomputeHolder>(std::move(block)));
}

}  // namespace llmctl::trainer
