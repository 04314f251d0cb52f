// This host's CPU as /proc/cpuinfo gives it: its model name ("AMD EPYC 7763 64-Core Processor"),
// how a node and a rate probe name the processor they describe, and the threads LibTorch computes
// with on it.
#ifndef LLMCTL_COMMON_CPU_MODEL_H_
#define LLMCTL_COMMON_CPU_MODEL_H_

#include <string>

namespace llmctl {

// "cpu" when /proc/cpuinfo has no model name (not Linux, or an architecture that names none).
std::string CpuModelName();

// The intra-op threads LibTorch starts with here (at::get_num_threads() before any
// set_num_threads; llm-train sets none), which are MKL's count: MKL_NUM_THREADS, else
// OMP_NUM_THREADS, when a positive integer, at most the machine's physical cores unless
// MKL_DYNAMIC is false; else the physical cores among the processors this process may run on
// (/proc/cpuinfo's distinct physical id and core id pairs); else the logical processors; at least
// 1. (Before 12-04 OMP_NUM_THREADS came first and nothing capped it: OMP_NUM_THREADS=16 on 2 cores
// said 16 where LibTorch runs 2.)
int LibTorchDefaultThreads();

}  // namespace llmctl

#endif  // LLMCTL_COMMON_CPU_MODEL_H_
