#include "common/estimate/memory_verdict.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace llmctl::estimate {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(MemoryVerdictTest, ACpuBudgetIsExact) {
  // The counting allocator refuses past the budget and holds nothing beyond what it allocates.
  const MemoryLimit limit = CpuBudgetLimit(216 * kMiB);
  EXPECT_EQ(limit.bytes, 216 * kMiB);
  EXPECT_EQ(limit.safe_bytes, 216 * kMiB);
  EXPECT_EQ(VerdictOf(216 * kMiB, limit), MemoryVerdict::kFits);
  EXPECT_EQ(VerdictOf(216 * kMiB + 1, limit), MemoryVerdict::kOom);
}

TEST(MemoryVerdictTest, ACudaBudgetKeepsTheCachingAllocatorsSlack) {
  const MemoryLimit limit = CudaBudgetLimit(100 * kGiB);
  EXPECT_EQ(limit.bytes, 100 * kGiB);
  EXPECT_EQ(limit.safe_bytes, 95 * kGiB);
  EXPECT_EQ(VerdictOf(95 * kGiB, limit), MemoryVerdict::kFits);
  EXPECT_EQ(VerdictOf(95 * kGiB + 1, limit), MemoryVerdict::kTight);
  EXPECT_EQ(VerdictOf(100 * kGiB, limit), MemoryVerdict::kTight);
  EXPECT_EQ(VerdictOf(100 * kGiB + 1, limit), MemoryVerdict::kOom);
}

TEST(MemoryVerdictTest, AWholeCardLosesItsContextToo) {
  // An A100 80GB: 81,920 MiB, less 1 GiB of context, less 5% of the card for the allocator.
  const MemoryLimit limit = CudaCardLimit(81920 * kMiB);
  EXPECT_EQ(limit.bytes, 80896 * kMiB);
  EXPECT_EQ(limit.safe_bytes, 80896 * kMiB - 4096 * kMiB);
  // experiments/single-llama-a100.yaml's 13B rows with 8-bit AdamW (79,817.8 MiB), and with
  // activation checkpointing too (75,434.5 MiB).
  EXPECT_EQ(VerdictOf(79818 * kMiB, limit), MemoryVerdict::kTight);
  EXPECT_EQ(VerdictOf(75435 * kMiB, limit), MemoryVerdict::kFits);
  EXPECT_EQ(VerdictOf(80897 * kMiB, limit), MemoryVerdict::kOom);
}

TEST(MemoryVerdictTest, ACardSmallerThanItsContextHoldsNothing) {
  const MemoryLimit limit = CudaCardLimit(512 * kMiB);
  EXPECT_EQ(limit.bytes, 0u);
  EXPECT_EQ(limit.safe_bytes, 0u);
  EXPECT_EQ(VerdictOf(1, limit), MemoryVerdict::kOom);
}

TEST(MemoryVerdictTest, ABudgetOnACardTakesTheTighterOfEach) {
  const MemoryLimit card = CudaCardLimit(81920 * kMiB);
  const MemoryLimit budget = CudaBudgetLimit(80000 * kMiB);
  const MemoryLimit both = Tighter(card, budget);
  EXPECT_EQ(both.bytes, 80000 * kMiB);
  EXPECT_EQ(both.safe_bytes, budget.safe_bytes);  // 76,000 MiB, the card's 76,800
  EXPECT_EQ(Tighter(budget, card).bytes, both.bytes);
}

TEST(MemoryVerdictTest, NamesRoundTripAndNothingElseParses) {
  for (MemoryVerdict verdict : {MemoryVerdict::kFits, MemoryVerdict::kTight, MemoryVerdict::kOom}) {
    EXPECT_EQ(ParseVerdict(VerdictName(verdict)), verdict);
  }
  for (const char* other : {"", "OOM", "Fits", "fits ", "maybe"}) {
    EXPECT_FALSE(ParseVerdict(other).has_value()) << other;
  }
}

}  // namespace
}  // namespace llmctl::estimate
