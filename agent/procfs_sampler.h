// ProcfsSampler: a CPU trial's "device" is its processes, read from /proc: the worker's process
// group (llm-train and any process it started) summed: CPU time (user + system, with that of
// children already reaped) over the wall time since the previous reading, and resident memory
// (pages shared between the processes count once per process); the host's MemTotal as the total.
#ifndef LLMCTL_AGENT_PROCFS_SAMPLER_H_
#define LLMCTL_AGENT_PROCFS_SAMPLER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "agent/device_sampler.h"

namespace llmctl::agent {

// The processes of one process group at one moment.
struct ProcessGroupUsage {
  int processes = 0;
  int64_t cpu_ticks = 0;  // utime + stime + cutime + cstime, in clock ticks
  int64_t rss_pages = 0;
};

// Adds one /proc/<pid>/stat line to `usage` when the process is in `process_group`; false when the
// line does not parse.
bool AddStatLine(std::string_view stat, pid_t process_group, ProcessGroupUsage& usage);

class ProcfsSampler final : public DeviceSampler {
 public:
  // `proc` is where procfs is mounted.
  explicit ProcfsSampler(std::string proc = "/proc");
  StatusOr<std::vector<DeviceReading>> Sample(const SampleTarget& target) override;
  void Forget(const std::string& run_dir) override { previous_.erase(run_dir); }

 private:
  struct Previous {
    std::chrono::steady_clock::time_point at;
    int64_t cpu_ticks = 0;
  };
  StatusOr<ProcessGroupUsage> ReadGroup(pid_t process_group) const;

  const std::string proc_;
  const double ticks_per_second_;
  const int64_t page_bytes_;
  std::map<std::string, Previous> previous_;  // by run directory
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_PROCFS_SAMPLER_H_
