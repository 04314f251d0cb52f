#include "trainer/model/loss.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <utility>

#include "trainer/kernels/fused_ops.h"
#include "trainer/kernels/linear.h"

namespace llmctl::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// What forward hands backward besides tensors; lives in the autograd graph until backward has run.
struct ChunkedLoss : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> logits_of;
  torch::Tensor plain_weight;  // (V, C) when logits_of is exactly linear(h, plain_weight)
  int64_t chunk_tokens = 0;
  bool needs_grad = false;  // grad mode was on and something read needs a gradient
  // The loss' gradients for d(loss) = 1, formed during forward; backward scales them. Under fp16
  // they are the summed loss's instead, and backward scales them by `deferred_scale` too.
  torch::Tensor grad_hidden;                // (N, C), when hidden needs a gradient
  std::vector<torch::Tensor> grad_weights;  // one per trainable weight; undefined when unused
  torch::Tensor deferred_scale;             // () fp32: 1 / the scored tokens (0 for none)
};

// The dtype the head's matmuls run in on `device`: autocast's where it is on, else `own`.
torch::ScalarType ComputeDtype(c10::DeviceType device, torch::ScalarType own) {
  return at::autocast::is_autocast_enabled(device) ? at::autocast::get_autocast_dtype(device) : own;
}

// Whether the chunks form their gradients in fp16 (16-mixed's autocast, or fp16 hidden states),
// whose smallest value, 6e-8, is above a logit's gradient for the mean loss at the start of
// training, about 1 / (vocabulary x scored tokens): 1e-10 at 32,000 x 4,096. The loss scaler's
// factor, which would lift it, reaches the gradients only in backward.
bool FormsInFp16(const torch::Tensor& hidden) {
  return ComputeDtype(hidden.device().type(), hidden.scalar_type()) == torch::kHalf;
}

// logits (n, V), labels (n) -> the summed cross-entropy of the labels that are not -100, in
// float32.
torch::Tensor SummedCrossEntropy(const torch::Tensor& logits, const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(
      logits.to(torch::kFloat32), labels,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
}

// The chunks through autograd (a head with an adapter or an NF4 base): each chunk's
// logits, loss and gradients are formed and dropped before the next chunk's, the gradients for
// d(summed loss) = `grad_scale` (0-dim float32). Adds the chunks' summed losses to `sum`.
void ChunksThroughAutograd(ChunkedLoss& loss, const torch::Tensor& hidden,
                           const torch::Tensor& next_labels, const tensor_list& weights,
                           const torch::Tensor& grad_scale, torch::Tensor& sum) {
  const int64_t tokens = hidden.size(0);
  const bool hidden_grad = hidden.requires_grad();
  for (int64_t start = 0; start < tokens; start += loss.chunk_tokens) {
    const int64_t n = std::min(loss.chunk_tokens, tokens - start);
    tensor_list inputs;
    const torch::Tensor chunk = hidden.narrow(0, start, n).detach();
    if (hidden_grad) inputs.push_back(chunk.requires_grad_(true));
    inputs.insert(inputs.end(), weights.begin(), weights.end());
    torch::Tensor chunk_sum;
    {
      torch::AutoGradMode grad_on(true);
      chunk_sum = SummedCrossEntropy(loss.logits_of(chunk), next_labels.narrow(0, start, n));
    }
    sum.add_(chunk_sum.detach());
    // torch::autograd::grad, not backward: the weights' gradients are returned, not accumulated
    // into .grad once per chunk.
    const tensor_list grads = torch::autograd::grad({chunk_sum}, inputs, {grad_scale},
                                                    /*retain_graph=*/false,
                                                    /*create_graph=*/false, /*allow_unused=*/true);
    size_t next = 0;
    if (hidden_grad) loss.grad_hidden.narrow(0, start, n).copy_(grads[next++]);
    for (size_t i = 0; i < weights.size(); ++i, ++next) {
      const torch::Tensor& g = grads[next];
      if (!g.defined()) continue;
      torch::Tensor& total = loss.grad_weights[i];
      total = total.defined() ? total.add_(g) : g;
    }
  }
}

// The chunks of a plain head, logits = hidden @ W^T: the softmax's gradient is formed in place
// over the chunk's logits, and the weight's gradient accumulates into one (V, C) buffer (through
// autograd, each chunk's would be a second such buffer). Under autocast the matmuls run in its
// dtype, as autocast's linear would run them: the weight is cast once, each chunk's hidden states
// and logits' gradient per chunk, and the gradients come back in the weight's and hidden states'
// dtypes; they are formed for d(summed loss) = `grad_scale` (0-dim float32). Adds the chunks'
// summed losses to `sum`.
void PlainHeadChunks(ChunkedLoss& loss, const torch::Tensor& hidden,
                     const torch::Tensor& next_labels, const torch::Tensor& grad_scale,
                     torch::Tensor& sum) {
  const torch::Tensor& weight = loss.plain_weight;  // (V, C)
  const torch::ScalarType compute = ComputeDtype(hidden.device().type(), weight.scalar_type());
  const torch::Tensor compute_weight = weight.to(compute);  // (V, C); `weight` itself if no cast
  const bool weight_grad = !loss.grad_weights.empty();      // the weight is the one trainable
  const int64_t tokens = hidden.size(0);
  for (int64_t start = 0; start < tokens; start += loss.chunk_tokens) {
    const int64_t n = std::min(loss.chunk_tokens, tokens - start);
    const torch::Tensor chunk = hidden.narrow(0, start, n).to(compute);  // (n, C)
    // (n, V) in the compute dtype: the logits, then in place the loss' gradient.
    torch::Tensor grad_logits = Matmul(chunk, compute_weight.t());
    sum.add_(FusedCrossEntropyGrad(grad_logits, next_labels.narrow(0, start, n), grad_scale).sum());
    if (loss.grad_hidden.defined()) {
      torch::Tensor out = loss.grad_hidden.narrow(0, start, n);
      if (compute == out.scalar_type()) {
        MatmulInto(out, grad_logits, compute_weight);  // (n, C) = (n, V) @ (V, C)
      } else {
        out.copy_(InputGradient(grad_logits, compute_weight));
      }
    }
    if (!weight_grad) continue;
    torch::Tensor& total = loss.grad_weights[0];  // (V, C) in the weight's dtype
    if (!total.defined()) {
      total = Matmul(grad_logits.t(), chunk).to(weight.scalar_type());
    } else if (compute == total.scalar_type()) {
      MatmulInto(total, grad_logits.t(), chunk, /*accumulate=*/true);
    } else {
      total.add_(Matmul(grad_logits.t(), chunk));
    }
  }
}

struct ChunkedCrossEntropy : public torch::autograd::Function<ChunkedCrossEntropy> {
  // hidden (N, C), next_labels (N): the label each position is scored against.
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor hidden,
                               torch::Tensor next_labels, c10::intrusive_ptr<ChunkedLoss> loss,
                               torch::TensorList weights) {
    const torch::Tensor count = next_labels.ne(-100).sum().to(torch::kFloat32);
    torch::Tensor sum = torch::zeros({}, hidden.options().dtype(torch::kFloat32));
    if (!loss->needs_grad) {
      for (int64_t start = 0; start < hidden.size(0); start += loss->chunk_tokens) {
        const int64_t n = std::min(loss->chunk_tokens, hidden.size(0) - start);
        sum.add_(SummedCrossEntropy(loss->logits_of(hidden.narrow(0, start, n)),
                                    next_labels.narrow(0, start, n)));
      }
      return sum.div_(count);
    }
    // The gradients are formed here, chunk by chunk, rather than by recomputing the logits in
    // backward (Liger-Kernel's fused linear cross-entropy): three matmuls per chunk, not four.
    // In fp16 they are formed for the summed loss, whose logits' gradients are a probability each,
    // and backward divides by the count together with the loss scale.
    const torch::Tensor inverse_count = count.reciprocal();
    torch::Tensor form_scale = inverse_count;
    if (FormsInFp16(hidden)) {
      loss->deferred_scale = inverse_count.nan_to_num(0, 0, 0);  // no scored token: no gradient
      form_scale = torch::ones_like(inverse_count);
    }
    if (hidden.requires_grad()) loss->grad_hidden = torch::empty_like(hidden);
    loss->grad_weights.assign(weights.size(), torch::Tensor());
    if (loss->plain_weight.defined()) {
      PlainHeadChunks(*loss, hidden, next_labels, form_scale, sum);
    } else {
      ChunksThroughAutograd(*loss, hidden, next_labels, weights.vec(), form_scale, sum);
    }
    ctx->saved_data["loss"] = c10::IValue::make_capsule(loss);
    return sum.div_(count);
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    auto loss =
        c10::static_intrusive_pointer_cast<ChunkedLoss>(ctx->saved_data["loss"].toCapsule());
    // Scaled in place: the loss is usually the mean itself (a gradient of 1, checked on the CPU
    // where reading it is free) or divided by the accumulation steps.
    const torch::Tensor scale =
        loss->deferred_scale.defined() ? grad_outputs[0] * loss->deferred_scale : grad_outputs[0];
    const bool unit = scale.is_cpu() && scale.item<double>() == 1.0;
    auto scaled = [&](torch::Tensor& g) {
      torch::Tensor out = std::move(g);
      if (out.defined() && !unit) out.mul_(scale);
      return out;
    };
    tensor_list result{scaled(loss->grad_hidden), torch::Tensor(), torch::Tensor()};
    for (torch::Tensor& g : loss->grad_weights) result.push_back(scaled(g));
    return result;
  }
};

}  // namespace

torch::Tensor ChunkedCausalLmLoss(const torch::Tensor& hidden, const torch::Tensor& labels,
                                  std::function<torch::Tensor(const torch::Tensor&)> logits_of,
                                  const std::vector<torch::Tensor>& weights, int64_t chunk_tokens,
                                  const torch::Tensor& plain_weight) {
  // CausalLmLoss's shift: position t is scored against label t+1, the last position against
  // nothing.
  const torch::Tensor next_labels =
      torch::constant_pad_nd(labels.narrow(1, 1, labels.size(1) - 1), {0, 1}, -100);
  return ChunkedCrossEntropyLoss(hidden, next_labels, std::move(logits_of), weights, chunk_tokens,
                                 plain_weight);
}

torch::Tensor ChunkedCrossEntropyLoss(const torch::Tensor& hidden, const torch::Tensor& labels,
                                      std::function<torch::Tensor(const torch::Tensor&)> logits_of,
                                      const std::vector<torch::Tensor>& weights,
                                      int64_t chunk_tokens, const torch::Tensor& plain_weight) {
  TORCH_CHECK(chunk_tokens > 0, "chunk_tokens must be positive, got ", chunk_tokens);
  std::vector<torch::Tensor> trainable;
  for (const torch::Tensor& w : weights) {
    if (w.requires_grad()) trainable.push_back(w);
  }
  TORCH_CHECK(
      !plain_weight.defined() || (plain_weight.requires_grad()
                                      ? trainable.size() == 1 && trainable[0].is_same(plain_weight)
                                      : trainable.empty()),
      "a plain head's weights are its matrix alone, trainable or not");
  auto loss = c10::make_intrusive<ChunkedLoss>();
  loss->logits_of = std::move(logits_of);
  loss->plain_weight = plain_weight;
  loss->chunk_tokens = chunk_tokens;
  loss->needs_grad =
      torch::GradMode::is_enabled() && (hidden.requires_grad() || !trainable.empty());
  return ChunkedCrossEntropy::apply(hidden.reshape({-1, hidden.size(-1)}), labels.reshape({-1}),
                                    std::move(loss), torch::TensorList(trainable));
}

}  // namespace llmctl::trainer
