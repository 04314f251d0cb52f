// One rule the trainer and its tests share: on which CPUs LibTorch multiplies 16-bit matrices
// (bf16, fp16) with vector instructions of its own.
//
// LibTorch's 16-bit CPU GEMM is oneDNN's, which needs AVX-512: bf16 through AVX512_CORE (avx512f,
// bw, vl, dq; natively with avx512_bf16 or AMX), fp16 with avx512_fp16 (or AMX-FP16, which comes
// with it). Elsewhere LibTorch falls back to a scalar loop: on a 2-core AMD EPYC Zen 3 (AVX2),
// bf16 at 13-22 GFLOP/s in two operand layouts and 1-2 in the third, against 60-125 for fp32. There
// the trainer multiplies 16-bit matrices as fp32 ones (trainer/kernels/linear.h); the tensors a
// step allocates are the same either way. The estimate tests read the same flags for the kernels
// oneDNN picks (common/estimate/blip2_peak_test.cc).
#ifndef LLMCTL_COMMON_CPU_MATMUL_H_
#define LLMCTL_COMMON_CPU_MATMUL_H_

namespace llmctl {

// Whether this CPU has AVX-512's core set (avx512f, bw, vl, dq), which oneDNN's AVX512_CORE
// kernels need.
inline bool CpuHasAvx512Core() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// Whether this CPU has LibTorch's bf16 GEMM (oneDNN's, AVX512_CORE).
inline bool CpuMultipliesBf16() { return CpuHasAvx512Core(); }

// Whether this CPU has LibTorch's fp16 GEMM (oneDNN's, avx512_fp16).
inline bool CpuMultipliesFp16() { return __builtin_cpu_supports("avx512fp16"); }

}  // namespace llmctl

#endif  // LLMCTL_COMMON_CPU_MATMUL_H_
