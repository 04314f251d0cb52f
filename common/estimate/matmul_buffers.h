// What a device's matmul library takes from LibTorch's allocator while one product runs, beyond the
// product's operands and output: a figure the memory estimate needs and only the node can measure.
//
// On a CPU, oneDNN packs a 16-bit GEMM's operands into buffers it takes from LibTorch's allocator
// for the call, one a thread working on it. Their size follows oneDNN's blocking, which its
// heuristics choose from the shape, the CPU's vector unit and caches, and how many of LibTorch's
// threads the output splits over (12-04, Zen 4, the weight gradient of a 256-row chunk through a
// 2,048-wide head 128 wide: 460,544 B at 2 threads, 1.8 MB at 8, 2.1 MB at 16, where a 16,384-wide
// head's splits over all 16: 3.7 MB), so no formula of the shape holds on another CPU. A node's
// probe measures them for a vocabulary head's three products at a few widths (rate_probe.h's
// head_buffers) and the memory estimate adds them where one of the chunked loss' products runs
// (chunked_loss.h). No LibTorch here.
#ifndef LLMCTL_COMMON_ESTIMATE_MATMUL_BUFFERS_H_
#define LLMCTL_COMMON_ESTIMATE_MATMUL_BUFFERS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace llmctl::estimate {

// The most bytes each of a vocabulary head's products took beside its operands and output, a
// chunk's rows through a `vocab`-wide output.
struct HeadProductBuffers {
  int64_t vocab = 0;
  uint64_t logits = 0;           // x W^T
  uint64_t input_gradient = 0;   // dy W
  uint64_t weight_gradient = 0;  // dy^T x

  uint64_t Largest() const { return std::max({logits, input_gradient, weight_gradient}); }
};

// A device's head product buffers by the products' dtype, each list by vocab, narrowest first.
// Empty: not measured (a data sheet, a GPU, a probe before version 13).
struct MatmulBuffers {
  std::vector<HeadProductBuffers> fp32 = {};
  std::vector<HeadProductBuffers> bf16 = {};

  // A `vocab`-wide head's: the narrowest measured at least that wide (a wider output splits over
  // at least as many threads), else the widest; all 0 where none was measured.
  HeadProductBuffers At(bool sixteen_bit, int64_t vocab) const {
    const std::vector<HeadProductBuffers>& heads = sixteen_bit ? bf16 : fp32;
    for (const HeadProductBuffers& head : heads) {
      if (head.vocab >= vocab) return head;
    }
    return heads.empty() ? HeadProductBuffers{} : heads.back();
  }
};

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_MATMUL_BUFFERS_H_
