// GpuProbe: what the NVIDIA driver says about this machine's GPUs, through NVML.
//
// OpenNvml() is the one way llmctl talks to NVML. libnvidia-ml.so.1 is loaded at run time (dlopen,
// never linked), so llm-agent and llm-train start on machines without an NVIDIA driver: there
// OpenNvml returns UNAVAILABLE "NVML not available: libnvidia-ml.so.1: cannot open ...", and the
// caller treats the machine as GPU-less. Code above the probe takes a GpuProbe& and is tested with
// FakeGpuProbe (common/nvml/fake_gpu_probe.h).
//
//   ASSIGN_OR_RETURN(std::unique_ptr<nvml::GpuProbe> probe, nvml::OpenNvml());
//   ASSIGN_OR_RETURN(int count, probe->DeviceCount());
//   for (int i = 0; i < count; ++i) { ASSIGN_OR_RETURN(nvml::GpuMemory memory, probe->Memory(i)); }
//
// Devices are NVML's indices 0..DeviceCount()-1 (PCI bus order, which is also CUDA's order when
// CUDA_DEVICE_ORDER=PCI_BUS_ID). Every call returns NVML's own error text (nvmlErrorString) on
// failure, e.g. "NVML nvmlDeviceGetPowerUsage(device 0): Not Supported"; a GPU that does not report
// power or temperature fails only that call. Safe to call from several threads (NVML is).
#ifndef LLMCTL_COMMON_NVML_GPU_PROBE_H_
#define LLMCTL_COMMON_NVML_GPU_PROBE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/cuda_version.h"
#include "common/status.h"

namespace llmctl::nvml {

struct GpuMemory {
  int64_t used_bytes = 0;
  int64_t total_bytes = 0;
};

// Percent of the last sample period (1/6 s to 1 s, by product) in which a kernel ran (gpu) or
// device memory was read or written (memory).
struct GpuUtilization {
  int gpu_percent = 0;
  int memory_percent = 0;
};

class GpuProbe {
 public:
  virtual ~GpuProbe() = default;

  virtual StatusOr<int> DeviceCount() = 0;
  virtual StatusOr<std::string> Name(int device) = 0;  // "NVIDIA H100 80GB HBM3"
  virtual StatusOr<GpuMemory> Memory(int device) = 0;
  virtual StatusOr<GpuUtilization> Utilization(int device) = 0;
  virtual StatusOr<int64_t> PowerMilliwatts(int device) = 0;
  virtual StatusOr<int> TemperatureCelsius(int device) = 0;  // the GPU die's sensor

  virtual StatusOr<std::string> DriverVersion() = 0;  // "580.95.05"
  // The highest CUDA version the installed driver supports (nvidia-smi's "CUDA Version").
  virtual StatusOr<CudaVersion> DriverCudaVersion() = 0;
};

inline constexpr std::string_view kNvmlLibrary = "libnvidia-ml.so.1";

// Loads `library` (tests name another), resolves the NVML functions and calls nvmlInit_v2. The
// probe calls nvmlShutdown and unloads the library when destroyed. UNAVAILABLE "NVML not
// available: <why>" when the library is missing, lacks a function or nvmlInit fails (no driver
// loaded).
StatusOr<std::unique_ptr<GpuProbe>> OpenNvml(std::string_view library = kNvmlLibrary);

}  // namespace llmctl::nvml

#endif  // LLMCTL_COMMON_NVML_GPU_PROBE_H_
