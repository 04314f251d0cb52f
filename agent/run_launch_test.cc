// The worker's and the rate probe's environments: which GPUs they see, in whose order.
#include "agent/run_launch.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <string>
#include <vector>

namespace llmctl::agent {
namespace {

std::vector<std::string> EntriesNamed(const std::vector<std::string>& env,
                                      const std::string& name) {
  std::vector<std::string> entries;
  std::copy_if(env.begin(), env.end(), std::back_inserter(entries),
               [&](const std::string& entry) { return entry.starts_with(name + "="); });
  return entries;
}

// The agent's own values, as a node set up for other work might have them: the worker gets its own.
class RunLaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("CUDA_VISIBLE_DEVICES", "7", 1);
    setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST", 1);
  }
  void TearDown() override {
    unsetenv("CUDA_VISIBLE_DEVICES");
    unsetenv("CUDA_DEVICE_ORDER");
  }
};

TEST_F(RunLaunchTest, CudaWorkerCountsItsDevicesInNvmlsOrder) {
  WorkerLaunch launch;
  launch.trial_file.device = "cuda";
  launch.device_indices = {2, 3};
  const std::vector<std::string> env = WorkerEnvironment(launch, "run");
  EXPECT_EQ(EntriesNamed(env, "CUDA_VISIBLE_DEVICES"),
            std::vector<std::string>{"CUDA_VISIBLE_DEVICES=2,3"});
  EXPECT_EQ(EntriesNamed(env, "CUDA_DEVICE_ORDER"),
            std::vector<std::string>{"CUDA_DEVICE_ORDER=PCI_BUS_ID"});
}

TEST_F(RunLaunchTest, CpuWorkerSeesNoGpuSetting) {
  WorkerLaunch launch;
  launch.trial_file.device = "cpu";
  const std::vector<std::string> env = WorkerEnvironment(launch, "run");
  EXPECT_TRUE(EntriesNamed(env, "CUDA_VISIBLE_DEVICES").empty());
  EXPECT_TRUE(EntriesNamed(env, "CUDA_DEVICE_ORDER").empty());
}

// The rate probe measures CUDA's device 0 and names it by NVML's device 0: the same card only in
// PCI bus order.
TEST_F(RunLaunchTest, CudaProbeCountsDevicesInNvmlsOrder) {
  const std::vector<std::string> env = ProbeEnvironment("cuda");
  EXPECT_EQ(EntriesNamed(env, "CUDA_DEVICE_ORDER"),
            std::vector<std::string>{"CUDA_DEVICE_ORDER=PCI_BUS_ID"});
  EXPECT_TRUE(EntriesNamed(ProbeEnvironment("cpu"), "CUDA_DEVICE_ORDER").empty());
}

}  // namespace
}  // namespace llmctl::agent
