// BLIP-2's step memory (blip2_memory.h): the moments of a step over blip2_trace.cc's forward.
#include <algorithm>
#include <string>
#include <vector>

#include "common/byte_size.h"
#include "common/estimate/blip2_memory.h"
#include "common/estimate/blip2_trace.h"
#include "common/estimate/trace.h"
#include "common/estimate/weight_tensors.h"

namespace llmctl::estimate {
namespace {

// The blocks' saved bytes whose names start with `prefix`.
uint64_t SavedOf(const Blip2ForwardTrace& trace, const std::string& prefix) {
  uint64_t bytes = 0;
  for (const Blip2BlockTrace& block : trace.blocks) {
    if (block.name.starts_with(prefix)) bytes += block.saved;
  }
  return bytes;
}

// What fsdp holds gathered, in the compute dtype (QLoRA's NF4 buffers in their own): the root
// throughout; with reshard_after_forward a block while it runs forward, and in backward the block
// computing and the one before it (the prefetch); without it every block from its forward until
// its backward has reduced its gradients. All 0 unless sharded.
class Blip2Gathering {
 public:
  Blip2Gathering(const std::vector<Blip2UnitSize>& units, bool sharded, uint64_t element,
                 bool reshard)
      : units_(units), sharded_(sharded), element_(element), reshard_(reshard) {
    // The blocks' units gathered at once without reshard_after_forward: up to unit u.
    units_up_to_.assign(units.size(), 0);
    for (size_t u = 1; u < units.size(); ++u) {
      const uint64_t bytes = Of(static_cast<int64_t>(u) - 1);
      units_up_to_[u] = (u > 1 ? units_up_to_[u - 1] : 0) + bytes;
      largest_unit_ = std::max(largest_unit_, bytes);
    }
    all_units_ = units_up_to_.empty() ? 0 : units_up_to_.back();
  }

  // Unit `unit` gathered (-1: the root).
  uint64_t Of(int64_t unit) const {
    const size_t index = static_cast<size_t>(unit + 1);
    if (!sharded_ || unit < -1 || index >= units_.size()) return 0;
    return static_cast<uint64_t>(units_[index].dense) * element_ + units_[index].nf4_bytes;
  }
  uint64_t Forward() const { return Of(-1) + (reshard_ ? largest_unit_ : all_units_); }
  uint64_t AtLoss() const { return Of(-1) + (reshard_ ? 0 : all_units_); }
  // In backward at a block of unit `unit` (-1 for one of the root's, `last` the latest unit
  // before it in forward order).
  uint64_t Backward(int64_t unit, int64_t last) const {
    if (!reshard_) return Of(-1) + (last >= 0 ? units_up_to_[static_cast<size_t>(last + 1)] : 0);
    if (unit < 0) return Of(-1) + Of(last);
    return Of(-1) + Of(unit) + Of(unit - 1);
  }

 private:
  const std::vector<Blip2UnitSize>& units_;
  bool sharded_;
  uint64_t element_;
  bool reshard_;
  std::vector<uint64_t> units_up_to_;
  uint64_t largest_unit_ = 0;
  uint64_t all_units_ = 0;
};

// What the backward walk needs of the step.
struct Blip2Backward {
  const Blip2ForwardTrace& trace;
  const std::vector<Blip2UnitSize>& units;
  const Blip2Gathering& gathering;
  const ModelStateEstimate& state;
  bool sharded = false;
  bool holds_grads = false;
  int64_t accumulation = 1;
  uint64_t gathered_element = 4;
  uint64_t param_element = 4;  // a parameter's, and its gradient's
  uint64_t base = 0;           // the state held throughout
  uint64_t fixed = 0;          // the micro-batches' pixels and ids
  uint64_t head_grads = 0;     // made at the loss
  std::string state_text;      // how `base` is described
};

// Each unit's gradients, in proportion to its trainable values (a shard's under fsdp).
uint64_t Blip2GradsOf(const Blip2Backward& b, int64_t values) {
  int64_t trainable = 0;
  for (const Blip2UnitSize& unit : b.units) trainable += unit.trainable;
  if (trainable == 0) return 0;
  return static_cast<uint64_t>(static_cast<double>(b.state.grads_bytes) *
                               static_cast<double>(values) / static_cast<double>(trainable));
}

// Block by block from the last: its backward starts with its saved tensors all there and ends
// with its gradients all made, each freed or made as it goes.
void WalkBlip2Backward(const Blip2Backward& b, PeakMoment& peak) {
  const std::vector<Blip2BlockTrace>& blocks = b.trace.blocks;
  const uint64_t all_grads = b.state.grads_bytes;
  auto grads_after = [&](uint64_t produced) -> uint64_t {
    return b.accumulation > 1 || !b.holds_grads ? 0 : std::min(produced, all_grads);
  };
  std::vector<int64_t> last_unit(blocks.size(), -1);  // at or before each block
  for (size_t i = 0; i < blocks.size(); ++i) {
    last_unit[i] = blocks[i].unit >= 0 ? blocks[i].unit : (i > 0 ? last_unit[i - 1] : -1);
  }
  uint64_t produced = b.head_grads;
  uint64_t remaining = b.trace.saved + b.fixed;
  for (size_t i = blocks.size(); i-- > 0;) {
    const Blip2BlockTrace& block = blocks[i];
    const Blip2UnitSize* unit =
        block.unit >= 0 ? &b.units[static_cast<size_t>(block.unit + 1)] : nullptr;
    uint64_t made = unit != nullptr ? Blip2GradsOf(b, unit->trainable) : 0;
    if (i == 0) made = all_grads - std::min(produced, all_grads);
    const uint64_t gathered = b.sharded ? b.gathering.Backward(block.unit, last_unit[i]) : 0;
    // fsdp: a unit's backward makes each parameter's whole gradient, in the compute dtype; they
    // are copied to the flat buffer when the unit's reduce-scatter starts, which first finishes
    // the previous unit's (its shard's gradient made then), so the unit's own shard gradient comes
    // only with the next unit's.
    const uint64_t unreduced = b.sharded && unit != nullptr
                                   ? static_cast<uint64_t>(unit->trainable) * b.gathered_element
                                   : 0;
    const uint64_t before = grads_after(produced);
    const uint64_t after = b.sharded ? before + unreduced : grads_after(produced + made);
    const uint64_t held = std::max(before + block.saved + block.recompute, after);
    // Where the gradients are held from an earlier micro-batch, a weight's is formed apart, then
    // added (measured: a (2,560, 768) bf16 tensor in the cpu-lab-blip2 T5's feed-forward under
    // accumulation), beside what the block's backward holds then; the largest stands for the
    // block's.
    const uint64_t temporaries =
        b.accumulation > 1 && b.holds_grads && !b.sharded
            ? std::max(block.backward_transient,
                       block.transient_beside_weight +
                           static_cast<uint64_t>(block.largest_weight_gradient) * b.param_element)
            : block.backward_transient;
    peak.Consider(b.base + gathered + remaining - block.saved + held + temporaries, "backward",
                  "backward, " + block.name + ": " + b.state_text + GatheredUnitsText(gathered) +
                      " + gradients and the block's activations " + FormatBytes(held) +
                      " + activations left " + FormatBytes(remaining - block.saved) +
                      " + the block's temporaries " + FormatBytes(temporaries));
    produced += made;
    remaining -= block.saved;
  }
}

// --explain's terms of the activations and of the peak.
std::vector<EstimateTerm> Blip2Terms(const TrialSettings& s, const Blip2Config& model,
                                     const Blip2ForwardTrace& trace,
                                     const StepMemoryEstimate& estimate, int64_t caption,
                                     uint64_t fixed, const PeakMoment& peak) {
  const int64_t batch = s.train.micro_batch_size;
  const uint64_t vision = SavedOf(trace, "vision");
  const uint64_t qformer = SavedOf(trace, "qformer");
  const uint64_t head = SavedOf(trace, "head");
  return {
      {"activations: image",
       "ViT and Q-Former, for " + GroupedCount(batch) + " images" +
           (s.memory.activation_checkpointing ? " (each block's inputs only)" : ""),
       vision + qformer},
      {"activations: text",
       "projection, " + std::string(model.t5() ? "T5" : "OPT") + ", for " +
           GroupedCount(estimate.tokens) + " tokens (" + std::to_string(batch) + " x (" +
           std::to_string(model.num_query_tokens) + " queries + " + std::to_string(caption) +
           " caption tokens))",
       trace.saved - vision - qformer - head},
      {"activations: head", "output head, log-softmax", head},
      {"activations: batch", "pixels, token ids, labels and mask", fixed},
      {"peak", peak.moment, peak.bytes},
  };
}

}  // namespace

StatusOr<StepMemoryEstimate> EstimateBlip2StepMemory(const TrialConfig& config,
                                                     const Blip2Config& model,
                                                     std::optional<int64_t> caption_tokens,
                                                     const MatmulBuffers& buffers) {
  StepMemoryEstimate estimate;
  ASSIGN_OR_RETURN(estimate.state, EstimateBlip2ModelState(config, model));
  const ModelStateEstimate& state = estimate.state;
  const TrialSettings& s = config.settings();
  const int64_t max_length = s.data.max_seq_length;
  const int64_t caption = std::clamp<int64_t>(caption_tokens.value_or(max_length), 1, max_length);
  const bool sharded = s.parallel.strategy == trial::Strategy::kFsdp && state.world_size > 1;
  const Blip2ForwardTrace trace = TraceBlip2Forward(config, model, caption, sharded, buffers);
  const int64_t batch = s.train.micro_batch_size;
  estimate.tokens = batch * trace.text_tokens;
  const int64_t accumulation = s.train.global_batch_size / (batch * state.world_size);
  // A step draws all its micro-batches before the first forward and holds them to its end: with
  // accumulation every micro-batch's pixels are there throughout.
  const uint64_t fixed = trace.fixed * static_cast<uint64_t>(accumulation);
  estimate.activation_bytes = trace.saved + fixed;

  // --- The moments of the step, as step_memory.cc's: the steady state of a step after the first
  // (the optimizer's state held through forward and backward; with accumulation the gradients).
  const bool first_step_only = s.train.max_steps == 1;
  const bool holds_grads = state.grads_bytes > 0;
  uint64_t base =
      state.params_bytes + state.comm_bytes + (first_step_only ? 0 : state.optim_device_bytes);
  if (accumulation > 1 && holds_grads) base += state.grads_bytes;
  const std::vector<Blip2UnitSize> units = Blip2UnitSizes(config, model);
  const uint64_t gathered_element = s.memory.precision == trial::Precision::k32True ? 4 : 2;
  const Blip2Gathering gathering(units, sharded, gathered_element,
                                 s.parallel.fsdp_reshard_after_forward);

  std::string state_text = "params";
  if (!first_step_only && state.optim_device_bytes > 0) state_text += " + optimizer state";
  if (accumulation > 1 && holds_grads) state_text += " + gradients";
  if (state.comm_bytes > 0) state_text += " + comm buffers";
  state_text += " " + FormatBytes(base);
  Blip2Backward backward{.trace = trace,
                         .units = units,
                         .gathering = gathering,
                         .state = state,
                         .sharded = sharded,
                         .holds_grads = holds_grads,
                         .accumulation = accumulation,
                         .gathered_element = gathered_element,
                         .param_element = ParamBytes(s.memory.precision),
                         .base = base,
                         .fixed = fixed,
                         .state_text = state_text};
  // The head's gradients (OPT's tied embedding, T5's lm_head) appear at the loss, the rest of the
  // root's at the end.
  const bool language_trains = s.peft.method == trial::PeftMethod::kNone &&
                               std::find(s.peft.freeze.begin(), s.peft.freeze.end(),
                                         "language_model") == s.peft.freeze.end();
  backward.head_grads =
      language_trains ? Blip2GradsOf(backward, model.text_vocab_size() * model.text_hidden_size())
                      : 0;

  PeakMoment peak;
  peak.Consider(base + gathering.Forward() + fixed + trace.forward_peak, "forward",
                "forward: " + state_text + GatheredUnitsText(gathering.Forward()) +
                    " + the batch " + FormatBytes(fixed) +
                    " + activations and the tensors alive at its highest " +
                    FormatBytes(trace.forward_peak));
  peak.Consider(base + gathering.AtLoss() + fixed + trace.saved + trace.loss_backward, "backward",
                "backward, at the loss: " + state_text + GatheredUnitsText(gathering.AtLoss()) +
                    " + activations " + FormatBytes(estimate.activation_bytes) +
                    " + the loss' gradients " + FormatBytes(trace.loss_backward));
  WalkBlip2Backward(backward, peak);
  peak.Consider(base + (accumulation > 1 ? 0 : state.grads_bytes) +
                    (first_step_only ? state.optim_device_bytes : 0),
                "optimizer step", "optimizer step: params, gradients and optimizer state");
  estimate.peak_bytes = peak.bytes;
  estimate.peak_phase = peak.phase;
  estimate.terms = Blip2Terms(s, model, trace, estimate, caption, fixed, peak);
  return estimate;
}

StatusOr<MicroBatchFit> FitBlip2MicroBatch(const TrialConfig& config, const Blip2Config& model,
                                           std::optional<int64_t> caption_tokens,
                                           uint64_t device_bytes, const MatmulBuffers& buffers) {
  ASSIGN_OR_RETURN(const ModelStateEstimate state, EstimateBlip2ModelState(config, model));
  return FitMicroBatchWith(
      config, state.world_size, device_bytes, [&](const TrialConfig& c) -> StatusOr<uint64_t> {
        ASSIGN_OR_RETURN(StepMemoryEstimate e,
                         EstimateBlip2StepMemory(c, model, caption_tokens, buffers));
        return e.peak_bytes;
      });
}

}  // namespace llmctl::estimate
