// One trial's estimate for `llmctl estimate` and submit's predictions (internal to controller/cli;
// estimate.h is the public face): the device its verdict is made against, the lengths its run
// draws, its memory and time (common/estimate), LLaMA family or BLIP-2, and --fit's micro-batch.
#ifndef LLMCTL_CONTROLLER_CLI_ESTIMATE_TRIAL_H_
#define LLMCTL_CONTROLLER_CLI_ESTIMATE_TRIAL_H_

#include <cstdint>
#include <optional>
#include <string>

#include "common/estimate/gpus.h"
#include "common/estimate/memory_verdict.h"
#include "common/estimate/step_memory.h"
#include "common/estimate/step_time.h"
#include "common/estimate/step_work.h"
#include "common/experiment.h"
#include "common/status.h"
#include "controller/cli/estimate.h"

namespace llmctl::cli {

// The memory a trial's verdict is made against, and where that figure came from.
struct VerdictDevice {
  uint64_t bytes = 0;
  std::string source;
  std::optional<estimate::Gpu> gpu;  // when the figure is a GPU's
  // What the trial's allocated bytes may reach there (memory_verdict.h): set per trial, as the
  // same size is a budget of a CPU trial's allocator or of a CUDA one's.
  estimate::MemoryLimit limit = {};
};

// The lengths the estimate took a trial's micro-batches at: how it chose them, alike for the trials
// of a file that draw alike, and this trial's figures.
struct LengthsNote {
  std::string how;
  std::string figures;

  bool empty() const { return how.empty(); }
  std::string Whole() const { return figures.empty() ? how : how + ": " + figures; }
};

struct TrialEstimate {
  const Trial* trial = nullptr;
  // Unset when the trial cannot be estimated here; `reason` says why.
  std::optional<estimate::StepMemoryEstimate> memory = {};
  std::string reason = {};
  std::optional<VerdictDevice> device = {};
  std::optional<estimate::MicroBatchFit> fit = {};  // with --fit and a device
  // The predicted time; unset for a cuda trial without a known GPU (`time_reason` says so).
  std::optional<estimate::TimeEstimate> time = {};
  std::optional<estimate::StepWork> work = {};
  std::string time_device = {};
  std::string calibration = {};
  std::string rates = {};  // the probe whose rates the time is at; "" for the data sheet's
  // The pace canary's seconds the time assumes: that probe's (DeviceSpeed's) over the
  // calibration's pace; 0 without one.
  double pace_seconds = 0;
  std::string time_reason = {};
  // The lengths the estimate took, which the table does not show.
  LengthsNote note = {};

  // The peak against the device's limit; none without a device.
  std::optional<estimate::MemoryVerdict> Verdict() const {
    if (!memory || !device) return std::nullopt;
    return estimate::VerdictOf(memory->peak_bytes, device->limit);
  }
};

// The GPUs --device-memory and plan's --device take by name, for their messages ("h100-94gb, ...").
std::string KnownGpuNames();

// --device-memory's device: a GPU's name or a size; none for "".
StatusOr<std::optional<VerdictDevice>> ParseDeviceOption(const std::string& text);

// The estimate of `trial` of `experiment` (read from `file`), judged against `device_option` when
// set, else the trial's own device. A trial whose model cannot be estimated here has no memory and
// a reason; InvalidArgument ("FILE: trial NAME: problem") for a model or data set it cannot read.
StatusOr<TrialEstimate> EstimateTrial(const Trial& trial, const Experiment& experiment,
                                      const std::string& file, const EstimateOptions& options,
                                      const std::optional<VerdictDevice>& device_option);

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_ESTIMATE_TRIAL_H_
