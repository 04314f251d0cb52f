#include "controller/cli/calibration.h"

#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/estimate/rate_probe.h"
#include "common/foreign_json.h"
#include "controller/store/store.h"

namespace llmctl::cli {

StoredCalibrations StoredCalibrations::FromRuns(const std::vector<store::TimedRun>& runs,
                                                const std::string& where) {
  StoredCalibrations calibrations;
  calibrations.where_ = where;
  for (const store::TimedRun& run : runs) {
    const nlohmann::json prediction = ParseForeignJson(run.prediction_json);
    // Trials submitted before predictions had a time, or without one (a GPU the table lacks).
    if (!prediction.is_object() || !prediction.contains("work")) continue;
    StatusOr<estimate::StepWork> work = estimate::StepWork::FromJson(prediction["work"]);
    // A stored null (or any non-string) is no device: value() would throw on it.
    const auto time_device = prediction.find("time_device");
    const std::string device = time_device != prediction.end() && time_device->is_string()
                                   ? time_device->get<std::string>()
                                   : "";
    // A controller's answer is another process's bytes: a time that is not one is no run.
    const bool timed =
        run.steps >= 1 && std::isfinite(run.seconds_per_token) && run.seconds_per_token > 0;
    if (!work.ok() || device.empty() || !timed) continue;
    // Another process's figure: only a canary's seconds are a pace.
    calibrations.runs_[device].push_back(
        {*work, run.seconds_per_token,
         estimate::IsPaceSeconds(run.pace_seconds) ? run.pace_seconds : 0.0});
  }
  return calibrations;
}

StoredCalibrations StoredCalibrations::Load(const EnvLookup& env) {
  StatusOr<std::filesystem::path> dir = EmbeddedDataDir(env);
  if (!dir.ok()) {
    StoredCalibrations none;
    none.note_ = dir.status().message();
    return none;
  }
  const std::string path = (*dir / "llmctl.db").string();
  StatusOr<std::unique_ptr<store::Store>> opened = store::Store::OpenReadOnly(path);
  StatusOr<std::vector<store::TimedRun>> runs =
      opened.ok() ? (*opened)->TimedRuns()
                  : StatusOr<std::vector<store::TimedRun>>(opened.status());
  if (!runs.ok()) {
    StoredCalibrations none;
    // No store yet is the usual case before the first submit: nothing to say.
    if (runs.status().code() != StatusCode::kNotFound) {
      none.note_ = "measured runs not read: " + runs.status().message();
    }
    return none;
  }
  return FromRuns(*runs, "the local store (" + path + ")");
}

estimate::Calibration StoredCalibrations::For(const estimate::DeviceSpeed& device,
                                              estimate::ModelFamily family) const {
  auto found = runs_.find(device.name);
  if (found == runs_.end()) return estimate::DefaultCalibration(device, family);
  estimate::Calibration calibration = estimate::Calibrate(device, family, found->second);
  if (calibration.runs() > 0) calibration.source += " in " + where_;
  return calibration;
}

}  // namespace llmctl::cli
