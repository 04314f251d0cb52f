// A trial's speed check (speed_check.h) on the CPU: it measures a rate, leaves the trial's random
// stream where it was and counts nothing in the device pool. No test asserts a rate's size: that
// depends on the machine.
#include "trainer/train/speed_check.h"

#include <gtest/gtest.h>

#include <cmath>

#include "trainer/memory/accounting.h"

namespace llmctl::trainer {
namespace {

TEST(SpeedCheckTest, MeasuresARateAndLeavesTheRandomStreamWhereItWas) {
  torch::manual_seed(7);
  const torch::Tensor without_check = torch::randn({16});
  torch::manual_seed(7);
  const StatusOr<double> rate = MeasureSpeedCheck(torch::Device(torch::kCPU));
  ASSERT_TRUE(rate.ok()) << rate.status().message();
  EXPECT_TRUE(std::isfinite(*rate) && *rate > 0) << *rate;
  EXPECT_TRUE(torch::equal(torch::randn({16}), without_check))
      << "the check drew from the trial's generator";
}

// Its operands are the host pool's: a trial's peak, and a budget that the trial just fits, do not
// see them.
TEST(SpeedCheckTest, CountsNothingInTheDevicePool) {
  StatusOr<DeviceMemory> memory = DeviceMemory::For(torch::Device(torch::kCPU));
  ASSERT_TRUE(memory.ok()) << memory.status().message();
  const torch::Tensor held = torch::ones({1024});
  memory->ResetPeak();
  const uint64_t allocated = memory->allocated_bytes();
  ASSERT_TRUE(memory->SetBudget(allocated).ok());
  const StatusOr<double> rate = MeasureSpeedCheck(torch::Device(torch::kCPU));
  ASSERT_TRUE(memory->SetBudget(std::nullopt).ok());
  ASSERT_TRUE(rate.ok()) << rate.status().message();
  EXPECT_EQ(memory->allocated_bytes(), allocated);
  EXPECT_EQ(memory->peak_bytes(), allocated);
}

}  // namespace
}  // namespace llmctl::trainer
