// The machine's pace: the seconds one fixed piece of compute takes it at a moment. `llm-train
// --probe` measures it among its rates (RateProbe::pace_seconds) and a one-process CPU trial after
// each step (the step event's pace_seconds), so the report can say how fast the machine ran while
// a trial's tokens/s was measured against how fast it ran while its rates were: on a shared VM the
// same step takes 1.4-2x its time minutes apart (12-07, the 2-core Zen 3), which no estimate made
// before the run can know. Internal to trainer/train/: not part of its API.
#ifndef LLMCTL_TRAINER_TRAIN_MACHINE_PACE_H_
#define LLMCTL_TRAINER_TRAIN_MACHINE_PACE_H_

#include <torch/torch.h>

#include <vector>

namespace llmctl::trainer {

// Four fp32 products of two 256 x 256 matrices on the CPU, with LibTorch's intra-op threads: about
// 1 ms on 2 cores. A matmul, not a copy: over 2-second windows on the Zen 3 its time followed a
// bf16 step's work at 0.94 correlation (each moving 1.4x), where a 1 MiB copy's did not follow it
// at all (0.04). Its operands and output are its own memory, not LibTorch allocator's, so the
// trainer's memory accounting (the counting allocator) never sees it: measuring the pace moves no
// allocated or peak byte.
class PaceCanary {
 public:
  PaceCanary();
  PaceCanary(const PaceCanary&) = delete;
  PaceCanary& operator=(const PaceCanary&) = delete;

  // One run of the products.
  void Run();

  // The median seconds of three runs after 5 ms of runs that warm its operands back into the
  // caches (a step leaves them full of the model's) and wake the intra-op threads a step's serial
  // tail left asleep: one sample, about 8 ms on 2 cores, whose median rides out a thread's late
  // wake-up.
  double Seconds();

 private:
  std::vector<float> left_;    // (256, 256)
  std::vector<float> right_;   // (256, 256)
  std::vector<float> output_;  // (256, 256)
  torch::Tensor left_view_;
  torch::Tensor right_view_;
  torch::Tensor output_view_;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_MACHINE_PACE_H_
