#include "common/estimate/llama_trace.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "common/estimate/chunked_loss.h"
#include "common/estimate/trace.h"

namespace llmctl::estimate::llama {
namespace {

constexpr uint64_t kTokenIdBytes = 8;  // int64 token ids

using Value = TracedTensor;

// The forward's saved tensors, each storage once, as a snapshot counts them.
class Trace {
 public:
  explicit Trace(const Forward& f) : f_(f) {}

  // A new tensor of `per_token` elements for each of the micro-batch's tokens.
  Value PerToken(int64_t per_token, int element, bool requires_grad) {
    return Fixed(per_token * f_.tokens, element, requires_grad);
  }
  Value Fixed(int64_t elements, int element, bool requires_grad) {
    return saved_.New(elements, element, requires_grad);
  }
  void Save(const Value& v) { saved_.Save(v); }
  uint64_t saved() const { return saved_.saved(); }

  // trainer/model/projection.cc: the base linear (dense or NF4) plus a LoRA adapter when
  // targeted (TraceLinear); the weight trains in a full fine-tune unless it is NF4.
  Value Linear(const Value& x, int64_t in, int64_t out, std::string_view name, bool nf4) {
    return TraceLinear(saved_, {f_.autocast, f_.dropout, f_.cuda, f_.rank}, x, f_.tokens, in, out,
                       f_.full && !nf4, nf4, f_.Targeted(name))
        .output;
  }

  // RmsNormImpl::forward: float32 normalisation, cast back, times the weight.
  Value Norm(const Value& x) {
    if (f_.fused) {
      // FusedRmsNorm keeps its input and each row's fp32 rstd, for both gradients.
      if (x.requires_grad || f_.full) {
        Save(x);
        Save(PerToken(1, 4, false));
      }
      return PerToken(f_.hidden, x.element, x.requires_grad || f_.full);
    }
    Value x32 = x.element == 4 ? x : PerToken(f_.hidden, 4, x.requires_grad);
    if (x.requires_grad) {
      Save(x32);                   // pow and the multiplication by rsqrt
      Save(PerToken(1, 4, true));  // rsqrt(variance): (B, T, 1)
    }
    const Value normed = PerToken(f_.hidden, x.element, x.requires_grad);
    if (f_.full) Save(normed);  // the weight's gradient
    return PerToken(f_.hidden, x.element, x.requires_grad || f_.full);
  }

  // AttentionImpl::forward: projections, rotary embedding, SDPA, output projection.
  Value Attention(const Value& x) {
    const int64_t q_width = f_.heads * f_.head_dim;
    const int64_t kv_width = f_.kv_heads * f_.head_dim;
    const Value q = Linear(x, f_.hidden, q_width, "q_proj", f_.qlora);
    const Value k = Linear(x, f_.hidden, kv_width, "k_proj", f_.qlora);
    const Value v = Linear(x, f_.hidden, kv_width, "v_proj", f_.qlora);
    Mark(kAttention);
    // x * cos + rotate_half(x) * sin saves only the tables, cast to the activations' dtype per
    // call (no copy in float32, where the shared tables are counted once).
    for (const Value* t : {&q, &k}) {
      // FusedRope rotates with the float32 tables themselves.
      if (t->requires_grad && t->element != 4 && !f_.fused) {
        Save(Fixed(f_.seq * f_.head_dim, t->element, false));  // cos
        Save(Fixed(f_.seq * f_.head_dim, t->element, false));  // sin
      }
    }
    const Value q_rot = PerToken(q_width, q.element, q.requires_grad);
    const Value k_rot = PerToken(kv_width, k.element, k.requires_grad);
    const bool grad = q_rot.requires_grad || k_rot.requires_grad || v.requires_grad;
    const Value out = PerToken(q_width, q.element, grad);
    if (grad && f_.RepeatsKeyValues()) {
      // The memory-efficient kernel keeps q, the repeated k and v (B, H, T, D), its output and
      // the float32 log-sum-exp (B, H, T rounded up to 32).
      Save(q_rot);
      Save(PerToken(q_width, 4, false));
      Save(PerToken(q_width, 4, false));
      Save(out);
      Save(Fixed(f_.tokens / f_.seq * f_.heads * ((f_.seq + 31) / 32 * 32), 4, false));
    } else if (grad && f_.cuda && q.element == 2 && f_.head_dim % 8 != 0) {
      // CUDA's flash attention takes head dims in multiples of 8: SDPA pads q, k and v (copies,
      // which flash keeps instead of the rotated ones) and slices its padded output, so o_proj's
      // input is a copy (OpenLLaMA 3B's 100 -> 104; measured on an H200).
      const int64_t padded = (f_.head_dim + 7) / 8 * 8;
      for (const int64_t heads : {f_.heads, f_.kv_heads, f_.kv_heads, f_.heads}) {
        Save(PerToken(heads * padded, q.element, false));
      }
      Save(PerToken(f_.heads, 4, false));
    } else if (grad) {
      // Flash attention keeps its inputs, output and the float32 log-sum-exp (B, H, T); (B, H, T,
      // D) -> (B, T, H * D) is a view of its output.
      for (const Value* t : {&q_rot, &k_rot, &v, &out}) Save(*t);
      Save(PerToken(f_.heads, 4, false));
    }
    Mark(kOutput);
    return Linear(out, q_width, f_.hidden, "o_proj", f_.qlora);
  }

  // MlpImpl::forward: down(silu(gate(x)) * up(x)).
  Value Mlp(const Value& x) {
    const Value gate = Linear(x, f_.hidden, f_.inter, "gate_proj", f_.qlora);
    const Value up = Linear(x, f_.hidden, f_.inter, "up_proj", f_.qlora);
    Mark(kActivation);
    if (f_.fused) {
      // FusedSwiGlu keeps the two projections and recomputes the activation in backward.
      if (gate.requires_grad || up.requires_grad) {
        Save(gate);
        Save(up);
      }
      const Value product =
          PerToken(f_.inter, gate.element, gate.requires_grad || up.requires_grad);
      Mark(kDown);
      if (f_.swiglu_linear) return PerToken(f_.hidden, gate.element, true);
      return Linear(product, f_.inter, f_.hidden, "down_proj", f_.qlora);
    }
    if (gate.requires_grad) Save(gate);
    const Value silu = PerToken(f_.inter, gate.element, gate.requires_grad);
    if (up.requires_grad) Save(silu);
    if (silu.requires_grad) Save(up);
    const Value product = PerToken(f_.inter, std::max(silu.element, up.element),
                                   silu.requires_grad || up.requires_grad);
    Mark(kDown);
    return Linear(product, f_.inter, f_.hidden, "down_proj", f_.qlora);
  }

  // One decoder layer; layer_stages() then holds what each of its stages saved.
  Value Layer(const Value& x) {
    stage_saved_.fill(0);
    stage_ = kNorm1;
    stage_start_ = saved();
    const Value normed = Norm(x);
    Mark(kQkv);
    const Value attention = Attention(normed);
    const Value h = PerToken(f_.hidden, x.element, x.requires_grad || attention.requires_grad);
    Mark(kNorm2);
    const Value mlp_input = Norm(h);
    Mark(kGateUp);
    const Value mlp = Mlp(mlp_input);
    Mark(kLayerStages);
    return PerToken(f_.hidden, h.element, h.requires_grad || mlp.requires_grad);
  }
  const StageBytes& layer_stages() const { return stage_saved_; }

 private:
  // What the forward saved since the last mark belongs to the stage it was in; `next` begins.
  void Mark(LayerStage next) {
    stage_saved_[stage_] += saved() - stage_start_;
    stage_ = next;
    stage_start_ = saved();
  }

  const Forward& f_;
  SavedTensors saved_;
  StageBytes stage_saved_{};
  size_t stage_ = kNorm1;
  uint64_t stage_start_ = 0;
};

// The loss over `hidden`: the chunked loss, or logits (B, T, V), their float32 copy and log-softmax
// (saved).
void TraceLoss(const Forward& f, const Value& hidden, bool autocast_scope, bool sharded,
               uint64_t param, Trace& trace, LlamaForwardTrace& out) {
  const uint64_t n = static_cast<uint64_t>(f.tokens);
  if (f.chunked_loss) {
    // trainer/model/loss.cc: forward forms the loss' gradients chunk by chunk and keeps the
    // hidden states' gradient (the size of the hidden states) and the head's summed gradient for
    // backward, which only scales them. While it runs, the hidden states themselves are alive.
    trace.Save(hidden);
    ChunkedLossShape shape = {
        .tokens = f.tokens,
        .hidden = f.hidden,
        .vocab = f.vocab,
        .act = f.act,
        .autocast = autocast_scope,
        // The head's summed gradient, in the weight's dtype (under fsdp the gathered one's).
        .weight_element = sharded ? static_cast<uint64_t>(f.act) : param,
        .head_trains = f.full,
        .head_adapter = f.Targeted("lm_head"),
        .buffers = f.head_buffers};
    const uint64_t chunk_moment = ChunkedLossMoment(shape);
    shape.buffers = {};
    out.forward_buffer = chunk_moment - ChunkedLossMoment(shape);
    out.forward_transient = hidden.bytes + chunk_moment;
    out.loss_backward = out.head_grad;
    return;
  }
  const Value logits = trace.Linear(hidden, f.hidden, f.vocab, "lm_head", /*nf4=*/false);
  const uint64_t nv = n * static_cast<uint64_t>(f.vocab);
  const uint64_t log_softmax = 4 * nv;
  trace.Save(trace.PerToken(f.vocab, 4, true));  // log_softmax's output
  // The logits, their float32 copy and log-softmax at once; with a LoRA adapter on the head
  // first the base output, the adapter's, its scaled copy and their sum (one C++ expression).
  const uint64_t head_output = f.Targeted("lm_head") ? 4 * logits.bytes : logits.bytes;
  out.forward_transient =
      std::max(head_output, logits.bytes + (logits.element != 4 ? 4 * nv : 0) + log_softmax) -
      log_softmax;
  // nll_loss's gradient and log_softmax's, both float32 (B x T, V).
  out.loss_backward = 2 * 4 * nv;
  out.head_log_softmax = log_softmax;
  out.logits_grad = nv * static_cast<uint64_t>(logits.element);
}

}  // namespace

// Whether the trainer's autocast is on: under the mixed precisions, under fsdp too.
bool AutocastScope(const TrialSettings& s) {
  return s.memory.precision == trial::Precision::kBf16Mixed ||
         s.memory.precision == trial::Precision::k16Mixed;
}

// How `config` runs its forward on `model` (`state` says whether fsdp shards it).
Forward DescribeForward(const TrialConfig& config, const ModelConfig& model,
                        const ModelStateEstimate& state) {
  const TrialSettings& s = config.settings();
  const trial::Precision precision = s.memory.precision;
  Forward f;
  f.seq = s.data.max_seq_length;
  f.tokens = s.train.micro_batch_size * f.seq;
  f.hidden = model.hidden_size;
  f.inter = model.intermediate_size;
  f.heads = model.num_attention_heads;
  f.kv_heads = model.num_key_value_heads;
  f.head_dim = model.head_dim;
  f.vocab = model.vocab_size;
  f.act = precision == trial::Precision::kBf16True ? 2 : 4;
  // The trainer's autocast is on under the mixed precisions, under fsdp too.
  f.autocast = AutocastScope(s);
  if (state.fsdp_root_values > 0 && f.autocast) {
    // fsdp gathers bf16 parameters (FSDP2's param_dtype): the forward is a bf16-true one.
    f.act = 2;
    f.autocast = false;
  }
  f.full = s.peft.method == trial::PeftMethod::kNone;
  f.qlora = s.peft.method == trial::PeftMethod::kQlora;
  f.compute = s.peft.compute_dtype == trial::ComputeDtype::kFp32 ? 4 : 2;
  if (!f.full) f.targets = s.peft.targets;
  f.rank = s.peft.r;
  f.dropout = !f.full && s.peft.dropout > 0.0;
  f.cuda = s.device.kind == trial::Device::kCuda;
  f.checkpointing = s.memory.activation_checkpointing;
  f.chunked_loss = UsesChunkedLoss(config);
  f.fused = s.memory.kernels == trial::Kernels::kFused;
  f.swiglu_linear = UsesSwiGluLinear(config, model);
  return f;
}

// The forward's saved tensors, layer by layer, then the loss'.
LlamaForwardTrace TraceLlamaForward(const Forward& f, const ModelConfig& model, bool autocast_scope,
                                    bool sharded, uint64_t param) {
  LlamaForwardTrace out;
  const uint64_t n = static_cast<uint64_t>(f.tokens);
  Trace trace(f);
  // Token ids, labels and the shifted labels (int64).
  const uint64_t ids = 3 * kTokenIdBytes * n;
  // RoPE's cos and sin tables (T, D) in float32, shared by every layer.
  const uint64_t rope = 2 * 4 * static_cast<uint64_t>(f.seq * f.head_dim);
  out.fixed += ids + rope;
  Value h = trace.PerToken(f.hidden, f.act, f.full);  // the embedding's output (B, T, C)
  if (f.checkpointing) h.requires_grad = true;        // enable_input_require_grads
  for (int64_t i = 0; i < model.num_hidden_layers; ++i) {
    const uint64_t before = trace.saved();
    if (f.checkpointing) {
      // CheckpointFunction keeps only the layer's input; backward reruns the layer with grad.
      trace.Save(h);
      Trace rerun(f);
      const Value input = rerun.PerToken(f.hidden, h.element, true);
      rerun.Layer(input);
      out.layer_recompute = std::max(out.layer_recompute, rerun.saved());
      out.layer_stages.push_back(rerun.layer_stages());
      h = trace.PerToken(f.hidden, h.element, true);
    } else {
      h = trace.Layer(h);
      out.layer_stages.push_back(trace.layer_stages());
    }
    out.layer_saved.push_back(trace.saved() - before);
  }
  out.layers_saved = trace.saved();
  const Value hidden = trace.Norm(h);
  out.head_grad = f.full ? param * static_cast<uint64_t>(f.vocab * f.hidden) : 0;
  TraceLoss(f, hidden, autocast_scope, sharded, param, trace, out);
  out.head_saved = trace.saved() - out.layers_saved;
  return out;
}

}  // namespace llmctl::estimate::llama
