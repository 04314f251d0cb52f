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
    chunk_moment = [=](uint64_t chunk, uint64_t held) {
      const uint64_t weight_grad =
          held == 0
              ? chunk * element + chunk_grad + (element != weight_element ? summed_head_grad : 0)
          // A later chunk's gradient in another dtype is added to the sum through a cast copy
          // of it in the sum's dtype (measured: a (V, C) float32 tensor under bf16-mixed).
          : element != weight_element ? held + chunk * element + chunk_grad + summed_head_grad
                                      : 0;
      return std::max(held + chunk * element, weight_grad);
    };
  } else {
    // Through autograd (an adapter on the head), each chunk: its logits (the base output, the
    // adapter's, its scaled copy and their sum), their float32 copy and log-softmax; then
    // backward's log-softmax and two float32 gradients, beside the head's gradient summed so
    // far.
    const uint64_t widen = element != 4 ? 4 : 0;
    chunk_moment = [=](uint64_t chunk, uint64_t held) {
      return held + std::max({4 * chunk * element, chunk * (element + widen + 4), 3 * 4 * chunk});
    };
  }
  uint64_t moment = chunk_moment(first_chunk, 0);
  if (later_tokens > 0) moment = std::max(moment, chunk_moment(later_chunk, summed_head_grad));
  // Each moment has one of the head's products running: the logits' GEMM forming the chunk's
  // logits, or the weight gradient's (dy^T x) beside their gradient (measured, the demo model's
  // bf16-true row: its peak in the first chunk's dy^T x).
  return fixed + moment + shape.product_buffer;
}

}  // namespace llmctl::estimate
