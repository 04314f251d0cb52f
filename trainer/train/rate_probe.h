// `llm-train --probe`: this machine's own rates, measured in about 10 s on a CPU and under 30 s on a
// GPU, as common/estimate/rate_probe.h's RateProbe (its JSON is what llm-train prints): matmul
// throughput per dtype at the sizes a small model's step has, causal attention per dtype, memory
// bandwidth, the cost of one op's dispatch (and launch), the host's fused AdamW step, and on a GPU
// the host<->device copies.
#ifndef LLMCTL_TRAINER_TRAIN_RATE_PROBE_H_
#define LLMCTL_TRAINER_TRAIN_RATE_PROBE_H_

#include <string>

#include "common/estimate/rate_probe.h"
#include "common/status.h"

namespace llmctl::trainer {

struct RateProbeOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  // How long each measurement runs at least; the whole probe takes about 20 of them. Tests pass a
  // short one.
  double seconds_per_measurement = 0.5;
};

// FailedPrecondition for cuda on a machine where LibTorch sees no GPU; InvalidArgument for
// another device.
StatusOr<estimate::RateProbe> ProbeRates(const RateProbeOptions& options);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_RATE_PROBE_H_
