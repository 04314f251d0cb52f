#include "common/estimate/step_memory.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "common/byte_size.h"
#include "common/estimate/chunked_loss.h"
#include "common/estimate/llama_trace.h"
#include "common/estimate/trace.h"

namespace llmctl::estimate {
namespace {

using llama::AutocastScope;
using llama::DescribeForward;
using llama::Forward;
using llama::kStageNames;
using llama::LayerStage;
using llama::LlamaForwardTrace;
using llama::StageBytes;
using llama::TraceLlamaForward;
using enum llama::LayerStage;

// trainer/train/adamw_8bit.h: the ATen path (CUDA's) updates 8-bit parameters in chunks of this
// many elements, with temporaries of 25 bytes an element for an fp32 parameter and 33 for bf16
// (measured by adamw_8bit_test's counting allocator; 5.05 GiB over a 13B embedding on an H200,
// unchunked).
constexpr int64_t kAdamW8bitAtenChunk = int64_t{1} << 22;

// A decoder layer's projections (trainer/model/llama.cc), each with the stage that runs it.
struct StageProjection {
  LayerStage stage;
  std::string_view name;
  int64_t in;
  int64_t out;
  bool bias;
};

std::array<StageProjection, 7> LayerProjections(const Forward& f, const ModelConfig& model) {
  const int64_t q_width = f.heads * f.head_dim;
  const int64_t kv_width = f.kv_heads * f.head_dim;
  return {{{kQkv, "q_proj", f.hidden, q_width, model.attention_qkv_bias},
           {kQkv, "k_proj", f.hidden, kv_width, model.attention_qkv_bias},
           {kQkv, "v_proj", f.hidden, kv_width, model.attention_qkv_bias},
           {kOutput, "o_proj", q_width, f.hidden, model.attention_output_bias},
           {kGateUp, "gate_proj", f.hidden, f.inter, model.mlp_bias},
           {kGateUp, "up_proj", f.hidden, f.inter, model.mlp_bias},
           {kDown, "down_proj", f.inter, f.hidden, model.mlp_bias}}};
}

// A layer's gradients (`layer_bytes`, one rank's) split over the stages that form them, in
// proportion to the trained values of each: the projections' weights and biases and the norms' in
// a full fine-tune, the targeted projections' adapters under LoRA and QLoRA.
StageBytes LayerGradientsByStage(uint64_t layer_bytes, const Forward& f, const ModelConfig& model) {
  StageBytes values{};
  for (const StageProjection& p : LayerProjections(f, model)) {
    if (f.full) {
      values[p.stage] += static_cast<uint64_t>(p.in * p.out + (p.bias ? p.out : 0));
    } else if (f.Targeted(p.name)) {
      values[p.stage] += static_cast<uint64_t>(f.rank * (p.in + p.out));
    }
  }
  if (f.full) values[kNorm1] = values[kNorm2] = static_cast<uint64_t>(f.hidden);
  const uint64_t total = std::accumulate(values.begin(), values.end(), uint64_t{0});
  StageBytes bytes{};
  if (total == 0) {
    bytes[kQkv] = layer_bytes;
    return bytes;
  }
  uint64_t assigned = 0;
  for (size_t s = 0; s < kLayerStages; ++s) {
    // layer_bytes x values / total without overflow: values and total are below 2^32.
    bytes[s] = layer_bytes / total * values[s] + layer_bytes % total * values[s] / total;
    assigned += bytes[s];
  }
  bytes[kQkv] += layer_bytes - assigned;  // the rounding's few bytes
  return bytes;
}

// The largest weight gradient each stage forms, in `param` bytes an element: where gradients are
// held from an earlier micro-batch, autograd forms each new one apart and then adds it to the
// held one (measured: a (C, I) bf16 temporary in down_proj's backward).
StageBytes LargestWeightGradients(const Forward& f, const ModelConfig& model, uint64_t param) {
  StageBytes bytes{};
  for (const StageProjection& p : LayerProjections(f, model)) {
    const int64_t trained = f.full               ? p.in * p.out
                            : f.Targeted(p.name) ? f.rank * std::max(p.in, p.out)
                                                 : 0;
    bytes[p.stage] = std::max(bytes[p.stage], static_cast<uint64_t>(trained) * param);
  }
  if (f.full) bytes[kNorm1] = bytes[kNorm2] = static_cast<uint64_t>(f.hidden) * param;
  return bytes;
}

// QLoRA's matmuls dequantise their NF4 weight whole, in the compute dtype, forward and backward
// (trainer/quant's DequantizeNf4), one projection at a time: the largest of each stage's.
StageBytes DequantisedWeights(const Forward& f, const ModelConfig& model) {
  StageBytes bytes{};
  if (!f.qlora) return bytes;
  for (const StageProjection& p : LayerProjections(f, model)) {
    bytes[p.stage] = std::max(
        bytes[p.stage], static_cast<uint64_t>(p.in * p.out) * static_cast<uint64_t>(f.compute));
  }
  return bytes;
}

// What each stage's backward allocates beyond the gradient flowing down the residual stream:
// the gradients of its inputs and of what it recomputes.
StageBytes StageTemporaries(const Forward& f) {
  const uint64_t n = static_cast<uint64_t>(f.tokens);
  // An activation's gradient: in 2 bytes where autocast computed it, else the stream's dtype.
  const uint64_t grad = static_cast<uint64_t>(f.autocast ? 2 : f.act);
  const uint64_t stream = n * static_cast<uint64_t>(f.hidden) * static_cast<uint64_t>(f.act);
  const uint64_t q_width = static_cast<uint64_t>(f.heads * f.head_dim);
  const uint64_t kv_width = static_cast<uint64_t>(f.kv_heads * f.head_dim);
  const uint64_t mlp = n * static_cast<uint64_t>(f.inter) * grad;  // (B, T, I)
  // RmsNorm's backward in float32: the normalised input's gradient and its reduction.
  const uint64_t norm = 2 * n * static_cast<uint64_t>(f.hidden) * 4;
  StageBytes t{};
  t[kDown] = mlp;  // the product's gradient
  // the product's gradient with gate's and up's formed from it (the ATen composition's silu
  // backward then trades silu's for gate's; FusedSwiGlu forms both at once)
  t[kActivation] = 3 * mlp;
  t[kGateUp] = 2 * mlp + stream;  // gate's and up's, and the input's they sum into
  t[kNorm2] = norm;
  t[kOutput] = n * q_width * grad;                          // the attention output's gradient
  t[kAttention] = n * (2 * q_width + 2 * kv_width) * grad;  // SDPA's: output's, q's, k's, v's
  t[kQkv] = n * (q_width + 2 * kv_width) * grad + stream;   // q's, k's, v's, and the input's
  t[kNorm1] = norm;
  return t;
}

// What the step's moments are made of, besides the forward's trace.
struct LlamaMoments {
  const Forward& f;
  const ModelConfig& model;
  const ModelStateEstimate& state;
  const LlamaForwardTrace& forward;
  bool sharded = false;
  bool holds_grads = false;
  bool reshard = false;
  int64_t accumulation = 1;
  uint64_t param = 4;
  uint64_t base = 0;            // the state held throughout
  std::string state_text = {};  // how `base` is described
  // fsdp, in the dtype the layers compute in: the root unit stays gathered through forward and
  // backward. With reshard_after_forward every layer is freed after its forward, so none is left
  // at the loss, and in backward layer i computes while layer i - 1's all-gather is in flight
  // (the prefetch): two layers at once, one at layer 0. Without it the layers stay gathered from
  // their forward until their gradients are reduced: all of them at the loss, layers 0..i at
  // layer i.
  uint64_t root_gathered = 0;
  uint64_t layer_gathered = 0;
  uint64_t grad_stream = 0;    // the hidden states' gradient (B, T, C)
  uint64_t head_produced = 0;  // the gradients the output head makes
  uint64_t grad_per_layer = 0;
  StageBytes dequantised{};  // QLoRA's weights dequantised, per stage

  uint64_t GatheredAtLayer(int64_t i) const {
    const uint64_t held = reshard ? std::min<uint64_t>(2, static_cast<uint64_t>(i) + 1)
                                  : static_cast<uint64_t>(i) + 1;
    return root_gathered + held * layer_gathered;
  }
  uint64_t GatheredAtLoss() const {
    const uint64_t layers_total =
        static_cast<uint64_t>(std::max<int64_t>(model.num_hidden_layers, 0));
    return root_gathered + (reshard ? 0 : layers_total * layer_gathered);
  }
  uint64_t GradsAfter(uint64_t produced) const {
    return accumulation > 1 || !holds_grads ? 0 : std::min(produced, state.grads_bytes);
  }
};

// The forward at the loss, the largest NF4 weight dequantised, the loss' backward and the trained
// output head's.
void ConsiderLossMoments(const LlamaMoments& m, uint64_t activation_bytes, PeakMoment& peak) {
  const LlamaForwardTrace& t = m.forward;
  const uint64_t at_loss = m.GatheredAtLoss();
  // The chunked loss' moment may hold the buffer of a head product running then.
  const uint64_t buffer = t.forward_buffer;
  peak.Consider(
      m.base + at_loss + activation_bytes + t.forward_transient, "forward",
      "forward, at the loss: " + m.state_text + GatheredUnitsText(at_loss) + " + activations " +
          FormatBytes(activation_bytes) + " + logits " + FormatBytes(t.forward_transient - buffer) +
          (buffer > 0
               ? " + the head GEMM's buffers " + FormatBytes(buffer) + " (measured by the probe)"
               : std::string()));
  const uint64_t largest_dequantised =
      *std::max_element(m.dequantised.begin(), m.dequantised.end());
  if (largest_dequantised > 0) {
    // The last layer's largest NF4 weight, dequantised beside (nearly) every saved activation.
    const uint64_t gathered = m.sharded ? m.GatheredAtLayer(m.model.num_hidden_layers - 1) : 0;
    peak.Consider(m.base + gathered + t.layers_saved + t.fixed + largest_dequantised, "forward",
                  "forward, the last layer's largest NF4 weight dequantised: " + m.state_text +
                      GatheredUnitsText(gathered) + " + activations " +
                      FormatBytes(t.layers_saved + t.fixed) + " + the dequantised weight " +
                      FormatBytes(largest_dequantised));
  }
  peak.Consider(m.base + at_loss + activation_bytes + t.loss_backward, "backward",
                "backward, at the loss: " + m.state_text + GatheredUnitsText(at_loss) +
                    " + activations " + FormatBytes(activation_bytes) + " + the loss' gradients " +
                    FormatBytes(t.loss_backward));
  if (t.logits_grad > 0 && t.head_grad > 0) {
    // The trained head's backward: where gradients are held from an earlier micro-batch its
    // weight's gradient is formed apart, then added (measured: a (V, C) bf16 tensor beside the
    // logits' gradient in the cpu-lab adam-8bit row).
    const uint64_t formed_apart =
        m.accumulation > 1 && m.holds_grads && !m.sharded ? t.head_grad : 0;
    const uint64_t alive = activation_bytes - t.head_log_softmax;
    peak.Consider(m.base + at_loss + m.GradsAfter(m.head_produced) + alive + t.logits_grad +
                      formed_apart + m.grad_stream,
                  "backward",
                  "backward, the output head: " + m.state_text + GatheredUnitsText(at_loss) +
                      " + gradients " + FormatBytes(m.GradsAfter(m.head_produced) + formed_apart) +
                      " + activations left " + FormatBytes(alive) + " + the logits' gradient " +
                      FormatBytes(t.logits_grad) + " + the hidden states' " +
                      FormatBytes(m.grad_stream));
  }
}

// Each layer stage's temporaries in backward, besides the hidden states' gradient.
StageBytes LayerBackwardTemporaries(const LlamaMoments& m) {
  const Forward& f = m.f;
  StageBytes stage_temporaries = StageTemporaries(f);
  if (m.accumulation > 1 && m.holds_grads && !m.sharded) {
    const StageBytes formed_apart = LargestWeightGradients(f, m.model, m.param);
    for (size_t s = 0; s < kLayerStages; ++s) stage_temporaries[s] += formed_apart[s];
  }
  for (size_t s = 0; s < kLayerStages; ++s) stage_temporaries[s] += m.dequantised[s];
  if (f.swiglu_linear && (m.sharded || !m.holds_grads || m.accumulation > 1)) {
    // FusedSwiGluLinear returns down_proj's weight gradient with gate's and up's, so it is alive
    // through the activation's backward wherever it is not simply the held gradient: formed apart
    // to be added, moved to the host or reduce-scattered after.
    const uint64_t element = m.sharded ? static_cast<uint64_t>(f.act) : m.param;
    stage_temporaries[kActivation] += static_cast<uint64_t>(f.inter * f.hidden) * element;
  }
  return stage_temporaries;
}

// Layer by layer from the last, stage by stage: each stage's gradients made and its saved tensors
// freed. `root_head_grad` waits in the root unit throughout.
void WalkLayersBackward(const LlamaMoments& m, uint64_t root_head_grad, PeakMoment& peak) {
  const LlamaForwardTrace& t = m.forward;
  const StageBytes stage_grads = LayerGradientsByStage(m.grad_per_layer, m.f, m.model);
  const StageBytes stage_temporaries = LayerBackwardTemporaries(m);
  uint64_t produced = m.head_produced;
  uint64_t remaining = t.layers_saved + t.fixed;
  for (int64_t i = m.model.num_hidden_layers - 1; i >= 0; --i) {
    const StageBytes& stages = t.layer_stages[static_cast<size_t>(i)];
    // The layers before this one keep theirs; with checkpointing this layer's input too, until
    // its rerun's backward is done.
    const uint64_t before =
        m.f.checkpointing ? remaining : remaining - t.layer_saved[static_cast<size_t>(i)];
    const uint64_t gathered = m.sharded ? m.GatheredAtLayer(i) : 0;
    uint64_t alive = std::accumulate(stages.begin(), stages.end(), uint64_t{0});
    for (size_t s = kLayerStages; s-- > 0;) {
      produced += stage_grads[s];
      const uint64_t temporaries = m.grad_stream + stage_temporaries[s];
      const uint64_t bytes = m.base + gathered + root_head_grad + m.GradsAfter(produced) + before +
                             alive + temporaries;
      if (bytes > peak.bytes) {
        peak.Consider(bytes, "backward",
                      "backward, layer " + std::to_string(i) + " " + kStageNames[s] + ": " +
                          m.state_text + GatheredUnitsText(gathered) + " + gradients " +
                          FormatBytes(root_head_grad + m.GradsAfter(produced)) +
                          " + activations left " + FormatBytes(before + alive) + " + temporaries " +
                          FormatBytes(temporaries));
      }
      alive -= stages[s];
    }
    remaining -= t.layer_saved[static_cast<size_t>(i)];
  }
}

// 8-bit AdamW's ATen path (CUDA) allocates one chunk's temporaries during the step; the fused CPU
// kernel none.
uint64_t OptimizerStepTransient(const TrialSettings& s, const Forward& f,
                                const ModelConfig& model) {
  if (!f.cuda || s.train.optimizer != trial::Optimizer::kAdamw8bit) return 0;
  const int64_t largest =
      std::max({model.vocab_size * model.hidden_size, model.intermediate_size * model.hidden_size,
                f.heads * f.head_dim * model.hidden_size});
  return static_cast<uint64_t>(std::min(largest, kAdamW8bitAtenChunk)) *
         (s.memory.precision == trial::Precision::kBf16True ? 33 : 25);
}

// The layers' backward, then the embedding's and the optimizer step.
void ConsiderBackwardAndStep(const LlamaMoments& m, const TrialSettings& s, bool first_step_only,
                             PeakMoment& peak) {
  const LlamaForwardTrace& t = m.forward;
  const uint64_t all_grads = m.state.grads_bytes;
  // Under fsdp the trained head's full gradient, in the gathered dtype, waits in the root unit
  // until the root's reduce-scatter, after the embedding's backward (measured on the demo's tied
  // head: 1 MiB through every layer's backward).
  const uint64_t root_head_grad =
      m.sharded && m.f.full
          ? static_cast<uint64_t>(m.f.act) * static_cast<uint64_t>(m.f.vocab * m.f.hidden)
          : 0;
  WalkLayersBackward(m, root_head_grad, peak);
  // A tied embedding: the output head's part of its gradient waits in autograd's buffer for the
  // embedding's own part, and the buffer sums the two, the chunked loss's part in place, the plain
  // loss's into a third tensor (measured on SmolLM-135M's shape, V x C = 113 MB in fp32: 2 x 113 MB
  // above the gradients with the plain loss, 1 x with the chunked one); with accumulation the sum
  // is then added to the held gradient.
  const uint64_t tied_parts =
      m.model.tie_word_embeddings && t.head_grad > 0 && !m.sharded
          ? t.head_grad * ((m.f.chunked_loss ? 1 : 2) + (m.accumulation > 1 ? 1 : 0))
          : 0;
  peak.Consider(m.base + m.root_gathered + root_head_grad + m.GradsAfter(all_grads) + tied_parts +
                    t.fixed + m.grad_stream,
                "backward",
                "backward, at the embedding: " + m.state_text + GatheredUnitsText(m.root_gathered) +
                    " + gradients " + FormatBytes(root_head_grad + m.GradsAfter(all_grads)) +
                    (tied_parts > 0 ? " + the tied embedding's two parts " + FormatBytes(tied_parts)
                                    : std::string()) +
                    " + " + FormatBytes(t.fixed + m.grad_stream));
  const uint64_t step_transient = OptimizerStepTransient(s, m.f, m.model);
  const uint64_t optimizer_state = first_step_only ? m.state.optim_device_bytes : 0;
  peak.Consider(
      m.base + (m.accumulation > 1 ? 0 : all_grads) + optimizer_state + step_transient,
      "optimizer step",
      step_transient > 0
          ? "optimizer step: params, gradients and optimizer state + 8-bit AdamW's chunk " +
                FormatBytes(step_transient)
          : "optimizer step: params, gradients and optimizer state");
}

// --explain's lines for the activations and the peak (the model state's are the CLI's).
std::vector<EstimateTerm> LlamaTerms(const TrialSettings& s, const Forward& f,
                                     const LlamaForwardTrace& t, const PeakMoment& peak) {
  const std::vector<uint64_t>& layer_saved = t.layer_saved;
  const int64_t layers = static_cast<int64_t>(layer_saved.size());
  std::string layer_text;
  if (layers > 0) {
    const bool uniform = std::all_of(layer_saved.begin() + 1, layer_saved.end(),
                                     [&](uint64_t b) { return b == layer_saved.back(); });
    layer_text = uniform && layer_saved.front() == layer_saved.back()
                     ? std::to_string(layers) + " x " + FormatBytes(layer_saved.back())
                     : "layer 0 " + FormatBytes(layer_saved.front()) + " + " +
                           std::to_string(layers - 1) + " x " + FormatBytes(layer_saved.back());
    layer_text += f.checkpointing ? " (each layer's input only; backward reruns a layer, " +
                                        FormatBytes(t.layer_recompute) + ")"
                                  : "";
  }
  return {
      {"activations: layers",
       layer_text + ", for " + GroupedCount(f.tokens) + " tokens (" +
           std::to_string(s.train.micro_batch_size) + " x " + std::to_string(f.seq) + ")",
       t.layers_saved},
      {"activations: head",
       f.chunked_loss ? "final norm, the hidden states' gradient from the chunked loss"
                      : "final norm, output head, log-softmax (" + GroupedCount(f.tokens) + " x " +
                            GroupedCount(f.vocab) + " x 4 B)",
       t.head_saved},
      {"activations: ids", "token ids and labels (3 x 8 B per token), RoPE tables", t.fixed},
      {"peak", peak.moment, peak.bytes},
  };
}

}  // namespace

StatusOr<StepMemoryEstimate> EstimateStepMemory(const TrialConfig& config, const ModelConfig& model,
                                                const MatmulBuffers& buffers) {
  StepMemoryEstimate estimate;
  ASSIGN_OR_RETURN(estimate.state, EstimateModelState(config, model));
  const ModelStateEstimate& state = estimate.state;
  const TrialSettings& s = config.settings();
  Forward f = DescribeForward(config, model, state);
  if (f.chunked_loss) {
    f.head_buffers =
        ChunkedLossBuffers(buffers, s.memory.precision, f.autocast || f.act == 2, f.vocab);
  }
  estimate.tokens = f.tokens;
  const bool sharded = state.fsdp_root_values > 0;
  // The parameters' element (fp32 master weights under mixed).
  const uint64_t param = s.memory.precision == trial::Precision::kBf16True ? 2 : 4;
  const LlamaForwardTrace forward = TraceLlamaForward(f, model, AutocastScope(s), sharded, param);
  estimate.activation_bytes = forward.layers_saved + forward.head_saved + forward.fixed;

  // --- The moments of the step. The steady state is a step after the first: the optimizer's
  // state exists during forward and backward. With accumulation the gradients do from the second
  // micro-batch on.
  const bool first_step_only = s.train.max_steps == 1;
  LlamaMoments m{.f = f, .model = model, .state = state, .forward = forward};
  m.sharded = sharded;
  m.holds_grads = state.grads_bytes > 0;
  m.reshard = s.parallel.fsdp_reshard_after_forward;
  m.accumulation = s.train.global_batch_size / (s.train.micro_batch_size * state.world_size);
  m.param = param;
  m.base = state.params_bytes + state.comm_bytes + (first_step_only ? 0 : state.optim_device_bytes);
  m.root_gathered = static_cast<uint64_t>(state.fsdp_root_values) * static_cast<uint64_t>(f.act) +
                    static_cast<uint64_t>(state.fsdp_root_buffer_bytes);
  m.layer_gathered = static_cast<uint64_t>(state.fsdp_layer_values) * static_cast<uint64_t>(f.act) +
                     static_cast<uint64_t>(state.fsdp_layer_buffer_bytes);
  const uint64_t all_grads = state.grads_bytes;
  const uint64_t layer_count = static_cast<uint64_t>(std::max<int64_t>(model.num_hidden_layers, 1));
  // One rank's gradients as backward makes them: the output head's first, then each layer's, the
  // embedding's last (a tied embedding's adds to the head's). Under fsdp every unit's shard is
  // reduce-scattered from the flat buffer counted in comm, so only shards accumulate.
  m.head_produced = sharded ? 0 : std::min(forward.head_grad, all_grads);
  const uint64_t embedding_grad = sharded || model.tie_word_embeddings ? 0 : forward.head_grad;
  m.grad_per_layer =
      (all_grads - std::min(all_grads, m.head_produced + embedding_grad)) / layer_count;
  if (m.accumulation > 1 && m.holds_grads) m.base += all_grads;
  m.grad_stream = static_cast<uint64_t>(f.tokens) * static_cast<uint64_t>(f.hidden) * f.act;
  m.dequantised = DequantisedWeights(f, model);
  // What forward and backward run on: the model state and, under fsdp, the gathered units.
  m.state_text = "params";
  if (!first_step_only && state.optim_device_bytes > 0) m.state_text += " + optimizer state";
  if (m.accumulation > 1 && m.holds_grads) m.state_text += " + gradients";
  if (state.comm_bytes > 0) m.state_text += " + comm buffers";
  m.state_text += " " + FormatBytes(m.base);

  PeakMoment peak;
  ConsiderLossMoments(m, estimate.activation_bytes, peak);
  ConsiderBackwardAndStep(m, s, first_step_only, peak);
  estimate.peak_bytes = peak.bytes;
  estimate.peak_phase = peak.phase;
  estimate.terms = LlamaTerms(s, f, forward, peak);
  return estimate;
}

}  // namespace llmctl::estimate
