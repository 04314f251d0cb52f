// What a device's matmul library takes from LibTorch's allocator while one product runs, beyond the
// product's operands and output: a figure the memory estimate needs and only the node can measure.
//
// On a CPU, oneDNN packs a 16-bit GEMM's operands into buffers it takes from LibTorch's allocator
// for the call. Their size follows oneDNN's blocking, which its heuristics choose from the shape,
// the CPU's vector unit and caches, and LibTorch's threads (12-04, Zen 4, a 256-row chunk of the
// demo model's 2,048-word head: 460,544 B at 2 threads, 1.8 MB at 8, 2.2 MB at 16), so no formula
// of the shape holds on another CPU. A node's probe measures them at its vocabulary-head cells
// (rate_probe.h's ProbedHead::buffer_bytes) and the memory estimate adds them where one of the
// chunked loss' head products runs (chunked_loss.h). No LibTorch here.
#ifndef LLMCTL_COMMON_ESTIMATE_MATMUL_BUFFERS_H_
#define LLMCTL_COMMON_ESTIMATE_MATMUL_BUFFERS_H_

#include <cstdint>

namespace llmctl::estimate {

// The most bytes a vocabulary head's product took beside its operands and output, by the
// products' dtype. 0: not measured (a data sheet, a GPU, a probe before version 13), or none taken.
struct MatmulBuffers {
  uint64_t fp32_bytes = 0;
  uint64_t bf16_bytes = 0;
};

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_MATMUL_BUFFERS_H_
