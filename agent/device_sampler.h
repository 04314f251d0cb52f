// Device sampling: what the devices of a running trial are doing, read once a second by the
// agent's SampleRecorder (agent/sample_recorder.h) and streamed to the controller beside the
// trial's events. The OS sits behind DeviceSampler: ProcfsSampler (agent/procfs_sampler.h) reads a
// CPU trial's processes from /proc, NvmlSampler a GPU trial's devices through the one NVML binding
// (common/nvml), NodeSampler picks between them by the trial's device type, and tests hand the
// agent a FakeDeviceSampler (agent/fake_device_sampler.h).
#ifndef LLMCTL_AGENT_DEVICE_SAMPLER_H_
#define LLMCTL_AGENT_DEVICE_SAMPLER_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/nvml/gpu_probe.h"
#include "common/status.h"

namespace llmctl::agent {

// What to sample: one running trial.
struct SampleTarget {
  std::string run_dir;              // names the run from one call to the next
  std::string device_type;          // "cpu" or "cuda"
  std::vector<int> device_indices;  // cuda: the node's devices the run holds
  pid_t process_group = 0;  // the worker's process group (its children too); 0 while unknown
};

// One device's reading.
struct DeviceReading {
  std::string device;  // "cuda:N" (the node's index N), or "cpu"
  // GPU: NVML's utilisation, 0-100. CPU: the trial's processes' CPU time over wall time since the
  // previous reading, in percent of one core (180 = 1.8 cores); nullopt on the first reading.
  std::optional<double> utilization_percent;
  // GPU: memory in use on the device, by any process. CPU: the trial's processes' resident set.
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;             // the device's memory; on CPU the host's MemTotal
  std::optional<double> power_watts;          // GPU only
  std::optional<double> temperature_celsius;  // GPU only

  bool operator==(const DeviceReading&) const = default;
};

// Implementations are called from one thread (the recorder's) and need not be thread-safe.
class DeviceSampler {
 public:
  virtual ~DeviceSampler() = default;
  // The target's devices now, one reading each; none while there is nothing to read yet (no
  // worker). A device that cannot be read is left out; Unavailable when none of them could be.
  virtual StatusOr<std::vector<DeviceReading>> Sample(const SampleTarget& target) = 0;
  // The run is over: what was kept about it between calls can go.
  virtual void Forget(const std::string& run_dir) = 0;
};

// A GPU trial's devices through NVML: utilisation, memory used/total, power and temperature of
// each device the run holds (a GPU that reports no utilisation, power or temperature leaves that
// figure out; one whose memory cannot be read is left out).
class NvmlSampler final : public DeviceSampler {
 public:
  explicit NvmlSampler(std::unique_ptr<nvml::GpuProbe> probe) : probe_(std::move(probe)) {}
  StatusOr<std::vector<DeviceReading>> Sample(const SampleTarget& target) override;
  void Forget(const std::string&) override {}

 private:
  const std::unique_ptr<nvml::GpuProbe> probe_;
};

// Hands CPU trials to `cpu` and CUDA trials to `gpu`; a CUDA trial on a node without NVML (`gpu`
// null) has nothing to read.
class NodeSampler final : public DeviceSampler {
 public:
  NodeSampler(std::unique_ptr<DeviceSampler> cpu, std::unique_ptr<DeviceSampler> gpu)
      : cpu_(std::move(cpu)), gpu_(std::move(gpu)) {}
  StatusOr<std::vector<DeviceReading>> Sample(const SampleTarget& target) override;
  void Forget(const std::string& run_dir) override;

 private:
  const std::unique_ptr<DeviceSampler> cpu_;
  const std::unique_ptr<DeviceSampler> gpu_;  // null without NVML
};

// The node's own: ProcfsSampler for CPU trials, NvmlSampler when NVML loads (else CUDA trials go
// unsampled: a node without the NVIDIA driver has no GPU to run them on).
std::unique_ptr<DeviceSampler> MakeNodeSampler();

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_DEVICE_SAMPLER_H_
