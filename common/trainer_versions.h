// What `llm-train --version` reports: llmctl's, LibTorch's and CUDA's versions and the NVIDIA
// driver's, and how LibTorch computes on this CPU here (its threads and the vector kernels it may
// take, both set by the environment as much as by the CPU). llm-train fills it; `llm-train
// --version --json` prints ToJson(), which llm-agent and llmctl read back with
// ParseTrainerVersions: a rate probe measured by another llm-train, or by this one computing
// otherwise, is measured again.
#ifndef LLMCTL_COMMON_TRAINER_VERSIONS_H_
#define LLMCTL_COMMON_TRAINER_VERSIONS_H_

#include <chrono>
#include <stop_token>
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
  // Since 12-04 (0 and "" from an older llm-train):
  int cpu_threads = 0;              // LibTorch's intra-op threads (MKL's count: OMP_NUM_THREADS,
                                    // MKL_NUM_THREADS, the cores it may use)
  std::string aten_cpu_capability;  // ATen's CPU kernels: "AVX512", "AVX2", "DEFAULT"
                                    // (ATEN_CPU_CAPABILITY may cap them)
  std::string onednn_isa_cap;       // oneDNN's cap (common/cpu_matmul.h OneDnnIsaCapName); "" none

  // One line: "llm-train 0.4.0 (LibTorch 2.15.0, CUDA available)" or "..., no CUDA device)".
  std::string Summary() const;
  // Summary() and, when known, "LibTorch built for CUDA 13.2" and "CUDA runtime 13.0, NVIDIA
  // driver 580.95.05 (supports CUDA up to 13.0)", one a line, ending in a newline.
  std::string ToText() const;
  // "2 threads, ATen AVX512, oneDNN at most AVX2" (the cap only when there is one); "" from an
  // llm-train that does not say.
  std::string CpuKernels() const;
  // CpuKernels(), or "threads and kernels not recorded" where it is "", as a message says it.
  std::string CpuKernelsOrUnrecorded() const;
  // One line of JSON, the keys as the fields above.
  std::string ToJson() const;
};

// ToJson's output. InvalidArgument naming what is wrong: not JSON, or a field missing or of the
// wrong type (llmctl and libtorch are required; the others default to empty and 0), or a count
// out of range.
StatusOr<TrainerVersions> ParseTrainerVersions(std::string_view json);

// Runs `llm_train --version --json` (common/run_command.h: killed after `timeout`, or when `stop`
// is requested) and parses what it prints: how the agent and llmctl learn what the llm-train beside
// them is and how it computes here. RunCommand's errors (NotFound, Cancelled); Unavailable when it
// exits other than 0; ParseTrainerVersions' InvalidArgument when it answers something else.
StatusOr<TrainerVersions> AskTrainerVersions(const std::string& llm_train,
                                             std::chrono::milliseconds timeout,
                                             std::stop_token stop = {});

}  // namespace llmctl

#endif  // LLMCTL_COMMON_TRAINER_VERSIONS_H_
