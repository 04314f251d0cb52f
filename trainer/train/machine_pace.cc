#include "trainer/train/machine_pace.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/median.h"

namespace llmctl::trainer {
namespace {

constexpr int64_t kWidth = 256;
constexpr int kProducts = 4;
constexpr int kTimedRuns = 3;
// How long the canary runs before it is timed. A step whose tail runs on one thread (8-bit
// AdamW's small tensors, each below its parallel grain) leaves the other vCPU halted; after one
// warm run its first timed runs still paid the wake-up: on the 2-core Zen 3 (12-07) the canary
// after an adam-8bit step read 1.05-1.27 ms where 5 ms of warm runs read 0.98-1.02, and
// reduced-batch's 0.77-1.03 either way.
constexpr std::chrono::microseconds kWarmUp{5000};

}  // namespace

PaceCanary::PaceCanary()
    : left_(kWidth * kWidth), right_(kWidth * kWidth), output_(kWidth * kWidth) {
  // Values of either sign and a spread of magnitudes, none of them subnormal, which some CPUs
  // multiply far slower: the same every run.
  for (size_t i = 0; i < left_.size(); ++i) {
    left_[i] = static_cast<float>(static_cast<int64_t>(i * 7919 % 2003) - 1001) / 1001.0F;
    right_[i] = static_cast<float>(static_cast<int64_t>(i * 104729 % 1999) - 999) / 999.0F + 0.5F;
  }
  const torch::TensorOptions options = torch::TensorOptions().dtype(torch::kFloat);
  left_view_ = torch::from_blob(left_.data(), {kWidth, kWidth}, options);
  right_view_ = torch::from_blob(right_.data(), {kWidth, kWidth}, options);
  output_view_ = torch::from_blob(output_.data(), {kWidth, kWidth}, options);
}

void PaceCanary::Run() {
  torch::NoGradGuard no_grad;
  for (int i = 0; i < kProducts; ++i) torch::mm_out(output_view_, left_view_, right_view_);
}

double PaceCanary::Seconds() {
  const auto warm_until = std::chrono::steady_clock::now() + kWarmUp;
  do {
    Run();
  } while (std::chrono::steady_clock::now() < warm_until);
  std::vector<double> seconds;
  for (int i = 0; i < kTimedRuns; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Run();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return Median(std::move(seconds));
}

}  // namespace llmctl::trainer
