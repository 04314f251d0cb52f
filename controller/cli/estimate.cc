#include "controller/cli/estimate.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/experiment.h"
#include "common/files.h"
#include "controller/cli/estimate_render.h"
#include "controller/cli/estimate_trial.h"

namespace llmctl::cli {

StatusOr<std::vector<TrialPrediction>> PredictTrials(const Experiment& experiment,
                                                     const std::string& file,
                                                     const EstimateOptions& options) {
  std::vector<TrialPrediction> predictions;
  for (const Trial& t : experiment.trials) {
    ASSIGN_OR_RETURN(TrialEstimate e, EstimateTrial(t, experiment, file, options, std::nullopt));
    if (!e.memory) continue;
    predictions.push_back({.trial = t.name,
                           .peak_bytes = e.memory->peak_bytes,
                           .activation_bytes = e.memory->activation_bytes,
                           .model_state_bytes = e.memory->state.device_bytes(),
                           .peak_phase = e.memory->peak_phase,
                           .device_memory_bytes = e.device ? e.device->bytes : 0,
                           .device_source = e.device ? e.device->source : "",
                           .verdict = e.Verdict()});
    if (e.time) {
      TrialPrediction& p = predictions.back();
      p.step_seconds = e.time->step_seconds;
      p.tokens_per_second = e.time->tokens_per_second;
      p.trial_seconds = e.time->trial_seconds;
      p.time_device = e.time_device;
      // Both halves always: without a probe (LLMCTL_RATE_PROBE=off) the report said only the
      // calibration, not that the rates were the data sheet's.
      p.calibration = e.calibration + "; " + RatesText(e.rates);
      p.work_json = e.work->ToJson().dump();
      p.pace_seconds = e.pace_seconds;
    }
  }
  return predictions;
}

StatusOr<std::string> EstimateExperiment(const std::string& file, const EstimateOptions& options) {
  if (options.format != "table" && options.format != "json") {
    return InvalidArgumentError("--format: expected table or json, got '" + options.format + "'");
  }
  ASSIGN_OR_RETURN(const std::optional<VerdictDevice> device_option,
                   ParseDeviceOption(options.device_memory));
  StatusOr<std::string> text = ReadFileToString(file, kMaxExperimentFileBytes);
  if (!text.ok()) return InvalidArgumentError(text.status().message());  // names the file
  // As `llmctl submit` checks it on this machine: the same messages, FILE:LINE:COLUMN.
  ASSIGN_OR_RETURN(Experiment experiment,
                   ParseExperiment(*text, file, {.resolve_local_paths = true}));
  std::vector<TrialEstimate> estimates;
  std::string names;
  for (const Trial& t : experiment.trials) {
    names += (names.empty() ? "" : ", ") + t.name;
    if (!options.trial.empty() && t.name != options.trial) continue;
    ASSIGN_OR_RETURN(TrialEstimate estimate,
                     EstimateTrial(t, experiment, file, options, device_option));
    estimates.push_back(std::move(estimate));
  }
  if (estimates.empty()) {
    return InvalidArgumentError(file + ": no trial named '" + options.trial +
                                "' (trials: " + names + ")");
  }
  return options.format == "json" ? RenderEstimateJson(file, experiment, estimates, options)
                                  : RenderEstimateTable(file, experiment, estimates, options);
}

}  // namespace llmctl::cli
