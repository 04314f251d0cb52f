// SampleRecorder: once an interval (a second by default) it samples the devices of every running
// run (agent/device_sampler.h) and appends the readings to the run's samples.jsonl, one JSON line
// per device reading, beside llm-train's events.jsonl:
//
//   {"unix_ms":1732550000123,"device":"cuda:0","utilization_percent":45,
//    "memory_used_bytes":65712160768,"memory_total_bytes":85899345920,"power_watts":312.5,
//    "temperature_celsius":64}
//
// As with events, a line's number in the file is the reading's sequence number: StreamEvents sends
// readings from any number on, so a controller resumes where it stopped, and the file outlives an
// agent restart (the next agent appends to it). The file is the agent's own, never llm-train's:
// the trainer's event contract is untouched. A reading's unix_ms is ReadingDates'.
#ifndef LLMCTL_AGENT_SAMPLE_RECORDER_H_
#define LLMCTL_AGENT_SAMPLE_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <thread>

#include "agent/device_sampler.h"
#include "agent/runs.h"
#include "agent/sample_line.h"
#include "common/mutex.h"
#include "common/status.h"

namespace llmctl::agent {

inline constexpr char kSamplesFile[] = "samples.jsonl";

// When a run's readings are dated (their unix_ms): the wall clock at the run's first reading, then
// the monotonic clock's time since. llm-train dates its snapshots alike (its start on the wall
// clock, their elapsed_ms on the monotonic one), so the readings stay placed against them, and in
// the order they were read, when NTP steps the wall clock during the run (chrony setting a node's
// wrong clock right, minutes or hours at once). Not thread-safe.
class ReadingDates {
 public:
  int64_t UnixMs(const std::string& run_dir, std::chrono::system_clock::time_point wall_now,
                 std::chrono::steady_clock::time_point steady_now);
  // The run ended: its next reading, if any, starts afresh.
  void Forget(const std::string& run_dir);

 private:
  struct FirstReading {
    std::chrono::system_clock::time_point wall;
    std::chrono::steady_clock::time_point steady;
  };
  std::map<std::string, FirstReading> first_readings_;
};

// Thread-safe.
class SampleRecorder {
 public:
  // Samples every `interval` on a thread of its own until destroyed. `runs` and `sampler` are not
  // owned and must outlive the recorder.
  SampleRecorder(RunManager* runs, DeviceSampler* sampler, std::chrono::milliseconds interval);
  ~SampleRecorder();
  SampleRecorder(const SampleRecorder&) = delete;
  SampleRecorder& operator=(const SampleRecorder&) = delete;

 private:
  void Loop();
  // One round: every running run's readings appended to its file; runs that ended are forgotten.
  void SampleOnce();

  RunManager* const runs_;
  DeviceSampler* const sampler_;
  const std::chrono::milliseconds interval_;
  std::set<std::string> sampled_;  // run directories sampled last round; only the thread's
  std::set<std::string> warned_;   // runs whose sampling failure was logged; only the thread's
  ReadingDates dates_;             // only the thread's

  Mutex mutex_;
  CondVar stop_;
  bool stopping_ LLMCTL_GUARDED_BY(mutex_) = false;
  std::thread thread_;
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_SAMPLE_RECORDER_H_
