// What the agent tells the controller of its node: host memory from /proc/meminfo, GPUs and the
// driver from NVML (FakeGpuProbe here), llm-train --version --json, a probe a stop ends.
#include "agent/node_info.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stop_token>
#include <string>
#include <thread>

#include "agent/agent_test_support.h"
#include "agent/process.h"
#include "common/files.h"
#include "common/nvml/fake_gpu_probe.h"
#include "common/status.h"

namespace llmctl::agent {
namespace {

namespace fs = std::filesystem;
using test_support::FreshTestDir;

TEST(NodeInfoTest, ParsesMeminfo) {
  EXPECT_EQ(*ParseMemTotal("MemFree: 1 kB\nMemTotal:       16384 kB\n"), 16384 * 1024);
  EXPECT_FALSE(ParseMemTotal("MemFree: 1 kB\n").ok());
}

// A MemTotal whose bytes pass int64 overflowed kib * 1024 (undefined behaviour; found by
// tests/fuzz/run_files_fuzz.cc), and a negative one was a host with negative memory.
TEST(NodeInfoTest, RefusesAMemTotalNoMachineHas) {
  constexpr int64_t kMaxKib = std::numeric_limits<int64_t>::max() / 1024;
  EXPECT_EQ(*ParseMemTotal("MemTotal: " + std::to_string(kMaxKib) + " kB\n"), kMaxKib * 1024);
  EXPECT_EQ(*ParseMemTotal("MemTotal: 0 kB\n"), 0);
  for (const std::string& meminfo :
       {std::string("MemTotal: -5 kB\n"), "MemTotal: " + std::to_string(kMaxKib + 1) + " kB\n",
        std::string("MemTotal: 9223372036854775807 kB\n")}) {
    const StatusOr<int64_t> total = ParseMemTotal(meminfo);
    ASSERT_FALSE(total.ok()) << meminfo << " read as " << *total;
    EXPECT_EQ(total.status().code(), StatusCode::kInvalidArgument);
  }
}

nvml::FakeGpuProbe TwoGpus() {
  nvml::FakeGpu h100;
  h100.memory.total_bytes = int64_t{81559} << 20;
  nvml::FakeGpu a100;
  a100.name = "NVIDIA A100-SXM4-80GB";
  a100.memory.total_bytes = int64_t{81920} << 20;
  return nvml::FakeGpuProbe({h100, a100}, "550.54.15", {12, 4});
}

TEST(NodeInfoTest, GpusAndTheDriverComeFromNvml) {
  nvml::FakeGpuProbe gpus = TwoGpus();
  const StatusOr<NodeFacts> probed = ProbeNode("/nonexistent/llm-train", &gpus);
  ASSERT_TRUE(probed.ok()) << probed.status().ToString();
  const NodeFacts& facts = *probed;
  ASSERT_EQ(facts.devices.size(), 2u);
  EXPECT_EQ(facts.devices[0].type, "cuda");
  EXPECT_EQ(facts.devices[0].name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(facts.devices[1].index, 1);
  EXPECT_EQ(facts.devices[1].name, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(facts.devices[1].memory_bytes, int64_t{81920} * 1024 * 1024);
  EXPECT_EQ(facts.nvidia_driver_version, "550.54.15");
  EXPECT_EQ(facts.driver_cuda_version, "12.4");
  EXPECT_EQ(facts.trainer_version, "");
  EXPECT_EQ(facts.libtorch_cuda_version, "");
}

TEST(NodeInfoTest, WithoutNvmlTheNodeIsOneCpu) {
  const StatusOr<NodeFacts> probed = ProbeNode("/nonexistent/llm-train", nullptr);
  ASSERT_TRUE(probed.ok()) << probed.status().ToString();
  const NodeFacts& facts = *probed;
  EXPECT_GT(facts.cpu_count, 0);
  EXPECT_GT(facts.host_memory_bytes, 0);
  ASSERT_EQ(facts.devices.size(), 1u);
  EXPECT_EQ(facts.devices[0].type, "cpu");
  EXPECT_EQ(facts.devices[0].memory_bytes, facts.host_memory_bytes);
  EXPECT_EQ(facts.nvidia_driver_version, "");
  EXPECT_EQ(facts.driver_cuda_version, "");
}

TEST(NodeInfoTest, ListingStopsAtNvmlsError) {
  nvml::FakeGpuProbe gpus({});
  EXPECT_TRUE(ListGpus(gpus)->empty());
  nvml::FakeGpu lost;
  lost.lost = true;
  nvml::FakeGpuProbe second_lost({nvml::FakeGpu{}, lost});
  EXPECT_EQ(ListGpus(second_lost).status().message(),
            "NVML nvmlDeviceGetName(device 1): GPU is lost");
}

// The agent reads llm-train --version --json; the summary line stays what reports name it by.
TEST(NodeInfoTest, TrainerVersionsComeFromItsJson) {
  const fs::path dir = FreshTestDir("node_info");
  const fs::path trainer = dir / "llm-train";
  {
    std::ofstream script(trainer);
    script << "#!/bin/sh\n"
              "[ \"$1 $2\" = \"--version --json\" ] || exit 9\n"
              "echo '{\"llmctl\": \"0.4.0\", \"libtorch\": \"2.15.0\", "
              "\"libtorch_cuda\": \"13.2\", \"cuda_devices\": 0}'\n";
  }
  fs::permissions(trainer, fs::perms::owner_all);
  nvml::FakeGpuProbe gpus = TwoGpus();
  const StatusOr<NodeFacts> probed = ProbeNode(trainer.string(), &gpus);
  ASSERT_TRUE(probed.ok()) << probed.status().ToString();
  const NodeFacts& facts = *probed;
  EXPECT_EQ(facts.trainer_version, "llm-train 0.4.0 (LibTorch 2.15.0, no CUDA device)");
  EXPECT_EQ(facts.libtorch_version, "2.15.0");
  EXPECT_EQ(facts.libtorch_cuda_version, "13.2");
  EXPECT_EQ(facts.trainer_cpu_kernels, "threads and kernels not recorded");

  // A report the agent cannot take (a thread count past any machine's) leaves the versions empty,
  // said in the log, and the node is still described.
  {
    std::ofstream script(trainer);
    script << "#!/bin/sh\n"
              "echo '{\"llmctl\": \"0.4.0\", \"libtorch\": \"2.15.0\", \"cpu_threads\": 1e30}'\n";
  }
  ::testing::internal::CaptureStderr();
  const StatusOr<NodeFacts> refused = ProbeNode(trainer.string(), &gpus);
  const std::string said = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();
  EXPECT_EQ(refused->trainer_version, "");
  EXPECT_EQ(refused->trainer_cpu_kernels, "");
  EXPECT_NE(said.find("llm-train --version --json: 'cpu_threads' is not a count"),
            std::string::npos)
      << said;
  fs::remove_all(dir);
}

// The agent stopping (SIGTERM) while llm-train --version runs at its start: the trainer's process
// group is killed and the probe ends Cancelled, instead of the agent waiting out the probe's
// 20-second timeout.
TEST(NodeInfoTest, StoppingEndsTheTrainersVersionProbe) {
  const fs::path dir = FreshTestDir("node_info_stop");
  const fs::path trainer = dir / "llm-train";
  const fs::path pid_file = dir / "helper.pid";
  // A trainer that hangs in a helper process of its own, whose pid it writes.
  std::ofstream(trainer) << "#!/bin/sh\nsleep 60 &\necho $! > '" << pid_file.string()
                         << "'\nwait\n";
  fs::permissions(trainer, fs::perms::owner_all);
  std::stop_source stop;
  std::thread stopper([&] {
    StatusOr<std::string> pid_text = NotFoundError("");
    while (!(pid_text = ReadFileToString(pid_file.string(), 64)).ok() ||
           !pid_text->ends_with("\n")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    stop.request_stop();
  });
  const StatusOr<NodeFacts> probed = ProbeNode(trainer.string(), nullptr, stop.get_token());
  stopper.join();
  // Cancelled, not the DeadlineExceeded of the probe's own 20-second timeout: the stop ended it.
  EXPECT_EQ(probed.status().code(), StatusCode::kCancelled) << probed.status().ToString();
  // The helper went with its group: gone, or a zombie until init reaps it (no start time then).
  const pid_t helper = std::stoi(*ReadFileToString(pid_file.string(), 64));
  for (int i = 0; i < 200 && ProcessStartTime(helper).has_value(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(ProcessStartTime(helper).has_value()) << "the trainer's helper outlived the probe";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace llmctl::agent
