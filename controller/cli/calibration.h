// The calibration of `llmctl estimate`'s and `llmctl plan`'s predicted time from measured runs: the
// trials of the embedded controller's store (LLMCTL_HOME's llmctl.db) that ended ok, each with the
// step's work predicted at submit, the device it was predicted on and its measured tokens/s
// (common/estimate/step_time.h's Calibrate). Read only: nothing is started or written.
#ifndef LLMCTL_CONTROLLER_CLI_CALIBRATION_H_
#define LLMCTL_CONTROLLER_CLI_CALIBRATION_H_

#include <map>
#include <string>
#include <vector>

#include "common/estimate/step_time.h"
#include "controller/cli/address.h"
#include "controller/store/records.h"

namespace llmctl::cli {

class StoredCalibrations {
 public:
  // The runs of the store at the embedded controller's data directory; none when there is no
  // store, or one this build cannot read (`note` says which).
  static StoredCalibrations Load(const EnvLookup& env);
  // The runs of `store` (tests).
  static StoredCalibrations FromRuns(const std::vector<store::TimedRun>& runs,
                                     const std::string& where);

  // `family`'s calibration on `device` from the runs predicted on it; the built-in one without
  // any.
  estimate::Calibration For(const estimate::DeviceSpeed& device,
                            estimate::ModelFamily family) const;

  // For as a lookup, for estimate's and plan's options; valid while this object lives.
  estimate::CalibrationLookup Lookup() const {
    return [this](const estimate::DeviceSpeed& device, estimate::ModelFamily family) {
      return For(device, family);
    };
  }

  const std::string& note() const { return note_; }

 private:
  std::map<std::string, std::vector<estimate::MeasuredRun>> runs_;  // by DeviceSpeed::name
  std::string where_;                                               // "the local store (PATH)"
  std::string note_;
};

}  // namespace llmctl::cli

#endif  // LLMCTL_CONTROLLER_CLI_CALIBRATION_H_
