// The trainer's `speed_check` event: how fast the machine ran one matmul cell of the node's rate
// probe (common/estimate/rate_probe.h) just before a trial's first step and again after its last
// step, outside the timed steps. A time predicted from a probe assumes the machine runs as fast as
// when it was probed; a shared VM's speed moves by tens of percent from one minute to the next
// (docs/estimate-measurements.md), so `llmctl report` sets this rate against the probe's rate at
// the same cell, and a row's tokens/s error splits into the machine's share and the model's. One
// spelling for the trainer that writes it, the controller that stores it and the CLI that looks up
// the probe's rate.
#ifndef LLMCTL_COMMON_SPEED_CHECK_EVENT_H_
#define LLMCTL_COMMON_SPEED_CHECK_EVENT_H_

#include <cstdint>
#include <string_view>

namespace llmctl::speed_check_event {

inline constexpr std::string_view kType = "speed_check";
// When it was measured: kBeforeSteps or kAfterSteps.
inline constexpr std::string_view kWhen = "when";
inline constexpr std::string_view kBeforeSteps = "before_steps";
inline constexpr std::string_view kAfterSteps = "after_steps";
// The cell it timed: the probe's matmul row of this dtype, size and tokens.
inline constexpr std::string_view kDtype = "dtype";
inline constexpr std::string_view kSize = "size";
inline constexpr std::string_view kTokens = "tokens";
// The rate measured, in FLOP/s.
inline constexpr std::string_view kFlopsPerSecond = "flops_per_s";

// A cell of the probe's matmul grid (trainer/train/rate_probe.cc), which every probe of its device
// measures: a projection's three matmuls, (tokens x size) by (size x size).
struct Cell {
  std::string_view dtype;  // "fp32", "bf16"
  int64_t size;
  int64_t tokens;
};
// A CPU's: about 5 ms a call at 160 GFLOP/s on 2 Zen 4 cores, 6 MiB of operands and results.
inline constexpr Cell kCpuCell = {"fp32", 512, 512};
// A GPU's: bf16 as its trials run, about 0.1 ms a call on an H200, 48 MiB.
inline constexpr Cell kCudaCell = {"bf16", 2048, 2048};

inline constexpr const Cell& CellFor(bool cuda) { return cuda ? kCudaCell : kCpuCell; }

}  // namespace llmctl::speed_check_event

#endif  // LLMCTL_COMMON_SPEED_CHECK_EVENT_H_
