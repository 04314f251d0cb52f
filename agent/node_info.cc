#include "agent/node_info.h"

#include <unistd.h>

#include <charconv>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

#include "common/cpu_model.h"
#include "common/files.h"
#include "common/logging.h"
#include "common/text.h"
#include "common/trainer_versions.h"
#include "common/version.h"

namespace llmctl::agent {
namespace {

constexpr std::chrono::seconds kProbeTimeout{20};

template <typename T>
bool ParseInt(std::string_view text, T* value) {
  text = Trim(text);
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return error == std::errc() && end == text.data() + text.size();
}

}  // namespace

StatusOr<std::vector<DeviceInfo>> ListGpus(nvml::GpuProbe& gpus) {
  ASSIGN_OR_RETURN(const int count, gpus.DeviceCount());
  std::vector<DeviceInfo> devices;
  for (int index = 0; index < count; ++index) {
    ASSIGN_OR_RETURN(std::string name, gpus.Name(index));
    ASSIGN_OR_RETURN(const nvml::GpuMemory memory, gpus.Memory(index));
    devices.push_back(DeviceInfo{"cuda", index, std::move(name), memory.total_bytes});
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
    // A negative figure or one whose bytes pass int64 (kib * 1024 would overflow) is no machine's.
    if (!ParseInt(value, &kib) || kib < 0 || kib > std::numeric_limits<int64_t>::max() / 1024) {
      break;
    }
    return kib * 1024;
  }
  return InvalidArgumentError("/proc/meminfo has no readable MemTotal line");
}

StatusOr<NodeFacts> ProbeNode(const std::string& llm_train, std::stop_token stop) {
  auto nvml = nvml::OpenNvml();
  // Without NVML this is a CPU node; the reason goes to the log, as progress rather than a warning:
  // it is how every machine without NVIDIA's driver starts.
  if (!nvml.ok())
    std::cerr << LogLinePrefix(LogLevel::kInfo)
              << "llm-agent: a CPU node: " << nvml.status().message() << std::endl;
  return ProbeNode(llm_train, nvml.ok() ? nvml->get() : nullptr, std::move(stop));
}

StatusOr<NodeFacts> ProbeNode(const std::string& llm_train, nvml::GpuProbe* gpus,
                              std::stop_token stop) {
  NodeFacts facts;
  facts.cpu_count = static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  if (auto meminfo = ReadFileToString("/proc/meminfo", 1 << 20); meminfo.ok()) {
    if (auto total = ParseMemTotal(*meminfo); total.ok()) facts.host_memory_bytes = *total;
  }
  if (gpus != nullptr) {
    if (auto listed = ListGpus(*gpus); listed.ok()) {
      facts.devices = *std::move(listed);
    } else {
      std::cerr << LogLinePrefix(LogLevel::kWarning)
                << "llm-agent: cannot list the GPUs: " << listed.status().message() << std::endl;
    }
    if (auto driver = gpus->DriverVersion(); driver.ok()) facts.nvidia_driver_version = *driver;
    if (auto cuda = gpus->DriverCudaVersion(); cuda.ok()) {
      facts.driver_cuda_version = cuda->ToString();
    }
  }
  if (facts.devices.empty()) {
    facts.devices.push_back(DeviceInfo{"cpu", 0, CpuModelName(), facts.host_memory_bytes});
  }
  const StatusOr<TrainerVersions> trainer =
      AskTrainerVersions(llm_train, kProbeTimeout, std::move(stop));
  if (trainer.status().code() == StatusCode::kCancelled) return trainer.status();
  if (trainer.ok()) {
    facts.trainer_version = trainer->Summary();
    facts.libtorch_version = trainer->libtorch;
    facts.libtorch_cuda_version = trainer->libtorch_cuda;
    facts.trainer_llmctl_version = trainer->llmctl;
    facts.trainer_cpu_kernels = trainer->CpuKernelsOrUnrecorded();
  } else if (trainer.status().code() == StatusCode::kInvalidArgument) {
    // It answered, but not with the report: said. One that does not answer fails its trials with
    // its own error.
    std::cerr << LogLinePrefix(LogLevel::kWarning) << "llm-agent: " << trainer.status().message()
              << std::endl;
  }
  return facts;
}

Status CheckTrainerVersion(const std::string& llm_train, const NodeFacts& facts) {
  const std::string& trainer = facts.trainer_llmctl_version;
  if (trainer.empty() || trainer == kVersion) return Status::Ok();
  const std::string version(kVersion);
  return FailedPreconditionError(
      std::string("its llm-train (")
          .append(llm_train)
          .append(") is llmctl ")
          .append(trainer)
          .append(", its agent llmctl ")
          .append(version)
          .append("; they must be the same version, so no trial runs there: install llmctl ")
          .append(version)
          .append("'s llm-train there and restart the agent (the embedded one: llmctl daemon "
                  "stop)"));
}

}  // namespace llmctl::agent
