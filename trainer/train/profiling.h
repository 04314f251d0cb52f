// Profiles the steps a trial asks for (profile.first_step, profile.steps) into output_dir/profile/,
// so that `llmctl fetch` brings them back with the trial's other outputs:
//
// - trace-steps-A-B.json: LibTorch's Kineto profiler's trace of every operator of steps A..B (with
//   input shapes), each step a "ProfilerStep#N" span holding "forward", "backward" and "optimizer
//   step" spans per micro-batch: Chrome trace JSON, which ui.perfetto.dev and chrome://tracing
//   open.
// - memory-steps-A-B.pickle (profile.memory_history): the allocator's history of the same steps in
//   PyTorch's memory-snapshot format, which pytorch.org/memory_viz opens (memory_history.h).
#ifndef LLMCTL_TRAINER_TRAIN_PROFILING_H_
#define LLMCTL_TRAINER_TRAIN_PROFILING_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/trial_settings.h"
#include "trainer/memory/memory_history.h"

namespace at {
struct RecordFunction;
}

namespace llmctl::trainer {

// The most allocator events (allocations, frees, phase marks) a memory history keeps, the newest.
inline constexpr size_t kMaxMemoryHistoryEvents = 500'000;

struct ProfileFiles {
  std::vector<std::string> paths;     // written: the trace, then the memory history
  std::vector<std::string> problems;  // a file that could not be written, dropped history events
};

class StepProfiler {
 public:
  // Null when the trial profiles no step. Call before the model is built: the memory history
  // knows the allocations live when it starts only if it tracks them from before they are made.
  static StatusOr<std::unique_ptr<StepProfiler>> ForTrial(const TrialSettings& settings,
                                                          torch::Device device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  bool Profiles(int64_t step) const { return step >= first_step_ && step <= last_step_; }
  // What a run of `total_steps` steps leaves unprofiled when it ends before the last profiled step
  // (train.epochs decides how many steps there are only once the data is read); "" otherwise.
  std::string StepsPast(int64_t total_steps) const;
  bool recording() const { return recording_; }

  // At the start of every step, before its batches are made; starts recording at the first
  // profiled step.
  void BeginStep(int64_t step);
  // At each phase boundary of the step (phase0_before_fwd ... phase3_after_opt_step): names what
  // follows in the trace and the memory history, and marks the point in the memory history.
  void Phase(int64_t step, int64_t micro_batch, std::string_view phase);
  // Whether `step` is the last profiled step: then the caller writes the profile after it.
  bool EndsWith(int64_t step) const { return recording_ && step == last_step_; }
  // Stops recording and writes the files (also when the run ended inside the profiled steps);
  // nothing when not recording. `categories` name the storages live now (accounting.h).
  ProfileFiles Write(const std::vector<StorageCategory>& categories);

 private:
  StepProfiler(torch::Device device, int64_t first_step, int64_t last_step, int64_t accumulation,
               std::string dir, std::optional<MemoryHistory> memory);
  void OpenSpan(std::unique_ptr<at::RecordFunction>& span, const std::string& name);
  void Label(const std::string& what, bool marker);

  const torch::Device device_;
  const int64_t first_step_;
  const int64_t last_step_;
  const int64_t accumulation_;  // micro-batches per step
  const std::string dir_;       // output_dir/profile
  std::optional<MemoryHistory> memory_;
  bool recording_ = false;
  int64_t step_ = -1;           // the step running
  int64_t recorded_from_ = -1;  // the first step recorded; -1 before recording starts
  // The open "ProfilerStep#N" span and the phase span inside it; the phase closes first.
  std::unique_ptr<at::RecordFunction> step_span_;
  std::unique_ptr<at::RecordFunction> phase_span_;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_PROFILING_H_
