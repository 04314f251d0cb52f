// Device samplers: /proc read for a real child process of this test, /proc stat lines, NVML's
// figures through FakeGpuProbe, the samples file's line format.
#include "agent/device_sampler.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "agent/procfs_sampler.h"
#include "agent/sample_recorder.h"
#include "common/nvml/fake_gpu_probe.h"

namespace llmctl::agent {
namespace {

// A child busy in a loop and holding 64 MiB, in a process group of its own; killed on
// destruction.
class BusyChild {
 public:
  BusyChild() {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setpgid(0, 0);
      std::vector<char> held(64 << 20, 1);  // resident: every page written
      volatile char sink = 0;
      for (size_t i = 0;; i = (i + 4096) % held.size()) sink = sink + held[i];
    }
    ::setpgid(pid_, pid_);  // also here, so the group exists before the test reads it
  }
  ~BusyChild() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = 0;
};

TEST(ProcfsSamplerTest, ReadsARealChildsCpuAndResidentMemory) {
  BusyChild child;
  ProcfsSampler sampler;
  const SampleTarget target{"run-a", "cpu", {}, child.pid()};
  // The child writes its 64 MiB first; wait until it has (it is resident once written).
  DeviceReading first;
  for (int i = 0; i < 500; ++i) {
    StatusOr<std::vector<DeviceReading>> readings = sampler.Sample(target);
    ASSERT_TRUE(readings.ok()) << readings.status().ToString();
    ASSERT_EQ(readings->size(), 1u);
    first = (*readings)[0];
    if (first.memory_used_bytes > (64 << 20)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(first.device, "cpu");
  EXPECT_GT(first.memory_used_bytes, 64 << 20);
  EXPECT_GT(first.memory_total_bytes, first.memory_used_bytes);
  EXPECT_FALSE(first.power_watts.has_value());

  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  StatusOr<std::vector<DeviceReading>> second = sampler.Sample(target);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_EQ(second->size(), 1u);
  ASSERT_TRUE((*second)[0].utilization_percent.has_value());
  // One busy thread: more than nothing (it ran), at most one core (plus a tick's rounding).
  EXPECT_GT(*(*second)[0].utilization_percent, 0.0);
  EXPECT_LE(*(*second)[0].utilization_percent, 110.0);

  // Another run starts measuring afresh; a forgotten one too.
  const SampleTarget other{"run-b", "cpu", {}, child.pid()};
  EXPECT_FALSE((*sampler.Sample(other))[0].utilization_percent.has_value());
  sampler.Forget("run-a");
  EXPECT_FALSE((*sampler.Sample(target))[0].utilization_percent.has_value());
}

TEST(ProcfsSamplerTest, NoProcessInTheGroupIsNoReading) {
  ProcfsSampler sampler;
  EXPECT_TRUE(sampler.Sample({"run", "cpu", {}, 0})->empty());  // no worker yet
  pid_t gone = 0;
  {
    BusyChild child;
    gone = child.pid();
  }
  EXPECT_TRUE(sampler.Sample({"run", "cpu", {}, gone})->empty());
}

TEST(ProcfsSamplerTest, StatLinesCountOnlyTheirGroupAndNamesWithParentheses) {
  // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
  // cutime cstime priority nice threads itrealvalue starttime vsize rss ...
  const std::string line =
      "4242 (a) b (c) R 1 77 77 0 -1 4194560 100 0 0 0 30 20 5 1 20 0 1 0 900 1000000 250 "
      "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";
  ProcessGroupUsage usage;
  EXPECT_TRUE(AddStatLine(line, 77, usage));
  EXPECT_EQ(usage.processes, 1);
  EXPECT_EQ(usage.cpu_ticks, 30 + 20 + 5 + 1);
  EXPECT_EQ(usage.rss_pages, 250);
  EXPECT_TRUE(AddStatLine(line, 78, usage));  // another group: not counted
  EXPECT_EQ(usage.processes, 1);
  EXPECT_FALSE(AddStatLine("4242 (a) R 1 77", 77, usage));
  EXPECT_FALSE(AddStatLine("garbage", 77, usage));
  EXPECT_EQ(usage.processes, 1);
}

TEST(NvmlSamplerTest, ReadsEachHeldDeviceAndLeavesOutWhatItDoesNotReport) {
  auto probe = std::make_unique<nvml::FakeGpuProbe>(std::vector<nvml::FakeGpu>(3));
  nvml::FakeGpuProbe& fake = *probe;
  nvml::FakeGpu busy;
  busy.memory = {int64_t{49} << 30, int64_t{80} << 30};
  busy.utilization.gpu_percent = 45;
  busy.power_milliwatts = 312'500;
  busy.temperature_celsius = 64;
  fake.SetGpu(2, busy);
  // As a GPU in MIG mode: no utilisation, power or temperature, but its memory.
  nvml::FakeGpu quiet;
  quiet.reports_utilization = false;
  quiet.power_milliwatts.reset();
  quiet.temperature_celsius.reset();
  quiet.memory = {int64_t{3} << 30, int64_t{80} << 30};
  fake.SetGpu(0, quiet);
  NvmlSampler sampler(std::move(probe));

  auto readings = sampler.Sample({"run", "cuda", {2, 0}, 0});
  ASSERT_TRUE(readings.ok()) << readings.status().ToString();
  ASSERT_EQ(readings->size(), 2u);
  EXPECT_EQ((*readings)[0], (DeviceReading{.device = "cuda:2",
                                           .utilization_percent = 45,
                                           .memory_used_bytes = int64_t{49} << 30,
                                           .memory_total_bytes = int64_t{80} << 30,
                                           .power_watts = 312.5,
                                           .temperature_celsius = 64}));
  EXPECT_EQ((*readings)[1], (DeviceReading{.device = "cuda:0",
                                           .utilization_percent = std::nullopt,
                                           .memory_used_bytes = int64_t{3} << 30,
                                           .memory_total_bytes = int64_t{80} << 30,
                                           .power_watts = std::nullopt,
                                           .temperature_celsius = std::nullopt}));

  // A device NVML cannot read is left out; with none readable, the error says why.
  EXPECT_EQ(sampler.Sample({"run", "cuda", {1, 7}, 0})->size(), 1u);
  auto none = sampler.Sample({"run", "cuda", {7}, 0});
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("device 7"), std::string::npos);
}

TEST(NodeSamplerTest, CudaTrialsWithoutNvmlHaveNothingToRead) {
  auto gpu = std::make_unique<NvmlSampler>(
      std::make_unique<nvml::FakeGpuProbe>(std::vector<nvml::FakeGpu>(1)));
  NodeSampler with_gpu(std::make_unique<ProcfsSampler>(), std::move(gpu));
  EXPECT_EQ(with_gpu.Sample({"run", "cuda", {0}, 0})->size(), 1u);
  EXPECT_TRUE(with_gpu.Sample({"run", "cpu", {}, 0})->empty());  // no worker
  NodeSampler without_gpu(std::make_unique<ProcfsSampler>(), nullptr);
  EXPECT_TRUE(without_gpu.Sample({"run", "cuda", {0}, 0})->empty());
}

TEST(SampleLineTest, RoundTripsAndRefusesWhatItDidNotWrite) {
  const TimedReading gpu{1'732'550'000'123, DeviceReading{.device = "cuda:0",
                                                          .utilization_percent = 45,
                                                          .memory_used_bytes = 65'712'160'768,
                                                          .memory_total_bytes = 85'899'345'920,
                                                          .power_watts = 312.5,
                                                          .temperature_celsius = 64}};
  const TimedReading cpu{1'732'550'000'124, DeviceReading{.device = "cpu",
                                                          .utilization_percent = std::nullopt,
                                                          .memory_used_bytes = 1 << 30,
                                                          .memory_total_bytes = int64_t{24} << 30,
                                                          .power_watts = std::nullopt,
                                                          .temperature_celsius = std::nullopt}};
  for (const TimedReading& timed : {gpu, cpu}) {
    auto parsed = ParseSampleLine(FormatSampleLine(timed));
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    EXPECT_EQ(parsed->unix_ms, timed.unix_ms);
    EXPECT_EQ(parsed->reading, timed.reading);
  }
  EXPECT_EQ(FormatSampleLine(cpu).find("power"), std::string::npos);
  for (const char* bad :
       {"", "[]", R"({"device":"cpu","memory_used_bytes":1,"memory_total_bytes":2})",
        R"({"unix_ms":1,"device":"","memory_used_bytes":1,"memory_total_bytes":2})",
        R"({"unix_ms":1,"device":"cpu","memory_used_bytes":-1,"memory_total_bytes":2})",
        R"({"unix_ms":1,"device":"cpu","memory_used_bytes":1,"memory_total_bytes":2,)"
        R"("power_watts":"hot"})",
        R"({"unix_ms":1,"device":"cpu","memory_used_bytes":1})"}) {
    EXPECT_EQ(ParseSampleLine(bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace llmctl::agent
