#include "common/estimate/trace.h"

#include <algorithm>

namespace llmctl::estimate {

TracedLinear TraceLinear(SavedTensors& saved, const LinearRun& run, const TracedTensor& x,
                         int64_t rows, int64_t in, int64_t out, bool weight_trains, bool nf4,
                         bool adapter) {
  TracedLinear l;
  l.base_input = x;
  if (nf4) {
    l.base = saved.New(rows * out, x.element, x.requires_grad);
  } else {
    if (run.autocast && x.element != 2) l.base_input = saved.New(rows * in, 2, x.requires_grad);
    // The gradient of the input needs the weight: under autocast its bf16 copy, kept in the
    // graph until this layer's backward (autocast caches one copy per trained weight).
    if (run.autocast && (x.requires_grad || weight_trains))
      saved.Save(saved.New(in * out, 2, false));
    if (weight_trains) saved.Save(l.base_input);  // the weight's gradient needs the input
    l.base = saved.New(rows * out, run.autocast ? 2 : x.element, x.requires_grad || weight_trains);
  }
  if (!adapter) {
    l.output = l.base;
    return l;
  }
  TracedTensor adapter_input = x;
  if (run.lora_dropout) {
    // CPU: input * (bernoulli mask / (1 - p)), the mask in the input's dtype; CUDA's fused
    // kernel keeps a bool mask.
    const TracedTensor mask = saved.New(rows * in, run.cuda ? 1 : x.element, false);
    if (x.requires_grad) saved.Save(mask);
    adapter_input = saved.New(rows * in, x.element, x.requires_grad);
  }
  if (run.autocast && adapter_input.element != 2) {
    adapter_input = saved.New(rows * in, 2, adapter_input.requires_grad);
  }
  if (run.autocast) {
    saved.Save(saved.New(in * run.rank, 2, false));   // lora_A's bf16 weight
    saved.Save(saved.New(run.rank * out, 2, false));  // lora_B's
  }
  saved.Save(adapter_input);  // lora_A's weight trains
  l.adapter_element = run.autocast ? 2 : adapter_input.element;
  saved.Save(saved.New(rows * run.rank, l.adapter_element, true));  // lora_B's weight trains
  l.output = saved.New(rows * out, std::max(l.base.element, l.adapter_element), true);
  return l;
}

}  // namespace llmctl::estimate
