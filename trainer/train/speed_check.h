// A trial's speed check (common/speed_check_event.h): the machine's rate at its probe's matmul
// cell, timed as the probe times it (ProbeRounds), just before the trial's first step and again
// after its last. Internal to trainer/train.
#ifndef LLMCTL_TRAINER_TRAIN_SPEED_CHECK_H_
#define LLMCTL_TRAINER_TRAIN_SPEED_CHECK_H_

#include <torch/torch.h>

#include "common/status.h"

namespace llmctl::trainer {

// The rate of `device`'s cell (speed_check_event::CellFor) in FLOP/s: the median over a few
// rounds of samples of at least 10 ms, about 60 ms in all on a CPU. It draws its operands from the
// device's default generator and puts that generator's state back, so that the trial's random
// stream is the one it would be without the check. On a CPU its tensors count in the host pool,
// outside a budget (ScopedHostAllocations); on a GPU, in the device's, where the caller resets the
// peak after it. ResourceExhausted when its operands do not fit; Internal for another LibTorch
// error.
StatusOr<double> MeasureSpeedCheck(torch::Device device);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_SPEED_CHECK_H_
