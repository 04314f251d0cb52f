#include "trainer/train/probe_rounds.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace llmctl::trainer {
namespace {

// A call that lasts at least `ms` milliseconds (sleep_for never returns early), counted.
struct CountedSleep {
  int* calls;
  int ms;
  void operator()() const {
    ++*calls;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
};

// A measurement whose one call is a sample (12 ms, past the 5 ms a sample lasts) is timed twice
// before the rounds, cold and warm, and the warm call is its first sample: the rounds take two
// more. One of shorter calls takes all three of its samples in the rounds.
TEST(ProbeRoundsTest, AOneCallMeasurementsWarmCallIsItsFirstSample) {
  ProbeRounds rounds(torch::Device(torch::kCPU));
  int long_calls = 0, short_calls = 0;
  double long_median = 0, short_median = 0;
  rounds.Add(CountedSleep{&long_calls, 12}, [&](double seconds) { long_median = seconds; });
  EXPECT_EQ(long_calls, 2) << "a cold call and a warm one of a sample's length end the timing";
  rounds.Add(CountedSleep{&short_calls, 1}, [&](double seconds) { short_median = seconds; });
  const int short_timing_calls = short_calls;
  // No seconds to spare: only the rounds that bring each measurement to three samples.
  EXPECT_EQ(rounds.Run(0), 3);
  EXPECT_EQ(long_calls, 2 + 2);
  EXPECT_GT(short_calls - short_timing_calls, 3) << "several 1 ms calls make each sample";
  EXPECT_GE(long_median, 0.012);
  EXPECT_GE(short_median, 0.001);
}

// A measurement another has warmed up is not timed to agreement: its one call of a sample's length
// is its first sample, and the rounds take two more; one of shorter calls, timed once, takes all
// three of its samples in the rounds, several calls each.
TEST(ProbeRoundsTest, AWarmMeasurementsFirstCallIsItsFirstSample) {
  ProbeRounds rounds(torch::Device(torch::kCPU));
  int long_calls = 0, short_calls = 0;
  double long_median = 0;
  EXPECT_GE(
      rounds.AddWarm(CountedSleep{&long_calls, 12}, [&](double seconds) { long_median = seconds; }),
      0.012);
  EXPECT_EQ(long_calls, 1);
  rounds.AddWarm(CountedSleep{&short_calls, 1}, [](double) {});
  EXPECT_EQ(short_calls, 1);
  EXPECT_EQ(rounds.Run(0), 3);
  EXPECT_EQ(long_calls, 1 + 2);
  EXPECT_GT(short_calls - 1, 3) << "several 1 ms calls make each sample";
  EXPECT_GE(long_median, 0.012);
}

// A CPU operand holds normal draws, one block repeated past its end: the shape, dtype and gradient
// flag asked for, the values finite and varied, the same under the same seed.
TEST(ProbeOperandTest, ACpuOperandRepeatsOneDrawnBlock) {
  const auto options = torch::TensorOptions().dtype(torch::kBFloat16).requires_grad(true);
  torch::manual_seed(7);
  const torch::Tensor operand = ProbeOperand({3, 64 << 10}, options);  // three blocks
  EXPECT_EQ(operand.sizes(), (std::vector<int64_t>{3, 64 << 10}));
  EXPECT_EQ(operand.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(operand.requires_grad());
  EXPECT_TRUE(operand.is_leaf());
  EXPECT_TRUE(operand.isfinite().all().item<bool>());
  const torch::Tensor block = operand[0];
  EXPECT_TRUE(torch::equal(operand[1], block));
  EXPECT_TRUE(torch::equal(operand[2], block));
  // Normal draws: about as many below zero as above, spread about 1.
  const double std = block.to(torch::kFloat).std().item<double>();
  EXPECT_GT(std, 0.9);
  EXPECT_LT(std, 1.1);
  torch::manual_seed(7);
  EXPECT_TRUE(torch::equal(ProbeOperand({3, 64 << 10}, options), operand));
  // One shorter than a block is drawn whole.
  const torch::Tensor small = ProbeOperand({5, 7}, torch::kFloat);
  EXPECT_FALSE(small.requires_grad());
  EXPECT_GT(small.std().item<double>(), 0);
}

// Rounds past the samples each needs are whole: both measurements sampled in each.
TEST(ProbeRoundsTest, RoundsWithSecondsToSpareSampleEveryMeasurement) {
  ProbeRounds rounds(torch::Device(torch::kCPU));
  int long_calls = 0, short_calls = 0;
  rounds.Add(CountedSleep{&long_calls, 12}, [](double) {});
  rounds.Add(CountedSleep{&short_calls, 1}, [](double) {});
  const int ran = rounds.Run(0.5);
  ASSERT_GT(ran, 3);
  // Its warm call, two rounds short of samples, then one call in each whole round after them.
  EXPECT_EQ(long_calls, 2 + 2 + (ran - 3));
}

// The dearest measurements (a sample of 5% of a round or more) are spread over each round: two
// added one after another, 40 ms calls among thirty of about 5 ms samples, run the first at the
// round's start and the second half a round later, where in the order added they would run back
// to back.
TEST(ProbeRoundsTest, TheDearestMeasurementsAreSpreadOverTheRound) {
  ProbeRounds rounds(torch::Device(torch::kCPU));
  constexpr int kCheap = 30;
  std::vector<int> sampled;  // each call's measurement: 0 and 1 the dear ones
  auto logged = [&sampled](int id, int ms) {
    return [&sampled, id, ms] {
      sampled.push_back(id);
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    };
  };
  rounds.Add(logged(0, 40), [](double) {});
  rounds.Add(logged(1, 40), [](double) {});
  for (int id = 2; id < 2 + kCheap; ++id) rounds.Add(logged(id, 1), [](double) {});
  sampled.clear();
  EXPECT_EQ(rounds.Run(0), 3);
  // One entry a sample: a cheap measurement's calls follow each other.
  sampled.erase(std::unique(sampled.begin(), sampled.end()), sampled.end());
  // The dear ones' warm calls were their first samples: two whole rounds, then the cheap ones'
  // third.
  ASSERT_EQ(sampled.size(), static_cast<size_t>(2 * (2 + kCheap) + kCheap));
  for (const int round : {0, 1}) {
    const auto begin = sampled.begin() + round * (2 + kCheap);
    const std::vector<int> in_round(begin, begin + 2 + kCheap);
    EXPECT_EQ(in_round.front(), 0) << "round " << round;
    const auto second = std::find(in_round.begin(), in_round.end(), 1);
    ASSERT_NE(second, in_round.end()) << "round " << round;
    const auto cheap_before = second - in_round.begin() - 1;
    EXPECT_GE(cheap_before, kCheap / 4) << "round " << round;
    EXPECT_GE(in_round.end() - second - 1, kCheap / 4) << "round " << round;
  }
}

// An interleaved measurement is sampled between the others, before every tenth sampled in each
// round, with no timing call before the rounds; the median of what it returned is recorded.
TEST(ProbeRoundsTest, AnInterleavedMeasurementIsSampledBetweenTheOthers) {
  ProbeRounds rounds(torch::Device(torch::kCPU));
  int calls = 0;
  const double returned[] = {0.004, 0.001, 0.002, 0.009};
  double median = 0;
  rounds.AddInterleaved([&] { return returned[calls++ % 4]; },
                        [&](double seconds) { median = seconds; });
  int others = 0;
  for (int i = 0; i < 11; ++i) rounds.Add([&others] { ++others; }, [](double) {});
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(rounds.Run(0), 3);
  EXPECT_EQ(calls, 3 * 2) << "before the first and the eleventh of each round";
  // 4, 1, 2, 9, 4, 1 ms: the upper of the two middle ones, as every median of the probe.
  EXPECT_EQ(median, 0.004);
}

}  // namespace
}  // namespace llmctl::trainer
