// How `llm-train --probe` (rate_probe.cc) times what it measures: every measurement sampled in
// rounds, each rate the median of its samples. Internal to trainer/train/: not part of its API.
#ifndef LLMCTL_TRAINER_TRAIN_PROBE_ROUNDS_H_
#define LLMCTL_TRAINER_TRAIN_PROBE_ROUNDS_H_

#include <torch/torch.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

namespace llmctl::trainer {

// The seconds since `since` on the steady clock.
double SecondsSince(std::chrono::steady_clock::time_point since);

// The dtype the probe's JSON names "fp32", "bf16" or "fp16".
torch::ScalarType ProbeDtype(const std::string& name);

// A measurement's operand of `shape`: normal draws as torch::randn's, which on a CPU draws one
// block of them and repeats it through the tensor. ATen draws about 6 ns a value on 2 cores (12-07,
// Zen 3), and the probe's operands, some 200 M values, took over a second of its time that way; no
// op it times runs faster or slower for which finite values it meets, and each cache line still
// holds varied ones.
torch::Tensor ProbeOperand(at::IntArrayRef shape, const torch::TensorOptions& options);

// `cuda`'s values on a GPU, else `cpu`'s: a cell's shapes by the probe's device.
template <size_t kCudaCount, size_t kCpuCount>
std::vector<int64_t> ForDevice(const torch::Device& device, const int64_t (&cuda)[kCudaCount],
                               const int64_t (&cpu)[kCpuCount]) {
  return device.is_cuda() ? std::vector<int64_t>(std::begin(cuda), std::end(cuda))
                          : std::vector<int64_t>(std::begin(cpu), std::end(cpu));
}

// The probe's measurements, sampled in rounds: each round times one sample of every measurement
// in turn, so each rate's samples spread over the whole probe. On a machine whose speed drifts
// while it runs (this project's 2-vCPU VM: a square matmul's rate moved by 30% from one second to
// the next) every rate then sees the same mix of fast and slow seconds, and its median over the
// rounds is what a second probe finds again; timing each rate in one stretch, as version 2 did,
// gave each the speed of its own second.
class ProbeRounds {
 public:
  explicit ProbeRounds(torch::Device device) : device_(device) {}

  // Times calls of `run` until its two quickest agree (the first call warms caches and kernels
  // up) and keeps it for the rounds with as many calls a sample as make kSampleSeconds, at most
  // `most_calls` (a `run` whose every call must differ, as one at rows new to the process, uses
  // up its supply of them); `record` gets its median seconds a call. A `run` whose one call is a
  // sample already has its first: the warm call that ended the timing. Returns the quickest
  // call's seconds.
  double Add(std::function<void()> run, std::function<void(double)> record,
             int64_t most_calls = std::numeric_limits<int64_t>::max());

  // As Add, for a `run` that an earlier measurement has warmed up: one whose every call does what
  // a trial's does from its first, its state made and its caches filled by the same object's
  // calls before, and none of them a shape seen before (a reference step at new lengths after
  // the same trainer's repeated ones). Its first call is timed as a sample would be, and is its
  // first when it lasts kSampleSeconds or more. Returns that call's seconds.
  double AddWarm(std::function<void()> run, std::function<void(double)> record);

  // A measurement that times itself, sampled between the others: in each round, before every
  // kInterleaveEvery-th of the measurements sampled, what `sample` returns (its seconds) is one
  // sample; `record` gets their median over the rounds. So its samples spread over the whole probe
  // as a trial's steps spread over its run, each timed as a trial times it between its steps
  // (PaceCanary::Seconds), where three samples at one place in the rounds took the moment of
  // three instants (12-07, Zen 3: the pace canary's median once 1.6x its time in the probes
  // before and after). Not in SpeedSpread, which is the rates'.
  void AddInterleaved(std::function<double()> sample, std::function<void(double)> record);

  // Samples every measurement in turn (RoundOrder's), round after round, until each has kMinSamples
  // (the last of those rounds samples only the ones short of them), and whole rounds more while one
  // more, at the longest round's pace, ends within `seconds`; then records each one's median.
  // Returns the rounds run.
  int Run(double seconds);

  torch::Device device() const { return device_; }
  // How much the machine's speed moved over the rounds Run ran (estimate::SpeedSpread).
  double SpeedSpread() const;

 private:
  struct Measurement {
    std::function<void()> run;
    std::function<void(double)> record;
    int64_t calls = 1;
    double sample_seconds = 0;    // a sample's, by the timing calls
    std::vector<double> samples;  // seconds a call
  };

  // The order each round samples the measurements in: the order they were added, but for the
  // dearest (a sample of kSpreadShare of a round or more), which are spread evenly over the
  // others' seconds, the first at the round's start and those added one after another half a
  // round apart. A slow spell of a shared VM is short: over 18 probes of the 2-core Zen 3 (12-07)
  // two samples' slowness correlated 0.41 within 0.1 s of each other, 0.24 at 0.1-0.3 s, 0.13 at
  // 0.7-1.5 s and not at all past 1.5 s. Run back to back, the four reference steps (1.1 s of a
  // 2.8 s round) met a spell together, and ProbedSpeed's quicker of a class's steps at repeated
  // and at new lengths, sampled side by side, could not step around it: one probe's factors came
  // out 1.52 (bf16) and 1.47 (fp32) where the nine around it said 0.84-1.07.
  std::vector<size_t> RoundOrder() const;

  struct Interleaved {
    std::function<double()> sample;
    std::function<void(double)> record;
    std::vector<double> samples;  // seconds
  };

  struct Timing {
    double quickest = 0;  // seconds
    double last = 0;      // the last call's seconds
    int calls = 0;
  };
  // Calls of `run` until the two quickest agree within kAgreement, until a call after the first
  // lasts kSampleSeconds or more, or for kMaxTimingCalls or kMaxTimingSeconds.
  Timing TimeToAgreement(const std::function<void()>& run) const;

  // The seconds `calls` calls of `run` take, the device's work finished.
  double TimeCalls(const std::function<void()>& run, int64_t calls) const;

  torch::Device device_;
  std::vector<Measurement> measurements_;
  std::vector<Interleaved> interleaved_;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_PROBE_ROUNDS_H_
