#include "common/nvml/gpu_probe.h"

#include <gtest/gtest.h>

#include "common/nvml/fake_gpu_probe.h"

namespace llmctl::nvml {
namespace {

TEST(OpenNvmlTest, MissingLibraryIsUnavailableWithDlopensReason) {
  auto probe = OpenNvml("/nonexistent/libnvidia-ml.so.1");
  ASSERT_FALSE(probe.ok());
  EXPECT_EQ(probe.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(probe.status().message(),
            "NVML not available: /nonexistent/libnvidia-ml.so.1: cannot open shared object file: "
            "No such file or directory");
}

TEST(OpenNvmlTest, LibraryWithoutNvmlNamesTheMissingFunction) {
  auto probe = OpenNvml("libc.so.6");
  ASSERT_FALSE(probe.ok());
  EXPECT_EQ(probe.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(probe.status().message(), "NVML not available: libc.so.6 has no nvmlInit_v2");
}

// On a machine with an NVIDIA driver the real NVML answers; without one, the message says why.
TEST(OpenNvmlTest, ThisMachine) {
  auto probe = OpenNvml();
  if (!probe.ok()) {
    EXPECT_EQ(probe.status().code(), StatusCode::kUnavailable);
    EXPECT_TRUE(probe.status().message().starts_with("NVML not available: "))
        << probe.status().message();
    EXPECT_NE(probe.status().message().find("libnvidia-ml.so.1: cannot open"), std::string::npos)
        << probe.status().message();
    return;
  }
  auto count = (*probe)->DeviceCount();
  ASSERT_TRUE(count.ok()) << count.status().ToString();
  auto driver = (*probe)->DriverVersion();
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  EXPECT_FALSE(driver->empty());
  auto cuda = (*probe)->DriverCudaVersion();
  ASSERT_TRUE(cuda.ok()) << cuda.status().ToString();
  EXPECT_GE(cuda->major, 11);
  for (int i = 0; i < *count; ++i) {
    auto memory = (*probe)->Memory(i);
    ASSERT_TRUE(memory.ok()) << memory.status().ToString();
    EXPECT_GT(memory->total_bytes, 0);
    EXPECT_LE(memory->used_bytes, memory->total_bytes);
    auto name = (*probe)->Name(i);
    ASSERT_TRUE(name.ok()) << name.status().ToString();
    EXPECT_FALSE(name->empty());
    auto utilization = (*probe)->Utilization(i);
    ASSERT_TRUE(utilization.ok()) << utilization.status().ToString();
    EXPECT_LE(utilization->gpu_percent, 100);
  }
  auto past_the_end = (*probe)->Memory(*count);
  EXPECT_FALSE(past_the_end.ok());
  EXPECT_TRUE(past_the_end.status().message().starts_with("NVML nvmlDeviceGetHandleByIndex_v2"))
      << past_the_end.status().message();
}

TEST(FakeGpuProbeTest, ReportsItsReadingsAndNvmlsErrors) {
  FakeGpu first;
  first.memory = {1LL << 30, 80LL << 30};
  first.utilization = {97, 40};
  FakeGpu second;
  second.name = "NVIDIA A100-SXM4-40GB";
  second.power_milliwatts.reset();
  FakeGpuProbe probe({first, second}, "550.54.15", {12, 4});

  ASSERT_EQ(*probe.DeviceCount(), 2);
  EXPECT_EQ(probe.Memory(0)->used_bytes, 1LL << 30);
  EXPECT_EQ(probe.Utilization(0)->gpu_percent, 97);
  EXPECT_EQ(*probe.Name(1), "NVIDIA A100-SXM4-40GB");
  EXPECT_EQ(probe.PowerMilliwatts(1).status().message(),
            "NVML nvmlDeviceGetPowerUsage(device 1): Not Supported");
  EXPECT_EQ(probe.Memory(2).status().message(),
            "NVML nvmlDeviceGetHandleByIndex_v2(device 2): Invalid Argument");
  EXPECT_EQ(*probe.DriverVersion(), "550.54.15");
  EXPECT_EQ(probe.DriverCudaVersion()->ToString(), "12.4");

  first.utilization.gpu_percent = 3;
  probe.SetGpu(0, first);
  EXPECT_EQ(probe.Utilization(0)->gpu_percent, 3);
  second.lost = true;
  probe.SetGpu(1, second);
  EXPECT_EQ(probe.Memory(1).status().message(),
            "NVML nvmlDeviceGetMemoryInfo(device 1): GPU is lost");
}

}  // namespace
}  // namespace llmctl::nvml
