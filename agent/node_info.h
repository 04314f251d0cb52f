// What this node offers: its devices, memory, CPU count and the trainer's version.
#ifndef LLMCTL_AGENT_NODE_INFO_H_
#define LLMCTL_AGENT_NODE_INFO_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
  std::string trainer_version;  // `llm-train --version`, "" when it has none
};

// The GPUs from `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits`
// when nvidia-smi runs, else one cpu device with the host's memory; `llm_train --version`.
NodeFacts ProbeNode(const std::string& llm_train);

// nvidia-smi's CSV lines ("0, NVIDIA H100 PCIe, 81559": memory in MiB). InvalidArgument naming
// the line that does not fit.
StatusOr<std::vector<DeviceInfo>> ParseNvidiaSmiCsv(std::string_view csv);

// MemTotal from /proc/meminfo's text, in bytes. InvalidArgument when it is missing.
StatusOr<int64_t> ParseMemTotal(std::string_view meminfo);

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_NODE_INFO_H_
