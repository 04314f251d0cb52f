// `llmctl estimate FILE [--trial NAME] [--device-memory SIZE|GPU] [--fit] [--explain]
// [--format table|json]`: each trial's memory per rank before anything runs and without a
// controller (common/estimate): the model state, the activations, the step's peak, and the verdict
// fits / out-of-memory against the trial's device.
#ifndef LLMCTL_CONTROLLER_CLI_ESTIMATE_H_
#define LLMCTL_CONTROLLER_CLI_ESTIMATE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/estimate/memory_verdict.h"
#include "common/estimate/step_time.h"
#include "common/experiment.h"
#include "common/status.h"

namespace llmctl::cli {

struct EstimateOptions {
  std::string trial;             // "" for every trial
  std::string format = "table";  // "table" (MiB) or "json" (exact bytes)
  // The device every trial's verdict is made against: a size ("80GiB") or a GPU of
  // common/estimate/gpus.h ("a100-80gb"). "" for each trial's own: its device_memory, else (on
  // cuda) the GPU of the experiment's target.
  std::string device_memory;
  bool fit = false;      // the largest micro-batch that fits each trial's device
  bool explain = false;  // every term's formula with its numbers
  // The calibration of a device's time predictions; unset: its built-in one.
  estimate::CalibrationLookup calibrate;
  // The rates of a device's time and its matmul library's buffers (a probe's); unset: its data
  // sheet's rates, and no buffers.
  estimate::SpeedLookup rates;
  // The GPU of --rates' probe: a cuda trial that neither --device-memory nor its target puts on a
  // GPU is timed on this one (the node the probe was taken on).
  std::optional<estimate::Gpu> rates_gpu;
};

// The estimate of experiment file `file` (read and validated as `llmctl submit` reads it, local
// paths resolved beside it). A trial whose model is a hub reference (hf:...) is listed as not
// estimated: only an agent downloads its config.json; but a BLIP-2 preset's name, whose shapes
// are the hub's config.json. A BLIP-2 trial's captions are at the longest of its caption set
// when the set and its tokenizer are on this machine, else at data.max_seq_length. InvalidArgument
// (exit 2) for an unreadable or invalid file ("FILE:LINE:COLUMN: problem"), an unknown trial,
// format or --device-memory, and a local model whose config.json cannot be read.
StatusOr<std::string> EstimateExperiment(const std::string& file, const EstimateOptions& options);

// One trial's prediction, as `llmctl submit` stores it with the trial.
struct TrialPrediction {
  std::string trial = {};
  uint64_t peak_bytes = 0;
  uint64_t activation_bytes = 0;
  uint64_t model_state_bytes = 0;
  std::string peak_phase = {};
  uint64_t device_memory_bytes = 0;  // 0 without a device to judge against
  std::string device_source = {};    // "device_memory 216MiB", "target flavor ...: ..."
  std::optional<estimate::MemoryVerdict> verdict = {};  // none without a device
  // The predicted time, when the trial's device speed is known (step_seconds 0 otherwise).
  double step_seconds = 0;
  double tokens_per_second = 0;
  double trial_seconds = 0;      // 0 when the step count depends on the data (train.max_steps 0)
  std::string time_device = {};  // the DeviceSpeed's name: "h100-94gb", "cpu"
  std::string calibration = {};  // where the calibration came from
  std::string work_json = {};    // the step's StepWork, to calibrate from the measured run later
  // The pace canary's seconds the time assumes: the probe's whose rates it is at, at the machine's
  // usual pace where stored runs measured one (TrialEstimate's); 0 without a probe's. The report
  // sets the trial's steps' pace against it.
  double pace_seconds = 0;
};

// The predictions of `experiment` (parsed from `file` with local paths resolved) for every trial
// that can be estimated offline (not those whose model is on the hub, but BLIP-2's presets).
// InvalidArgument as EstimateExperiment for a trial whose model's config.json cannot be read.
StatusOr<std::vector<TrialPrediction>> PredictTrials(const Experiment& experiment,
                                                     const std::string& file,
                                                     const EstimateOptions& options = {});

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_ESTIMATE_H_
