// The machinery of a traced forward (llama_trace.cc's LLaMA, blip2_trace.cc's BLIP-2): symbolic
// tensors, each its own storage, and the set autograd saves for backward, each storage counted
// once as a snapshot counts it; and the peak moment both walk a step's moments for.
#ifndef LLMCTL_COMMON_ESTIMATE_TRACE_H_
#define LLMCTL_COMMON_ESTIMATE_TRACE_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>

#include "common/byte_size.h"

namespace llmctl::estimate {

// A tensor of the traced forward: its own storage of `bytes`.
struct TracedTensor {
  int64_t id = -1;
  uint64_t bytes = 0;
  int element = 4;  // bytes per element
  bool requires_grad = false;
};

class SavedTensors {
 public:
  // A new tensor (a new storage) of `elements` values of `element` bytes.
  TracedTensor New(int64_t elements, int element, bool requires_grad) {
    return {next_id_++, static_cast<uint64_t>(elements) * static_cast<uint64_t>(element), element,
            requires_grad};
  }
  // Autograd keeps `t` for backward (once, however many ops keep it).
  void Save(const TracedTensor& t) {
    if (saved_ids_.insert(t.id).second) saved_ += t.bytes;
  }
  uint64_t saved() const { return saved_; }
  bool IsSaved(const TracedTensor& t) const { return saved_ids_.contains(t.id); }

 private:
  int64_t next_id_ = 0;
  std::set<int64_t> saved_ids_;
  uint64_t saved_ = 0;
};

// How llm-train's Projection (trainer/model/projection.cc) runs a linear layer, for TraceLinear.
struct LinearRun {
  bool autocast = false;      // bf16-mixed, 16-mixed: the matmul in 2 bytes
  bool lora_dropout = false;  // LoRA's dropout on the adapter's input
  bool cuda = false;          // CUDA's fused dropout keeps a bool mask
  int64_t rank = 0;           // LoRA's r
};

struct TracedLinear {
  TracedTensor output;      // (rows, out)
  TracedTensor base;        // the base's output: the output itself without an adapter
  TracedTensor base_input;  // what the base read: x, or under autocast its 2-byte copy
  int adapter_element = 0;  // the adapter's element; 0 without one
};

// x (rows, in) -> (rows, out) through the base linear (dense, or NF4 when `nf4`) and, when
// `adapter`, a LoRA adapter, keeping in `saved` what autograd keeps: the input when the weight
// trains (`weight_trains`: false for frozen and NF4 weights), under autocast the input's and the
// weight's 2-byte copies; an NF4 base only its packed weight (its custom function frees the input
// cast and the dequantised weight when it returns, the output cast back to the input's dtype); the
// adapter's input (after its dropout, whose mask is kept for the input's gradient) and lora_A's
// output, both for the adapter's trained weights.
TracedLinear TraceLinear(SavedTensors& saved, const LinearRun& run, const TracedTensor& x,
                         int64_t rows, int64_t in, int64_t out, bool weight_trains, bool nf4,
                         bool adapter);

// The highest moment of a step so far: its bytes, its phase ("forward", "backward", "optimizer
// step") and, for --explain, what is alive then.
struct PeakMoment {
  uint64_t bytes = 0;
  std::string phase;
  std::string moment;

  // Takes the moment when it is higher than every one before.
  void Consider(uint64_t at, const char* at_phase, std::string description) {
    if (at <= bytes) return;
    bytes = at;
    phase = at_phase;
    moment = std::move(description);
  }
};

// " + gathered units 12.0 MiB" for a moment's text, "" where fsdp holds nothing gathered.
inline std::string GatheredUnitsText(uint64_t gathered) {
  return gathered > 0 ? " + gathered units " + FormatBytes(gathered) : std::string();
}

// 4096 -> "4,096" (counts here are never negative).
inline std::string GroupedCount(int64_t n) {
  const std::string digits = std::to_string(n);
  std::string grouped;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return grouped;
}

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_TRACE_H_
