// What this node offers: its devices, memory, CPU count, its NVIDIA driver and the trainer's
// versions.
#ifndef LLMCTL_AGENT_NODE_INFO_H_
#define LLMCTL_AGENT_NODE_INFO_H_

#include <cstdint>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "common/nvml/gpu_probe.h"
#include "common/status.h"

namespace llmctl::agent {

struct DeviceInfo {
  std::string type;  // "cpu" or "cuda"
  int index = 0;
  std::string name;
  int64_t memory_bytes = 0;
};

struct NodeFacts {
  std::vector<DeviceInfo> devices;
  int64_t host_memory_bytes = 0;
  int cpu_count = 0;
  std::string nvidia_driver_version;  // NVML's, "" without an NVIDIA driver
  std::string driver_cuda_version;    // the highest CUDA the driver supports, "" without one
  // From `llm-train --version --json`; "" when it does not answer that.
  std::string trainer_version;        // its summary line, "llm-train 0.4.0 (LibTorch 2.15.0, ...)"
  std::string libtorch_version;       // "2.15.0"
  std::string libtorch_cuda_version;  // the CUDA LibTorch was built for, "13.2"; "" for a CPU build
  std::string trainer_llmctl_version;  // the llmctl release llm-train is of, "0.4.0"
  // How its LibTorch computes on this CPU (TrainerVersions::CpuKernelsOrUnrecorded), "2 threads,
  // ATen AVX512".
  std::string trainer_cpu_kernels;
};

// The GPUs through NVML (nvml::OpenNvml) when it loads, else one cpu device with the host's
// memory; the driver's versions; `llm_train --version --json` (its process group killed within
// about 50 ms of `stop` being requested: the agent stopping waits for no trainer). Cancelled when
// `stop` ended it; a trainer that fails or does not answer leaves its versions "".
StatusOr<NodeFacts> ProbeNode(const std::string& llm_train, std::stop_token stop = {});
// The same with the GPUs from `gpus`; null: a machine without NVML.
StatusOr<NodeFacts> ProbeNode(const std::string& llm_train, nvml::GpuProbe* gpus,
                              std::stop_token stop = {});

// FailedPrecondition when `llm_train` says it is another llmctl release than this agent's
// (`facts.trainer_llmctl_version` against kVersion): a trial's settings mean what that llm-train
// makes of them, so the node takes no trial (docs/architecture.md, "Versions"). One line naming
// both versions and the fix. OK when they match, and when llm-train did not answer: its trials
// then fail with its own error.
Status CheckTrainerVersion(const std::string& llm_train, const NodeFacts& facts);

// Each GPU NVML lists as a cuda device: its index, name and total memory. The first call that
// fails ends the list with its error.
StatusOr<std::vector<DeviceInfo>> ListGpus(nvml::GpuProbe& gpus);

// MemTotal from /proc/meminfo's text, in bytes: 0 to INT64_MAX. InvalidArgument when it is missing,
// negative or too large for int64 in bytes.
StatusOr<int64_t> ParseMemTotal(std::string_view meminfo);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_NODE_INFO_H_
