#include "common/estimate/chunked_loss.h"

#include <algorithm>
#include <functional>

#include "common/trial_config.h"

namespace llmctl::estimate {

uint64_t ChunkedLossMoment(const ChunkedLossShape& shape) {
  // The first chunk runs before the head's summed gradient exists; the later ones beside it, and
  // the largest of those is shorter when the tokens do not fill two chunks (measured: 436 tokens
  // peak in the first chunk).
  const int64_t first_tokens = std::min(kLossChunkTokens, shape.tokens);
  const int64_t later_tokens = std::min(kLossChunkTokens, shape.tokens - first_tokens);
  const uint64_t vocab = static_cast<uint64_t>(shape.vocab);
  const uint64_t first_chunk = static_cast<uint64_t>(first_tokens) * vocab;
  const uint64_t later_chunk = static_cast<uint64_t>(later_tokens) * vocab;
  const uint64_t head_values = static_cast<uint64_t>(shape.vocab * shape.hidden);
  const uint64_t weight_element = shape.weight_element;
  const uint64_t summed_head_grad = shape.head_trains ? weight_element * head_values : 0;
  // The chunk's logits are in autocast's dtype when it is on (under fsdp too, where the gathered
  // weights are bf16 already).
  const uint64_t element = shape.autocast ? 2 : static_cast<uint64_t>(shape.act);
  // The bytes one chunk of `chunk` logits holds at once, `held` the summed gradient beside it.
  std::function<uint64_t(uint64_t, uint64_t)> chunk_moment;
  uint64_t fixed = 0;
  // Every chunk runs the logits' product (x W^T) and the hidden states' gradient's (dy W): the
  // larger of their buffers is beside the chunk's logits or their gradient while one runs.
  const uint64_t logits_products_buffer =
      std::max(shape.buffers.logits, shape.buffers.input_gradient);
  if (!shape.head_adapter) {
    // A plain head, in autocast's dtype when it is on (the weight cast once, held through the
    // chunks, unless fsdp gathered it in bf16 already). Each chunk: its logits, which the fused
    // cross-entropy turns into their gradient in place (trainer/kernels/fused_ops.h), nothing
    // beside them; the first chunk's weight gradient created beside its logits' gradient (and
    // widened to the weight's dtype), later ones added in place (or, when they differ in dtype,
    // made first and added through a cast copy).
    const uint64_t chunk_grad = shape.head_trains ? element * head_values : 0;
    // Beside them, each chunk row's float32 loss (4 B a token), and the loss' scalars (the count,
    // its reciprocal, the sum); and the weight cast once.
    fixed = 4 * static_cast<uint64_t>(first_tokens) + 256 +
            (element != weight_element ? element * head_values : 0);
    const uint64_t weight_gradient_buffer = shape.buffers.weight_gradient;
    chunk_moment = [=](uint64_t chunk, uint64_t held) {
      // While one of the head's products runs, its buffer beside: the logits' and the hidden
      // states' gradient's, and where the head trains the weight gradient's (dy^T x) beside them,
      // its output made apart on the first chunk and where it differs in dtype from the sum, else
      // added into the sum in place (measured, the demo model's bf16-true row: its peak in the
      // first chunk's dy^T x).
      const uint64_t logits = held + chunk * element;
      const uint64_t made_apart = held == 0 || element != weight_element ? chunk_grad : 0;
      const uint64_t in_product =
          std::max(logits + logits_products_buffer,
                   shape.head_trains ? logits + made_apart + weight_gradient_buffer : 0);
      // Once it has run, a gradient in another dtype than the sum's is widened into the sum (the
      // first chunk's creates it) or added to it through a cast copy in the sum's dtype (measured:
      // a (V, C) float32 tensor under bf16-mixed), with no product running.
      const uint64_t widening =
          element != weight_element ? logits + chunk_grad + summed_head_grad : 0;
      return std::max(in_product, widening);
    };
  } else {
    // Through autograd (an adapter on the head), each chunk: its logits (the base output, the
    // adapter's, its scaled copy and their sum), their float32 copy and log-softmax; then
    // backward's log-softmax and two float32 gradients, beside the head's gradient summed so
    // far.
    const uint64_t widen = element != 4 ? 4 : 0;
    // A product's buffer is beside at most two of the chunk's logits-sized tensors: the base
    // output while the adapter's forms, the logits' gradient and its scaled copy while backward's
    // products run (the hidden states' through the base weight and the adapter's, the adapter's
    // weight gradients). The base weight is frozen, so its weight gradient's product never runs;
    // the adapter's, with the chunk's rows reduced into a rank-wide output, takes no more than the
    // head's would. Measured (12-04, Zen 4, the demo model's QLoRA row with an adapter on the
    // head): the chunk's peak, in its float32 copies, holds no buffer at 2 threads or at 16.
    const uint64_t products_buffer =
        std::max(logits_products_buffer, shape.buffers.weight_gradient);
    chunk_moment = [=](uint64_t chunk, uint64_t held) {
      return held + std::max({4 * chunk * element, chunk * (element + widen + 4), 3 * 4 * chunk,
                              2 * chunk * element + products_buffer});
    };
  }
  uint64_t moment = chunk_moment(first_chunk, 0);
  if (later_tokens > 0) moment = std::max(moment, chunk_moment(later_chunk, summed_head_grad));
  return fixed + moment;
}

HeadProductBuffers ChunkedLossBuffers(const MatmulBuffers& buffers, trial::Precision precision,
                                      bool sixteen_bit_products, int64_t vocab) {
  if (precision == trial::Precision::k16Mixed) return {};
  return buffers.At(sixteen_bit_products, vocab);
}

}  // namespace llmctl::estimate
