#include "common/nvml/gpu_probe.h"

#include <dlfcn.h>

#include <utility>

namespace llmctl::nvml {
namespace {

// NVML's ABI as nvml.h declares it (NVIDIA's documented, stable C interface); declared here so
// that llmctl builds without nvml.h and never links libnvidia-ml.
using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
using nvmlDevice_t = struct nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
constexpr int kNvmlTemperatureGpu = 0;                 // NVML_TEMPERATURE_GPU
constexpr unsigned kNvmlDeviceNameBufferSize = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kNvmlDriverVersionBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

struct NvmlFunctions {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  const char* (*error_string)(nvmlReturn_t);
  nvmlReturn_t (*device_count)(unsigned*);
  nvmlReturn_t (*handle_by_index)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*memory_info)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*utilization_rates)(nvmlDevice_t, nvmlUtilization_t*);
  nvmlReturn_t (*power_usage)(nvmlDevice_t, unsigned*);
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*);
  nvmlReturn_t (*driver_version)(char*, unsigned);
  nvmlReturn_t (*cuda_driver_version)(int*);
};

template <typename Function>
Status Resolve(void* library, std::string_view path, const char* symbol, Function* function) {
  *function = reinterpret_cast<Function>(::dlsym(library, symbol));
  if (*function == nullptr) {
    return UnavailableError("NVML not available: " + std::string(path) + " has no " + symbol);
  }
  return Status::Ok();
}

Status ResolveAll(void* library, std::string_view path, NvmlFunctions* f) {
  RETURN_IF_ERROR(Resolve(library, path, "nvmlInit_v2", &f->init));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlShutdown", &f->shutdown));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlErrorString", &f->error_string));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlDeviceGetCount_v2", &f->device_count));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlDeviceGetHandleByIndex_v2", &f->handle_by_index));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlDeviceGetName", &f->name));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlDeviceGetMemoryInfo", &f->memory_info));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlDeviceGetUtilizationRates", &f->utilization_rates));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlDeviceGetPowerUsage", &f->power_usage));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlDeviceGetTemperature", &f->temperature));
  RETURN_IF_ERROR(Resolve(library, path, "nvmlSystemGetDriverVersion", &f->driver_version));
  RETURN_IF_ERROR(
      Resolve(library, path, "nvmlSystemGetCudaDriverVersion_v2", &f->cuda_driver_version));
  return Status::Ok();
}

class NvmlProbe final : public GpuProbe {
 public:
  NvmlProbe(void* library, const NvmlFunctions& functions) : library_(library), nvml_(functions) {}
  NvmlProbe(const NvmlProbe&) = delete;
  NvmlProbe& operator=(const NvmlProbe&) = delete;
  ~NvmlProbe() override {
    nvml_.shutdown();
    ::dlclose(library_);
  }

  StatusOr<int> DeviceCount() override {
    unsigned count = 0;
    RETURN_IF_ERROR(Check(nvml_.device_count(&count), "nvmlDeviceGetCount_v2"));
    return static_cast<int>(count);
  }

  StatusOr<std::string> Name(int device) override {
    ASSIGN_OR_RETURN(nvmlDevice_t handle, Handle(device));
    char name[kNvmlDeviceNameBufferSize] = {};
    RETURN_IF_ERROR(Check(nvml_.name(handle, name, sizeof(name)), "nvmlDeviceGetName", device));
    return std::string(name);
  }

  StatusOr<GpuMemory> Memory(int device) override {
    ASSIGN_OR_RETURN(nvmlDevice_t handle, Handle(device));
    nvmlMemory_t memory{};
    RETURN_IF_ERROR(Check(nvml_.memory_info(handle, &memory), "nvmlDeviceGetMemoryInfo", device));
    return GpuMemory{static_cast<int64_t>(memory.used), static_cast<int64_t>(memory.total)};
  }

  StatusOr<GpuUtilization> Utilization(int device) override {
    ASSIGN_OR_RETURN(nvmlDevice_t handle, Handle(device));
    nvmlUtilization_t rates{};
    RETURN_IF_ERROR(
        Check(nvml_.utilization_rates(handle, &rates), "nvmlDeviceGetUtilizationRates", device));
    return GpuUtilization{static_cast<int>(rates.gpu), static_cast<int>(rates.memory)};
  }

  StatusOr<int64_t> PowerMilliwatts(int device) override {
    ASSIGN_OR_RETURN(nvmlDevice_t handle, Handle(device));
    unsigned milliwatts = 0;
    RETURN_IF_ERROR(
        Check(nvml_.power_usage(handle, &milliwatts), "nvmlDeviceGetPowerUsage", device));
    return static_cast<int64_t>(milliwatts);
  }

  StatusOr<int> TemperatureCelsius(int device) override {
    ASSIGN_OR_RETURN(nvmlDevice_t handle, Handle(device));
    unsigned celsius = 0;
    RETURN_IF_ERROR(Check(nvml_.temperature(handle, kNvmlTemperatureGpu, &celsius),
                          "nvmlDeviceGetTemperature", device));
    return static_cast<int>(celsius);
  }

  StatusOr<std::string> DriverVersion() override {
    char version[kNvmlDriverVersionBufferSize] = {};
    RETURN_IF_ERROR(
        Check(nvml_.driver_version(version, sizeof(version)), "nvmlSystemGetDriverVersion"));
    return std::string(version);
  }

  StatusOr<CudaVersion> DriverCudaVersion() override {
    int version = 0;
    RETURN_IF_ERROR(
        Check(nvml_.cuda_driver_version(&version), "nvmlSystemGetCudaDriverVersion_v2"));
    return CudaVersion::FromInt(version);
  }

 private:
  // "NVML nvmlDeviceGetPowerUsage(device 0): Not Supported"
  Status Check(nvmlReturn_t result, std::string_view call, int device = -1) const {
    if (result == kNvmlSuccess) return Status::Ok();
    std::string where(call);
    if (device >= 0) where += "(device " + std::to_string(device) + ")";
    return UnavailableError("NVML " + where + ": " + nvml_.error_string(result));
  }

  StatusOr<nvmlDevice_t> Handle(int device) {
    if (device < 0) {
      return InvalidArgumentError("NVML: device " + std::to_string(device) + " is negative");
    }
    nvmlDevice_t handle = nullptr;
    RETURN_IF_ERROR(Check(nvml_.handle_by_index(static_cast<unsigned>(device), &handle),
                          "nvmlDeviceGetHandleByIndex_v2", device));
    return handle;
  }

  void* library_;  // owned: dlclose'd after nvmlShutdown
  NvmlFunctions nvml_;
};

}  // namespace

StatusOr<std::unique_ptr<GpuProbe>> OpenNvml(std::string_view library) {
  const std::string path(library);
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) return UnavailableError(std::string("NVML not available: ") + ::dlerror());
  NvmlFunctions functions{};
  if (Status resolved = ResolveAll(handle, path, &functions); !resolved.ok()) {
    ::dlclose(handle);
    return resolved;
  }
  if (const nvmlReturn_t result = functions.init(); result != kNvmlSuccess) {
    Status failed = UnavailableError("NVML not available: nvmlInit_v2: " +
                                     std::string(functions.error_string(result)));
    ::dlclose(handle);
    return failed;
  }
  return std::unique_ptr<GpuProbe>(std::make_unique<NvmlProbe>(handle, functions));
}

}  // namespace llmctl::nvml
