#include "agent/device_sampler.h"

#include "agent/procfs_sampler.h"
#include "common/event_stream.h"

namespace llmctl::agent {

StatusOr<std::vector<DeviceReading>> NvmlSampler::Sample(const SampleTarget& target) {
  std::vector<DeviceReading> readings;
  Status failure;
  for (int index : target.device_indices) {
    auto memory = probe_->Memory(index);
    if (!memory.ok()) {
      failure = memory.status();
      continue;
    }
    DeviceReading reading;
    reading.device = event_stream::CudaDeviceName(index);
    reading.memory_used_bytes = memory->used_bytes;
    reading.memory_total_bytes = memory->total_bytes;
    // Figures a GPU does not report are left out, not the reading: a GPU in MIG mode reports no
    // utilisation, and its memory is what the run's samples are for.
    if (auto utilization = probe_->Utilization(index); utilization.ok()) {
      reading.utilization_percent = utilization->gpu_percent;
    }
    if (auto milliwatts = probe_->PowerMilliwatts(index); milliwatts.ok()) {
      reading.power_watts = static_cast<double>(*milliwatts) / 1000;
    }
    if (auto celsius = probe_->TemperatureCelsius(index); celsius.ok()) {
      reading.temperature_celsius = *celsius;
    }
    readings.push_back(std::move(reading));
  }
  if (readings.empty() && !failure.ok()) return failure;
  return readings;
}

StatusOr<std::vector<DeviceReading>> NodeSampler::Sample(const SampleTarget& target) {
  if (target.device_type == "cuda") {
    if (gpu_ == nullptr) return std::vector<DeviceReading>();
    return gpu_->Sample(target);
  }
  return cpu_->Sample(target);
}

void NodeSampler::Forget(const std::string& run_dir) {
  cpu_->Forget(run_dir);
  if (gpu_ != nullptr) gpu_->Forget(run_dir);
}

std::unique_ptr<DeviceSampler> MakeNodeSampler() {
  std::unique_ptr<DeviceSampler> gpu;
  if (auto probe = nvml::OpenNvml(); probe.ok()) {
    gpu = std::make_unique<NvmlSampler>(std::move(*probe));
  }
  return std::make_unique<NodeSampler>(std::make_unique<ProcfsSampler>(), std::move(gpu));
}

}  // namespace llmctl::agent
