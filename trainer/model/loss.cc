#include "trainer/model/loss.h"

#include <algorithm>

#include "trainer/model/checkpoint.h"

namespace llmctl::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// What backward needs besides tensors; lives in the autograd graph until backward has run.
struct ChunkedLoss : torch::CustomClassHolder {
  ChunkedLoss(std::function<torch::Tensor(const torch::Tensor&)> f, int64_t chunk)
      : logits_of(std::move(f)), chunk_tokens(chunk), autocast(AutocastSettings::Current()) {}
  std::function<torch::Tensor(const torch::Tensor&)> logits_of;
  int64_t chunk_tokens;
  AutocastSettings autocast;
};

// logits (n, V), labels (n) -> the summed cross-entropy of the labels that are not -100, in
// float32.
torch::Tensor SummedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32), labels,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
}

struct ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
  // hidden (N, C), next_labels (N): the label each position is scored against.
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor hidden,
                               torch::Tensor next_labels, c10::intrusive_ptr<ChunkedLoss> loss,
                               torch::TensorList weights) {
    const int64_t tokens = hidden.size(0);
    torch::Tensor sum = torch::zeros({}, hidden.options().dtype(torch::kFloat32));
    for (int64_t start = 0; start < tokens; start += loss->chunk_tokens) {
      const int64_t n = std::min(loss->chunk_tokens, tokens - start);
      sum.add_(SummedCrossEntropy(loss->logits_of(hidden.narrow(0, start, n)),
                                  next_labels.narrow(0, start, n)));
    }
    const torch::Tensor count = next_labels.ne(-100).sum().to(torch::kFloat32);
    tensor_list saved{hidden, next_labels, count};
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["loss"] = c10::IValue::make_capsule(loss);
    return sum.div_(count);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    const tensor_list saved = ctx->get_saved_variables();
    const torch::Tensor& hidden = saved[0];
    const torch::Tensor& next_labels = saved[1];
    const tensor_list weights(saved.begin() + 3, saved.end());
    auto loss =
        c10::static_intrusive_pointer_cast<ChunkedLoss>(ctx->saved_data["loss"].toCapsule());
    // d(mean)/d(chunk's sum) is the same for every chunk.
    const torch::Tensor grad_sum = grad_outputs[0] / saved[2];

    torch::Tensor grad_hidden = torch::empty_like(hidden);  // (N, C)
    tensor_list grad_weights(weights.size());
    const int64_t tokens = hidden.size(0);
    for (int64_t start = 0; start < tokens; start += loss->chunk_tokens) {
      const int64_t n = std::min(loss->chunk_tokens, tokens - start);
      tensor_list inputs{hidden.narrow(0, start, n).detach().requires_grad_(true)};
      inputs.insert(inputs.end(), weights.begin(), weights.end());
      torch::Tensor chunk_sum;
      {
        torch::AutoGradMode grad_on(true);
        ScopedAutocast autocast(loss->autocast);
        chunk_sum = SummedCrossEntropy(loss->logits_of(inputs[0]), next_labels.narrow(0, start, n));
      }
      // torch::autograd::grad, not backward: the weights' gradients are returned, not accumulated
      // into .grad once per chunk.
      const tensor_list grads =
          torch::autograd::grad({chunk_sum}, inputs, {grad_sum},
                                /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
      grad_hidden.narrow(0, start, n).copy_(grads[0]);
      for (size_t i = 0; i < weights.size(); ++i) {
        const torch::Tensor& g = grads[i + 1];
        if (!g.defined()) continue;
        grad_weights[i] = grad_weights[i].defined() ? grad_weights[i].add_(g) : g;
      }
    }
    tensor_list result{grad_hidden, torch::Tensor(), torch::Tensor()};
    result.insert(result.end(), grad_weights.begin(), grad_weights.end());
    return result;
  }
};

}  // namespace

torch::Tensor ChunkedCausalLmLoss(const torch::Tensor& hidden, const torch::Tensor& labels,
                                  std::function<torch::Tensor(const torch::Tensor&)> logits_of,
                                  const std::vector<torch::Tensor>& weights, int64_t chunk_tokens) {
  // CausalLmLoss's shift: position t is scored against label t+1, the last position against
  // nothing.
  const torch::Tensor next_labels =
      torch::constant_pad_nd(labels.narrow(1, 1, labels.size(1) - 1), {0, 1}, -100);
  return ChunkedCrossEntropyLoss(hidden, next_labels, std::move(logits_of), weights, chunk_tokens);
}

torch::Tensor ChunkedCrossEntropyLoss(const torch::Tensor& hidden, const torch::Tensor& labels,
                                      std::function<torch::Tensor(const torch::Tensor&)> logits_of,
                                      const std::vector<torch::Tensor>& weights,
                                      int64_t chunk_tokens) {
  TORCH_CHECK(chunk_tokens > 0, "chunk_tokens must be positive, got ", chunk_tokens);
  std::vector<torch::Tensor> trainable;
  for (const torch::Tensor& w : weights) {
    if (w.requires_grad()) trainable.push_back(w);
  }
  return ChunkedCrossEntropy::apply(
      hidden.reshape({-1, hidden.size(-1)}), labels.reshape({-1}),
      c10::make_intrusive<ChunkedLoss>(std::move(logits_of), chunk_tokens),
      torch::TensorList(trainable));
}

}  // namespace llmctl::trainer
