#include "trainer/train/machine_pace.h"

#include <gtest/gtest.h>

#include "trainer/memory/counting_allocator.h"

namespace llmctl::trainer {
namespace {

// The canary takes time and no byte from LibTorch's allocator: a trial that times it after each
// step keeps its allocated and peak bytes exact.
TEST(PaceCanaryTest, TakesTimeAndNoAllocatorBytes) {
  CountingCpuAllocator& allocator = CountingCpuAllocator::Install();
  PaceCanary canary;
  canary.Run();  // LibTorch's first call sets up its threads and kernels
  const uint64_t before = allocator.device().allocated_bytes;
  allocator.ResetPeaks();
  const double seconds = canary.Seconds();
  EXPECT_GT(seconds, 0);
  EXPECT_LT(seconds, 1) << "a second is no machine's pace (estimate::kPaceSecondsMax)";
  EXPECT_EQ(allocator.device().allocated_bytes, before);
  EXPECT_EQ(allocator.device().peak_bytes, before);
}

}  // namespace
}  // namespace llmctl::trainer
