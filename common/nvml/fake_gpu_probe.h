// FakeGpuProbe: a GpuProbe with set readings, for tests of code above NVML on machines without a
// GPU. Thread-safe, so a test may change readings while a sampler thread reads them.
#ifndef LLMCTL_COMMON_NVML_FAKE_GPU_PROBE_H_
#define LLMCTL_COMMON_NVML_FAKE_GPU_PROBE_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/nvml/gpu_probe.h"

namespace llmctl::nvml {

struct FakeGpu {
  std::string name = "NVIDIA H100 80GB HBM3";
  GpuMemory memory{0, 80LL << 30};
  GpuUtilization utilization;
  bool reports_utilization = true;  // false: Not Supported, as on a GPU in MIG mode
  std::optional<int64_t> power_milliwatts = 70'000;  // nullopt: the GPU reports none
  std::optional<int> temperature_celsius = 30;       // nullopt: the GPU reports none
  bool lost = false;  // every call about it fails, as NVML's do for a GPU that fell off the bus
};

class FakeGpuProbe final : public GpuProbe {
 public:
  explicit FakeGpuProbe(std::vector<FakeGpu> gpus, std::string driver_version = "580.95.05",
                        CudaVersion driver_cuda = {13, 0})
      : gpus_(std::move(gpus)),
        driver_version_(std::move(driver_version)),
        driver_cuda_(driver_cuda) {}

  void SetGpu(int device, FakeGpu gpu) LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    gpus_.at(device) = std::move(gpu);
  }

  StatusOr<int> DeviceCount() override LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return static_cast<int>(gpus_.size());
  }
  StatusOr<std::string> Name(int device) override {
    ASSIGN_OR_RETURN(FakeGpu gpu, Gpu(device, "nvmlDeviceGetName"));
    return gpu.name;
  }
  StatusOr<GpuMemory> Memory(int device) override {
    ASSIGN_OR_RETURN(FakeGpu gpu, Gpu(device, "nvmlDeviceGetMemoryInfo"));
    return gpu.memory;
  }
  StatusOr<GpuUtilization> Utilization(int device) override {
    ASSIGN_OR_RETURN(FakeGpu gpu, Gpu(device, "nvmlDeviceGetUtilizationRates"));
    if (!gpu.reports_utilization) return NotSupported("nvmlDeviceGetUtilizationRates", device);
    return gpu.utilization;
  }
  StatusOr<int64_t> PowerMilliwatts(int device) override {
    ASSIGN_OR_RETURN(FakeGpu gpu, Gpu(device, "nvmlDeviceGetPowerUsage"));
    if (!gpu.power_milliwatts) return NotSupported("nvmlDeviceGetPowerUsage", device);
    return *gpu.power_milliwatts;
  }
  StatusOr<int> TemperatureCelsius(int device) override {
    ASSIGN_OR_RETURN(FakeGpu gpu, Gpu(device, "nvmlDeviceGetTemperature"));
    if (!gpu.temperature_celsius) return NotSupported("nvmlDeviceGetTemperature", device);
    return *gpu.temperature_celsius;
  }
  StatusOr<std::string> DriverVersion() override { return driver_version_; }
  StatusOr<CudaVersion> DriverCudaVersion() override { return driver_cuda_; }

 private:
  // The real probe's messages, so tests see what a node would report.
  static Status Error(const std::string& call, int device, const std::string& what) {
    return UnavailableError("NVML " + call + "(device " + std::to_string(device) + "): " + what);
  }
  static Status NotSupported(const std::string& call, int device) {
    return Error(call, device, "Not Supported");
  }
  StatusOr<FakeGpu> Gpu(int device, const std::string& call) LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    if (device < 0 || device >= static_cast<int>(gpus_.size())) {
      return Error("nvmlDeviceGetHandleByIndex_v2", device, "Invalid Argument");
    }
    if (gpus_[device].lost) return Error(call, device, "GPU is lost");
    return gpus_[device];
  }

  Mutex mutex_;
  std::vector<FakeGpu> gpus_ LLMCTL_GUARDED_BY(mutex_);
  const std::string driver_version_;
  const CudaVersion driver_cuda_;
};

}  // namespace llmctl::nvml

#endif  // LLMCTL_COMMON_NVML_FAKE_GPU_PROBE_H_
