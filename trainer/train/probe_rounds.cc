#include "trainer/train/probe_rounds.h"

#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <utility>

#include "common/estimate/rate_probe.h"
#include "common/median.h"

namespace llmctl::trainer {
namespace {

using Clock = std::chrono::steady_clock;

// A sample runs enough calls to last this long, so a clock read, a device synchronisation or a
// thread's wake-up does not count in a short op's time. 10 ms until 12-07: at 5 ms the 2-core
// Zen 3's probe took 11.3-13.4 s where it took 11.9-15.9 at 10 (alternating, five each), and the
// two predicted the CPU lab's rows alike probe by probe (the machine's moment moved both by up
// to 24%).
constexpr double kSampleSeconds = 0.005;
// Each rate is the median of at least this many samples.
constexpr size_t kMinSamples = 3;
// An interleaved measurement is sampled before every this many of the others: on a CPU the probe's
// 150 or so make 15 samples a round, about 8 ms each for the pace canary (PaceCanary::Seconds).
constexpr size_t kInterleaveEvery = 10;
// A measurement whose sample takes this share of a round or more is one of the round's dearest,
// which ProbeRounds::RoundOrder spreads over it: the reference steps, 0.2-0.45 s each of a round of
// 2.7-3.0 s on the 2-core Zen 3 (12-07), where the grid's cells take at most kCallShare of the
// probe's seconds (rate_probe.cc: 83 ms).
constexpr double kSpreadShare = 0.05;
// The values ProbeOperand draws on a CPU, repeated past them: 256 KiB of fp32.
constexpr int64_t kDrawnBlock = 64 << 10;

// As many calls of one that takes `once` as make a sample.
int64_t CallsPerSample(double once) {
  return once >= kSampleSeconds ? 1 : static_cast<int64_t>(std::ceil(kSampleSeconds / once));
}

}  // namespace

torch::ScalarType ProbeDtype(const std::string& name) {
  return name == "bf16" ? torch::kBFloat16 : name == "fp16" ? torch::kHalf : torch::kFloat;
}

torch::Tensor ProbeOperand(at::IntArrayRef shape, const torch::TensorOptions& options) {
  if (options.device().is_cuda()) return torch::randn(shape, options);
  // Filled before it may require a gradient: a leaf that does takes no in-place copy.
  const torch::TensorOptions plain = options.requires_grad(false);
  torch::Tensor operand = torch::empty(shape, plain);
  const torch::Tensor values = operand.view({-1});
  const int64_t count = values.numel();
  const torch::Tensor block = torch::randn({std::min(count, kDrawnBlock)}, plain);
  for (int64_t at = 0; at < count; at += kDrawnBlock) {
    const int64_t n = std::min(kDrawnBlock, count - at);
    values.narrow(0, at, n).copy_(block.narrow(0, 0, n));
  }
  return operand.requires_grad_(options.requires_grad());
}

double SecondsSince(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double ProbeRounds::Add(std::function<void()> run, std::function<void(double)> record,
                        int64_t most_calls) {
  const Timing timing = TimeToAgreement(run);
  const double once = timing.quickest;
  const int64_t calls = std::min(most_calls, CallsPerSample(once));
  // A sample of one call, timed warm: a round's sample the rounds need not take again. The dear
  // measurements are such ones (the reference steps, the wide GEMMs): sparing them a third round
  // took the 2-core Xeon's whole probe from 11.7 to 10.7 s, and from 14.5 to 13.0 s with oneDNN
  // held to AVX512_CORE_VNNI (12-05, medians alternating with the binary before).
  std::vector<double> samples;
  if (calls == 1 && timing.calls >= 2 && timing.last >= kSampleSeconds) {
    samples.push_back(timing.last);
  }
  measurements_.push_back({.run = std::move(run),
                           .record = std::move(record),
                           .calls = calls,
                           .sample_seconds = static_cast<double>(calls) * once,
                           .samples = std::move(samples)});
  return once;
}

double ProbeRounds::AddWarm(std::function<void()> run, std::function<void(double)> record) {
  const double once = TimeCalls(run, 1);
  const int64_t calls = CallsPerSample(once);
  std::vector<double> samples;
  if (calls == 1) samples.push_back(once);
  measurements_.push_back({.run = std::move(run),
                           .record = std::move(record),
                           .calls = calls,
                           .sample_seconds = static_cast<double>(calls) * once,
                           .samples = std::move(samples)});
  return once;
}

void ProbeRounds::AddInterleaved(std::function<double()> sample,
                                 std::function<void(double)> record) {
  interleaved_.push_back({.sample = std::move(sample), .record = std::move(record), .samples = {}});
}

std::vector<size_t> ProbeRounds::RoundOrder() const {
  double round = 0;
  for (const Measurement& m : measurements_) round += m.sample_seconds;
  std::vector<size_t> dear, cheap;
  for (size_t i = 0; i < measurements_.size(); ++i) {
    (measurements_[i].sample_seconds >= kSpreadShare * round ? dear : cheap).push_back(i);
  }
  // The k-th dear one added takes slot k / 2 when k is even, else one in the second half: the
  // dear ones added one after another (a reference step at repeated lengths, then the same
  // trainer's at new ones) land half a round apart.
  std::vector<size_t> by_slot(dear.size());
  for (size_t k = 0; k < dear.size(); ++k) {
    by_slot[k % 2 == 0 ? k / 2 : (dear.size() + 1) / 2 + k / 2] = dear[k];
  }
  double cheap_seconds = 0;
  for (const size_t i : cheap) cheap_seconds += measurements_[i].sample_seconds;
  std::vector<size_t> order;
  size_t next = 0;
  double elapsed = 0;  // the cheap ones' seconds placed so far
  for (size_t slot = 0; slot < by_slot.size(); ++slot) {
    const double at =
        cheap_seconds * static_cast<double>(slot) / static_cast<double>(by_slot.size());
    for (; next < cheap.size() && elapsed < at; ++next) {
      order.push_back(cheap[next]);
      elapsed += measurements_[cheap[next]].sample_seconds;
    }
    order.push_back(by_slot[slot]);
  }
  order.insert(order.end(), cheap.begin() + static_cast<std::ptrdiff_t>(next), cheap.end());
  return order;
}

int ProbeRounds::Run(double seconds) {
  const Clock::time_point start = Clock::now();
  const std::vector<size_t> order = RoundOrder();
  int rounds = 0;
  double longest_round = 0;
  // Past the samples each needs, a whole round starts only if it ends within `seconds` at the
  // longest whole round's pace: on the 2-core Xeon with AMX (12-05) a round took 2.0 s, so a
  // fourth began at 6.0 s and the rounds ended at 8.1, the whole probe at 12.5-14.9 s against
  // the 15.
  while (true) {
    const bool short_of_samples =
        std::any_of(measurements_.begin(), measurements_.end(),
                    [](const Measurement& m) { return m.samples.size() < kMinSamples; });
    if (!short_of_samples && SecondsSince(start) + longest_round > seconds) break;
    const Clock::time_point round_start = Clock::now();
    bool whole = true;
    size_t sampled = 0;
    for (const size_t i : order) {
      Measurement& m = measurements_[i];
      if (short_of_samples && m.samples.size() >= kMinSamples) {
        whole = false;
        continue;
      }
      if (sampled++ % kInterleaveEvery == 0) {
        for (Interleaved& between : interleaved_) between.samples.push_back(between.sample());
      }
      m.samples.push_back(TimeCalls(m.run, m.calls) / static_cast<double>(m.calls));
    }
    if (whole) longest_round = std::max(longest_round, SecondsSince(round_start));
    ++rounds;
  }
  for (Measurement& m : measurements_) {
    m.record(Median(m.samples));
  }
  for (Interleaved& between : interleaved_) {
    if (!between.samples.empty()) between.record(Median(between.samples));
  }
  return rounds;
}

double ProbeRounds::SpeedSpread() const {
  std::vector<std::vector<double>> samples;
  for (const Measurement& m : measurements_) samples.push_back(m.samples);
  return estimate::SpeedSpread(samples);
}

// Two calls were not enough to go by: beside another multithreaded process, a call whose threads
// did not all run at once takes many times its time (11-30, Zen 4, beside `xz -T2`: the 32 x 64
// fp32 cell at 2.8 GFLOP/s, 46 alone), and the grid's cut (AddMatmuls in rate_probe.cc) then left
// out every wider cell (one fp32 cell of 26). A warm call of a sample's length or more settles it:
// such a measurement samples one call at a time whatever its exact time, and a thread's wait is
// a small part of it. Timing the reference steps, the probe's dearest calls (0.17-0.26 s each on
// the 2-core Zen 4 on 12-03), to agreement took 2.4 s of its warm-up.
ProbeRounds::Timing ProbeRounds::TimeToAgreement(const std::function<void()>& run) const {
  constexpr double kAgreement = 1.25;
  constexpr int kMaxTimingCalls = 16;
  constexpr double kMaxTimingSeconds = 0.5;
  const Clock::time_point start = Clock::now();
  Timing timing;
  timing.quickest = timing.last = TimeCalls(run, 1);
  timing.calls = 1;
  double second = std::numeric_limits<double>::infinity();
  while (timing.calls < kMaxTimingCalls && second > kAgreement * timing.quickest &&
         (timing.calls < 2 || SecondsSince(start) < kMaxTimingSeconds)) {
    timing.last = TimeCalls(run, 1);
    ++timing.calls;
    second = std::min(second, std::max(timing.last, timing.quickest));
    timing.quickest = std::min(timing.quickest, timing.last);
    if (timing.last >= kSampleSeconds) break;
  }
  return timing;
}

double ProbeRounds::TimeCalls(const std::function<void()>& run, int64_t calls) const {
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < calls; ++i) run();
  // The probe's device, which need not be the current one.
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  return SecondsSince(start);
}

}  // namespace llmctl::trainer
