// The chunked cross-entropy's memory (trainer/model/loss.cc's ChunkedCrossEntropyLoss), shared by
// llama_trace.cc's LLaMA trace and blip2_trace.cc's BLIP-2 one: its forward forms the loss'
// gradients kLossChunkTokens tokens at a time and keeps for backward only the hidden states'
// gradient (the hidden states' size) and the head's summed gradient.
#ifndef LLMCTL_COMMON_ESTIMATE_CHUNKED_LOSS_H_
#define LLMCTL_COMMON_ESTIMATE_CHUNKED_LOSS_H_

#include <cstdint>

#include "common/estimate/matmul_buffers.h"
#include "common/trial_config.h"

namespace llmctl::estimate {

struct ChunkedLossShape {
  int64_t tokens = 0;  // the rows scored, B·T
  int64_t hidden = 0;  // C
  int64_t vocab = 0;   // V
  int act = 4;         // the hidden states' element
  bool autocast = false;
  uint64_t weight_element = 4;  // the head weight's (under fsdp the gathered one's)
  bool head_trains = false;     // the head's weight trains (its summed gradient is formed)
  bool head_adapter = false;    // a LoRA adapter on the head: each chunk through autograd
  // What the device's GEMMs take beside each head product's operands and output while it runs
  // (matmul_buffers.h, for the products' dtype and this head's vocabulary; 0 where not measured).
  HeadProductBuffers buffers = {};
};

// The bytes the loss adds while its chunks run, beyond the hidden states and their saved gradient,
// the buffer of a head product running then included (none at a moment no product runs).
uint64_t ChunkedLossMoment(const ChunkedLossShape& shape);

// The buffers the chunked loss' head products take on a device whose matmul library took
// `buffers`: by the products' dtype (16-bit: autocast's, or 2-byte parameters') and the head's
// `vocab`. None under 16-mixed, whose fp16 products no probe measures.
HeadProductBuffers ChunkedLossBuffers(const MatmulBuffers& buffers, trial::Precision precision,
                                      bool sixteen_bit_products, int64_t vocab);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_CHUNKED_LOSS_H_
