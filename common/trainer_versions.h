// What `llm-train --version` reports: llmctl's, LibTorch's and CUDA's versions and the NVIDIA
// driver's. llm-train fills it; `llm-train --version --json` prints ToJson(), which llm-agent reads
// back with ParseTrainerVersions for its node info.
#ifndef LLMCTL_COMMON_TRAINER_VERSIONS_H_
#define LLMCTL_COMMON_TRAINER_VERSIONS_H_

#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl {

struct TrainerVersions {
  std::string llmctl;         // "0.4.0"
  std::string libtorch;       // "2.15.0"
  std::string libtorch_cuda;  // the CUDA LibTorch was built for, "13.2"; "" for a CPU build
  int cuda_devices = 0;       // the GPUs LibTorch can use (0 also when the driver is too old)
  std::string cuda_runtime;   // the loaded CUDA runtime, "13.0"; "" without a usable GPU
  std::string nvidia_driver;  // NVML's driver version, "580.95.05"; "" without an NVIDIA driver
  std::string driver_cuda;    // the highest CUDA the driver supports, "13.0"; "" without one

  // One line: "llm-train 0.4.0 (LibTorch 2.15.0, CUDA available)" or "..., no CUDA device)".
  std::string Summary() const;
  // Summary() and, when known, "LibTorch built for CUDA 13.2" and "CUDA runtime 13.0, NVIDIA
  // driver 580.95.05 (supports CUDA up to 13.0)", one a line, ending in a newline.
  std::string ToText() const;
  // One line of JSON, the keys as the fields above.
  std::string ToJson() const;
};

// ToJson's output. InvalidArgument naming what is wrong: not JSON, or a field missing or of the
// wrong type (llmctl and libtorch are required; the others default to empty and 0).
StatusOr<TrainerVersions> ParseTrainerVersions(std::string_view json);

}  // namespace llmctl

#endif  // LLMCTL_COMMON_TRAINER_VERSIONS_H_
