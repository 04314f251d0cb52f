// CUDA versions as llmctl compares them: a driver's highest supported CUDA against the CUDA a
// LibTorch build needs.
#ifndef LLMCTL_COMMON_CUDA_VERSION_H_
#define LLMCTL_COMMON_CUDA_VERSION_H_

#include <compare>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl {

struct CudaVersion {
  int major = 0;
  int minor = 0;

  // NVML's and the CUDA API's integer form: 1000 * major + 10 * minor (12040 is 12.4).
  static CudaVersion FromInt(int version) { return {version / 1000, version % 1000 / 10}; }
  std::string ToString() const { return std::to_string(major) + "." + std::to_string(minor); }
  friend auto operator<=>(const CudaVersion&, const CudaVersion&) = default;
};

// "13.2" or "12.4.1" (the patch is ignored). InvalidArgument naming the text otherwise.
StatusOr<CudaVersion> ParseCudaVersion(std::string_view text);

// The oldest NVIDIA driver that runs CUDA `cuda_major`.x, from NVIDIA's CUDA Toolkit release notes
// (CUDA minor version compatibility: 11.x from 450.80.02, 12.x from 525.60.13, 13.x from
// 580.65.06); "" for a major it does not know.
std::string_view MinimumDriverForCuda(int cuda_major);

// What decides whether a node's NVIDIA driver runs its llm-train's LibTorch.
struct NodeCuda {
  std::string node;
  int gpus = 0;               // NVML's device count
  std::string driver;         // NVML's driver version, "550.54.15"
  std::string driver_cuda;    // the highest CUDA the driver supports, "12.4"
  std::string libtorch;       // llm-train's LibTorch, "2.15.0"
  std::string libtorch_cuda;  // the CUDA that LibTorch was built for, "13.2"; "" for a CPU build
};

// FailedPrecondition, one message saying what to change, when the node has GPUs and its driver
// supports an older CUDA major than llm-train's LibTorch was built for (within a major, CUDA's
// minor version compatibility lets an older driver run it). A node without GPUs, a CPU build, or
// facts that are missing (an older agent) are fine: a CPU node, or nothing to judge.
Status CheckDriverRunsLibTorch(const NodeCuda& node);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_CUDA_VERSION_H_
