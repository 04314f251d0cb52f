// BLIP-2's step memory (blip2_memory.h): the moments of a step over blip2_trace.cc's forward.
#include <algorithm>
#include <string>
#include <vector>

#include "common/byte_size.h"
#include "common/estimate/blip2_memory.h"
#include "common/estimate/blip2_trace.h"
#include "common/estimate/trace.h"

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

}  // namespace

StatusOr<StepMemoryEstimate> EstimateBlip2StepMemory(const TrialConfig& config,
                                                     const Blip2Config& model,
                                                     std::optional<int64_t> caption_tokens) {
  StepMemoryEstimate estimate;
  ASSIGN_OR_RETURN(estimate.state, EstimateBlip2ModelState(config, model));
  const ModelStateEstimate& state = estimate.state;
  const TrialSettings& s = config.settings();
  const int64_t max_length = s.data.max_seq_length;
  const int64_t caption = std::clamp<int64_t>(caption_tokens.value_or(max_length), 1, max_length);
  const bool sharded = s.parallel.strategy == trial::Strategy::kFsdp && state.world_size > 1;
  const Blip2ForwardTrace trace = TraceBlip2Forward(config, model, caption, sharded);
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
  // fsdp gathers each unit in the compute dtype (QLoRA's NF4 buffers in their own): the root
  // throughout; with reshard_after_forward a block while it runs forward, and in backward the
  // block computing and the one before it (the prefetch); without it every block from its forward
  // until its backward has reduced its gradients.
  const std::vector<Blip2UnitSize> units = Blip2UnitSizes(config, model);
  const uint64_t gathered_element = s.memory.precision == trial::Precision::k32True ? 4 : 2;
  auto gathered_of = [&](int64_t unit) -> uint64_t {
    const size_t index = static_cast<size_t>(unit + 1);
    if (!sharded || unit < -1 || index >= units.size()) return 0;
    return static_cast<uint64_t>(units[index].dense) * gathered_element + units[index].nf4_bytes;
  };
  const bool reshard = s.parallel.fsdp_reshard_after_forward;
  // The blocks' units gathered at once without reshard_after_forward: up to unit u.
  std::vector<uint64_t> units_up_to(units.size(), 0);
  uint64_t largest_unit = 0;
  for (size_t u = 1; u < units.size(); ++u) {
    const uint64_t bytes = gathered_of(static_cast<int64_t>(u) - 1);
    units_up_to[u] = (u > 1 ? units_up_to[u - 1] : 0) + bytes;
    largest_unit = std::max(largest_unit, bytes);
  }
  const uint64_t all_units = units_up_to.empty() ? 0 : units_up_to.back();
  const uint64_t root_gathered = gathered_of(-1);
  const uint64_t gathered_forward = root_gathered + (reshard ? largest_unit : all_units);
  const uint64_t gathered_at_loss = root_gathered + (reshard ? 0 : all_units);
  // In backward at a block of unit `unit` (-1 for one of the root's, `last` the latest unit
  // before it in forward order).
  auto gathered_backward = [&](int64_t unit, int64_t last) -> uint64_t {
    if (!reshard)
      return root_gathered + (last >= 0 ? units_up_to[static_cast<size_t>(last + 1)] : 0);
    if (unit < 0) return root_gathered + gathered_of(last);
    return root_gathered + gathered_of(unit) + gathered_of(unit - 1);
  };

  // Each unit's gradients, in proportion to its trainable values (a shard's under fsdp). The head's
  // (OPT's tied embedding, T5's lm_head) appear at the loss, the rest of the root's at the end.
  int64_t trainable = 0;
  for (const Blip2UnitSize& unit : units) trainable += unit.trainable;
  auto grads_of = [&](int64_t values) -> uint64_t {
    if (trainable == 0) return 0;
    return static_cast<uint64_t>(static_cast<double>(state.grads_bytes) *
                                 static_cast<double>(values) / static_cast<double>(trainable));
  };
  const bool language_trains = s.peft.method == trial::PeftMethod::kNone && [&] {
    const std::vector<std::string>& frozen = s.peft.freeze;
    return std::find(frozen.begin(), frozen.end(), "language_model") == frozen.end();
  }();
  const uint64_t head_grads =
      language_trains ? grads_of(model.text_vocab_size() * model.text_hidden_size()) : 0;
  auto grads_after = [&](uint64_t produced) -> uint64_t {
    return accumulation > 1 || !holds_grads ? 0 : std::min(produced, state.grads_bytes);
  };

  uint64_t peak = 0;
  std::string peak_moment;
  auto consider = [&](uint64_t bytes, const char* phase, std::string moment) {
    if (bytes > peak) {
      peak = bytes;
      estimate.peak_phase = phase;
      peak_moment = std::move(moment);
    }
  };
  std::string state_text = "params";
  if (!first_step_only && state.optim_device_bytes > 0) state_text += " + optimizer state";
  if (accumulation > 1 && holds_grads) state_text += " + gradients";
  if (state.comm_bytes > 0) state_text += " + comm buffers";
  state_text += " " + FormatBytes(base);
  auto gathered_text = [](uint64_t gathered) {
    return gathered > 0 ? " + gathered units " + FormatBytes(gathered) : std::string();
  };
  consider(base + gathered_forward + fixed + trace.forward_peak, "forward",
           "forward: " + state_text + gathered_text(gathered_forward) + " + the batch " +
               FormatBytes(fixed) + " + activations and the tensors alive at its highest " +
               FormatBytes(trace.forward_peak));
  consider(base + gathered_at_loss + fixed + trace.saved + trace.loss_backward, "backward",
           "backward, at the loss: " + state_text + gathered_text(gathered_at_loss) +
               " + activations " + FormatBytes(estimate.activation_bytes) +
               " + the loss' gradients " + FormatBytes(trace.loss_backward));
  // Block by block: its backward starts with its saved tensors all there and ends with its
  // gradients all made, each freed or made as it goes.
  std::vector<int64_t> last_unit(trace.blocks.size(), -1);  // at or before each block
  for (size_t i = 0; i < trace.blocks.size(); ++i) {
    last_unit[i] =
        trace.blocks[i].unit >= 0 ? trace.blocks[i].unit : (i > 0 ? last_unit[i - 1] : -1);
  }
  uint64_t produced = head_grads;
  uint64_t remaining = trace.saved + fixed;
  for (size_t i = trace.blocks.size(); i-- > 0;) {
    const Blip2BlockTrace& block = trace.blocks[i];
    uint64_t made =
        block.unit >= 0 ? grads_of(units[static_cast<size_t>(block.unit + 1)].trainable) : 0;
    if (i == 0) made = state.grads_bytes - std::min(produced, state.grads_bytes);
    const uint64_t gathered = sharded ? gathered_backward(block.unit, last_unit[i]) : 0;
    // fsdp: a unit's backward makes each parameter's whole gradient, in the compute dtype; they
    // are copied to the flat buffer when the unit's reduce-scatter starts, which first finishes
    // the previous unit's (its shard's gradient made then), so the unit's own shard gradient comes
    // only with the next unit's.
    const uint64_t unreduced =
        sharded && block.unit >= 0
            ? static_cast<uint64_t>(units[static_cast<size_t>(block.unit + 1)].trainable) *
                  gathered_element
            : 0;
    const uint64_t before = grads_after(produced);
    const uint64_t after = sharded ? before + unreduced : grads_after(produced + made);
    const uint64_t held = std::max(before + block.saved + block.recompute, after);
    consider(base + gathered + remaining - block.saved + held + block.backward_transient,
             "backward",
             "backward, " + block.name + ": " + state_text + gathered_text(gathered) +
                 " + gradients and the block's activations " + FormatBytes(held) +
                 " + activations left " + FormatBytes(remaining - block.saved) +
                 " + the block's temporaries " + FormatBytes(block.backward_transient));
    produced += made;
    remaining -= block.saved;
  }
  consider(base + (accumulation > 1 ? 0 : state.grads_bytes) +
               (first_step_only ? state.optim_device_bytes : 0),
           "optimizer step", "optimizer step: params, gradients and optimizer state");
  estimate.peak_bytes = peak;

  const uint64_t vision = SavedOf(trace, "vision");
  const uint64_t qformer = SavedOf(trace, "qformer");
  const uint64_t head = SavedOf(trace, "head");
  estimate.terms = {
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
      {"peak", peak_moment, peak},
  };
  return estimate;
}

StatusOr<MicroBatchFit> FitBlip2MicroBatch(const TrialConfig& config, const Blip2Config& model,
                                           std::optional<int64_t> caption_tokens,
                                           uint64_t device_bytes) {
  ASSIGN_OR_RETURN(const ModelStateEstimate state, EstimateBlip2ModelState(config, model));
  return FitMicroBatchWith(
      config, state.world_size, device_bytes, [&](const TrialConfig& c) -> StatusOr<uint64_t> {
        ASSIGN_OR_RETURN(StepMemoryEstimate e, EstimateBlip2StepMemory(c, model, caption_tokens));
        return e.peak_bytes;
      });
}

}  // namespace llmctl::estimate
