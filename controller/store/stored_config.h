// A trial's config as the controller stored it at submit (TrialConfig::ToJson), read back: the
// store bounds an attempt's event ranks by it (events.cc), and the dispatcher launches a trial,
// follows its events and copies its checkpoints by it. One reading, so both see the same config
// and name a damaged one the same way.
#ifndef LLMCTL_CONTROLLER_STORE_STORED_CONFIG_H_
#define LLMCTL_CONTROLLER_STORE_STORED_CONFIG_H_

#include <nlohmann/json.hpp>
#include <string>

#include "common/foreign_json.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "controller/store/records.h"

namespace llmctl::store {

// `trial`'s config; DataLoss "the stored config of trial 7 is damaged: ..." when its stored text
// is not JSON or not a config (TrialConfig::FromJson's reason).
inline StatusOr<TrialConfig> StoredConfig(const TrialRecord& trial) {
  // The store's file may have been damaged or edited: parsed within ParseJsonWithinDepth's depth.
  const std::string damaged =
      "the stored config of trial " + std::to_string(trial.id) + " is damaged: ";
  StatusOr<nlohmann::json> json = ParseJsonWithinDepth(trial.config_json);
  if (!json.ok()) return DataLossError(damaged + json.status().message());
  StatusOr<TrialConfig> config = TrialConfig::FromJson(*json);
  if (!config.ok()) return DataLossError(damaged + config.status().message());
  return config;
}

}  // namespace llmctl::store

#endif  // LLMCTL_CONTROLLER_STORE_STORED_CONFIG_H_
