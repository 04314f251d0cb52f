// `llm-train --probe`: this machine's own rates, measured in about 12 s on a CPU and under 30 s on
// a GPU, as common/estimate/rate_probe.h's RateProbe (its JSON is what llm-train prints): matmul
// throughput per dtype over a grid of the shapes a training step's projections have (token rows
// by weight width) and on a CPU a vocabulary head's (a chunk's rows through a wide output), causal
// attention per dtype forward and backward, memory bandwidth, the cost of
// one op (a CPU's in an autograd step, a GPU's launch), the host's fused AdamW step, on a CPU the
// trainer's 8-bit AdamW step and the reference trial's steps (common/estimate/reference_step.h),
// and on a GPU the host<->device copies.
#ifndef LLMCTL_TRAINER_TRAIN_RATE_PROBE_H_
#define LLMCTL_TRAINER_TRAIN_RATE_PROBE_H_

#include <string>

#include "common/estimate/rate_probe.h"
#include "common/status.h"

namespace llmctl::trainer {

struct RateProbeOptions {
  std::string device = "cpu";  // "cpu" or "cuda"
  // How long the rounds of samples run; each measurement's warm-up comes on top (about 1.5 s on a
  // 2-core CPU). One call of a matmul may take at most a 78th of it, which sets how far the grid
  // goes. Tests pass a short one. 6.5 s (8 before version 8, which added images and partial
  // blocks): four rounds of about 1.75 s on the 2-core Zen 4, 12 s in all, under 15.
  double seconds = 6.5;
};

// FailedPrecondition for cuda on a machine where LibTorch sees no GPU; InvalidArgument for
// another device; Unavailable, from CheckMeasuredProbe, for rates no reader would take.
StatusOr<estimate::RateProbe> ProbeRates(const RateProbeOptions& options);

// Whether `probe` reads back through estimate::RateProbe::FromJson, the check every reader of a
// probe applies (llmctl's estimate, the agent, the controller): a probe they would refuse is never
// written. Beside other work holding the cores, each of the grid's cheapest matmuls times the
// waits for a thread that lost its core, the wider cells are then left out as too slow, and the
// reference steps run hundreds of times faster than their work at those rates (12-01, the GPU
// plan's rehearsal on the 2-core Zen 4 beside four compilers, load average 4-5: the fp32 cells of
// 32 rows x 64 at 17 MFLOP/s, every wider one cut, a reference step 0.0013 times its work).
// Unavailable then, saying so. So is a CPU probe during which other processes took
// kBusyMachineShare or more of its CPUs' time (common/machine_cpu.h): each parallel op waits for
// a thread that shares its core, so its rates are the moment's load's, and a probe kept is kept
// until the node changes (the agent's rates.json, LLMCTL_HOME/probe.json), where one refused is
// measured again (the agent after its waits, llmctl the next time it needs it). A GPU probe's
// rates are the GPU's: the CPU's load is only said.
Status CheckMeasuredProbe(const estimate::RateProbe& probe);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_RATE_PROBE_H_
