#include "trainer/train/probe_layer_elementwise.h"

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/estimate/reference_step.h"
#include "common/model_config.h"
#include "trainer/kernels/fused_ops.h"

namespace llmctl::trainer {
namespace {

// The residual stream's dtype and the projections' outputs', as a precision runs a layer:
// 32-true, bf16-true, and autocast (fp32 stream and norms, bf16 projections).
struct LayerDtypes {
  const char* stream;
  const char* projected;
};
constexpr LayerDtypes kLayerDtypes[] = {{"fp32", "fp32"}, {"bf16", "bf16"}, {"fp32", "bf16"}};

// The sequences a cell's tokens are split into: a micro-batch's rows.
constexpr int64_t kLayerRows = 2;

// A layer's element-wise ops from their inputs, leaves each, to their outputs, and a gradient for
// each output: one call is the forward and the backward through every leaf.
struct LayerOps {
  Kernels kernels = Kernels::kAten;
  double eps = 0;
  torch::Tensor x;                   // (B, T, C) the residual stream
  torch::Tensor attention_out;       // (B, T, C) o_proj's output
  torch::Tensor mlp_out;             // (B, T, C) down_proj's output
  torch::Tensor q, k;                // (B, T, H, D), (B, T, K, D) the projections' layout
  torch::Tensor attention;           // (B, H, T, D) SDPA's output
  torch::Tensor gate, up;            // (B, T, I)
  torch::Tensor norm1, norm2;        // (C,) the norms' weights
  torch::Tensor cos, sin;            // (T, D) fp32 rotary tables
  std::vector<torch::Tensor> grads;  // one a Forward output

  std::vector<torch::Tensor> Forward() const {
    const torch::Tensor q_rotated = RopeToHeadsWith(kernels, q, cos, sin);  // (B, H, T, D)
    const torch::Tensor k_rotated = RopeToHeadsWith(kernels, k, cos, sin);  // (B, K, T, D)
    const int64_t batch = x.size(0), seq = x.size(1);
    const torch::Tensor merged = attention.transpose(1, 2).reshape({batch, seq, -1});  // (B, T, HD)
    const torch::Tensor h = x + attention_out;
    const torch::Tensor activated =
        kernels == Kernels::kFused ? FusedSwiGlu(gate, up) : torch::silu(gate) * up;
    return {RmsNormWith(kernels, x, norm1, eps), q_rotated, k_rotated, merged, h + mlp_out,
            RmsNormWith(kernels, h, norm2, eps), activated};
  }

  void ForwardAndBackward() const {
    // Whatever mode the probe's other cells run in: this one's backward needs the graph.
    const torch::AutoGradMode grad_mode(true);
    (void)torch::autograd::grad(
        Forward(), {x, attention_out, mlp_out, q, k, attention, gate, up, norm1, norm2}, grads);
  }
};

LayerOps MakeLayerOps(const ModelConfig& model, int64_t tokens, const LayerDtypes& dtypes,
                      Kernels kernels) {
  const int64_t batch = kLayerRows, seq = tokens / kLayerRows;
  const int64_t hidden = model.hidden_size, heads = model.num_attention_heads,
                kv_heads = model.num_key_value_heads, head_dim = model.head_dim;
  const auto stream = torch::TensorOptions().dtype(ProbeDtype(dtypes.stream)).requires_grad(true);
  const auto projected =
      torch::TensorOptions().dtype(ProbeDtype(dtypes.projected)).requires_grad(true);
  LayerOps ops;
  ops.kernels = kernels;
  ops.eps = model.rms_norm_eps;
  ops.x = ProbeOperand({batch, seq, hidden}, stream);
  ops.attention_out = ProbeOperand({batch, seq, hidden}, projected);
  ops.mlp_out = ProbeOperand({batch, seq, hidden}, projected);
  ops.q = ProbeOperand({batch, seq, heads, head_dim}, projected);
  ops.k = ProbeOperand({batch, seq, kv_heads, head_dim}, projected);
  ops.attention = ProbeOperand({batch, heads, seq, head_dim}, projected);
  ops.gate = ProbeOperand({batch, seq, model.intermediate_size}, projected);
  ops.up = ProbeOperand({batch, seq, model.intermediate_size}, projected);
  // The norms' weights are parameters, in the stream's dtype (autocast's are fp32 masters).
  ops.norm1 = torch::ones({hidden}, stream);
  ops.norm2 = torch::ones({hidden}, stream);
  const torch::Tensor angles = torch::rand({seq, head_dim}, torch::kFloat32);
  ops.cos = angles.cos();
  ops.sin = angles.sin();
  const torch::AutoGradMode grad_mode(true);
  for (const torch::Tensor& out : ops.Forward())
    ops.grads.push_back(ProbeOperand(out.sizes(), out.options()));
  return ops;
}

}  // namespace

void AddLayerElementwise(ProbeRounds& rounds, estimate::RateProbe& probe) {
  const ModelConfig model = estimate::ReferenceModel();
  for (const LayerDtypes& dtypes : kLayerDtypes) {
    for (const Kernels kernels : {Kernels::kAten, Kernels::kFused}) {
      for (const int64_t tokens : estimate::kProbeLayerTokens) {
        const LayerOps ops = MakeLayerOps(model, tokens, dtypes, kernels);
        const size_t row = probe.layer_elementwise.size();
        probe.layer_elementwise.push_back({.stream = dtypes.stream,
                                           .projected = dtypes.projected,
                                           .kernels = kernels == Kernels::kFused ? "fused" : "aten",
                                           .tokens = tokens,
                                           .hidden = model.hidden_size,
                                           .q_width = model.num_attention_heads * model.head_dim,
                                           .kv_width = model.num_key_value_heads * model.head_dim,
                                           .inter = model.intermediate_size});
        rounds.Add(
            [ops] { ops.ForwardAndBackward(); },
            [&probe, row](double seconds) { probe.layer_elementwise[row].seconds = seconds; });
      }
    }
  }
}

}  // namespace llmctl::trainer
