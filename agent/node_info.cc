#include "agent/node_info.h"

#include <unistd.h>

#include <charconv>
#include <fstream>
#include <sstream>

#include "agent/process.h"
#include "common/files.h"
#include "common/text.h"

namespace llmctl::agent {
namespace {

constexpr std::chrono::seconds kProbeTimeout{20};

template <typename T>
bool ParseInt(std::string_view text, T* value) {
  text = Trim(text);
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size();
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return std::string(Trim(line.substr(colon + 1)));
    }
  }
  return "cpu";
}

}  // namespace

StatusOr<std::vector<DeviceInfo>> ParseNvidiaSmiCsv(std::string_view csv) {
  std::vector<DeviceInfo> devices;
  std::istringstream lines{std::string(csv)};
  std::string line;
  while (std::getline(lines, line)) {
    if (Trim(line).empty()) continue;
    const size_t first = line.find(',');
    const size_t last = line.rfind(',');
    DeviceInfo device;
    device.type = "cuda";
    int64_t mib = 0;
    if (first == std::string::npos || first == last ||
        !ParseInt(std::string_view(line).substr(0, first), &device.index) ||
        !ParseInt(std::string_view(line).substr(last + 1), &mib)) {
      return InvalidArgumentError("nvidia-smi: cannot read the line '" + line +
                                  "' (expected: index, name, memory in MiB)");
    }
    device.name = std::string(Trim(std::string_view(line).substr(first + 1, last - first - 1)));
    device.memory_bytes = mib * 1024 * 1024;
    devices.push_back(device);
  }
  return devices;
}

StatusOr<int64_t> ParseMemTotal(std::string_view meminfo) {
  std::istringstream lines{std::string(meminfo)};
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("MemTotal:", 0) != 0) continue;
    std::string_view value = Trim(std::string_view(line).substr(9));
    if (value.ends_with("kB")) value = Trim(value.substr(0, value.size() - 2));
    int64_t kib = 0;
    if (!ParseInt(value, &kib)) break;
    return kib * 1024;
  }
  return InvalidArgumentError("/proc/meminfo has no readable MemTotal line");
}

NodeFacts ProbeNode(const std::string& llm_train) {
  NodeFacts facts;
  facts.cpu_count = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  if (auto meminfo = ReadFileToString("/proc/meminfo", 1 << 20); meminfo.ok()) {
    if (auto total = ParseMemTotal(*meminfo); total.ok()) facts.host_memory_bytes = *total;
  }
  auto smi = RunCommand(
      {"nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"},
      kProbeTimeout);
  if (smi.ok() && smi->exit_code == 0) {
    if (auto gpus = ParseNvidiaSmiCsv(smi->stdout_text); gpus.ok()) facts.devices = *gpus;
  }
  if (facts.devices.empty()) {
    facts.devices.push_back(DeviceInfo{"cpu", 0, CpuModelName(), facts.host_memory_bytes});
  }
  auto version = RunCommand({llm_train, "--version"}, kProbeTimeout);
  if (version.ok() && version->exit_code == 0) {
    facts.trainer_version = std::string(Trim(version->stdout_text));
  }
  return facts;
}

}  // namespace llmctl::agent
