// One rule the trainer and the estimate share: how a linear layer's input gradient dy @ W is
// multiplied on the CPU in 16 bits.
//
// LibTorch's CPU GEMM for bf16 and fp16, on a CPU without bf16 instructions (no oneDNN path),
// runs dy (N, O) @ W (O, I) with both operands row-major at 1-2 GFLOP/s, while the same product
// with one operand in the other layout runs at 13-22 (measured on a 2-core AMD EPYC Zen 3: the
// forward x @ W^T and the weight's gradient dy^T @ x already take those layouts). So the trainer
// forms the input gradient kInputGradientRows rows at a time, each block of dy copied
// column-major first (its transpose made contiguous): the same sums row by row, at most
// kInputGradientRows x O values of dy's 2-byte element alive beside the product, one block at a
// time (trainer/kernels/linear.h). It does so on every CPU, whatever its instructions, so that the
// memory a step allocates, and the estimate of it, is the same on each.
#ifndef LLMCTL_COMMON_MATMUL_LAYOUT_H_
#define LLMCTL_COMMON_MATMUL_LAYOUT_H_

#include <algorithm>
#include <cstdint>

namespace llmctl {

inline constexpr int64_t kInputGradientRows = 64;

// Whether a linear layer's input gradient copies dy block by block: on the CPU, where the
// matmul's element (the weight's, or autocast's) is 2 bytes.
constexpr bool InputGradientCopiesRows(bool on_cpu, int matmul_element_bytes) {
  return on_cpu && matmul_element_bytes == 2;
}

// LibTorch copies a transposed 2-D tensor of at least 360 values through a 60 x 60 buffer of its
// dtype (ATen's copy_same_type_transpose_), alive while the block is being copied.
inline constexpr int64_t kTransposeCopyMinValues = 360;
inline constexpr int64_t kTransposeCopyBufferValues = 60 * 60;

// The bytes of that copy, at its highest, while an input gradient of `rows` x `out` forms (0 where
// none is made): one block, and while it is copied LibTorch's transpose buffer.
constexpr uint64_t InputGradientCopyBytes(bool on_cpu, int matmul_element_bytes, int64_t rows,
                                          int64_t out) {
  if (!InputGradientCopiesRows(on_cpu, matmul_element_bytes)) return 0;
  const int64_t block = std::min(rows, kInputGradientRows) * out;
  const int64_t buffer = block >= kTransposeCopyMinValues ? kTransposeCopyBufferValues : 0;
  return static_cast<uint64_t>(block + buffer) * static_cast<uint64_t>(matmul_element_bytes);
}

}  // namespace llmctl

#endif  // LLMCTL_COMMON_MATMUL_LAYOUT_H_
