// FakeDeviceSampler: a DeviceSampler with set readings, for tests of the recorder and the stream
// on any machine. Thread-safe, so a test may change the readings while the recorder samples.
#ifndef LLMCTL_AGENT_FAKE_DEVICE_SAMPLER_H_
#define LLMCTL_AGENT_FAKE_DEVICE_SAMPLER_H_

#include <set>
#include <string>
#include <vector>

#include "agent/device_sampler.h"
#include "common/mutex.h"

namespace llmctl::agent {

class FakeDeviceSampler final : public DeviceSampler {
 public:
  explicit FakeDeviceSampler(std::vector<DeviceReading> readings)
      : readings_(std::move(readings)) {}

  void SetReadings(std::vector<DeviceReading> readings) {
    MutexLock lock(mutex_);
    readings_ = std::move(readings);
  }
  // The targets sampled so far, and the runs forgotten.
  std::vector<SampleTarget> targets() const {
    MutexLock lock(mutex_);
    return targets_;
  }
  std::set<std::string> forgotten() const {
    MutexLock lock(mutex_);
    return forgotten_;
  }

  StatusOr<std::vector<DeviceReading>> Sample(const SampleTarget& target) override {
    MutexLock lock(mutex_);
    targets_.push_back(target);
    return readings_;
  }
  void Forget(const std::string& run_dir) override {
    MutexLock lock(mutex_);
    forgotten_.insert(run_dir);
  }

 private:
  mutable Mutex mutex_;
  std::vector<DeviceReading> readings_ LLMCTL_GUARDED_BY(mutex_);
  std::vector<SampleTarget> targets_ LLMCTL_GUARDED_BY(mutex_);
  std::set<std::string> forgotten_ LLMCTL_GUARDED_BY(mutex_);
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_FAKE_DEVICE_SAMPLER_H_
