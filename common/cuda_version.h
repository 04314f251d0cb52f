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

}  // namespace llmctl

#endif  // LLMCTL_COMMON_CUDA_VERSION_H_
