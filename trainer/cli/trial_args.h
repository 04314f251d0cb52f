// What llm-train's command line says of the trial to run (--config, --trial, --set, --input-name
// and the rest), apart from the CLI11 wiring that reads it (trainer/llm_train_main.cc), so that the
// rules for these values, the user's own input, are tested without starting a process.
//
// No LibTorch.
#ifndef LLMCTL_TRAINER_CLI_TRIAL_ARGS_H_
#define LLMCTL_TRAINER_CLI_TRIAL_ARGS_H_

#include <map>
#include <string>
#include <vector>

#include "common/experiment.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/cli/launcher_args.h"

namespace llmctl::llm_train {

// The flags that pick, change and run a trial (the usage in trainer/llm_train_main.cc).
struct TrialArgs {
  std::string config_path;
  std::string trial_name;
  std::vector<std::string> overrides;
  std::string events_path;
  std::string runs_path;
  bool prepare_only = false;
  std::string resume_from;
  LauncherFlags launcher;
  std::vector<std::string> input_names;
};

// The trial --trial names, or the file's only one.
StatusOr<const Trial*> PickTrial(const Experiment& experiment, const std::string& config_path,
                                 const std::string& trial_name);

// The trial's settings after --set, with node: paths and the labs' spellings resolved.
Status ApplyOverrides(const std::vector<std::string>& overrides, TrialConfig& config);

// --input-name's PATH=NAME entries as a map from PATH to NAME (common/text.h's
// ParseInputNameArgument reads each); InvalidArgument for a malformed entry or a PATH given two
// different names.
StatusOr<std::map<std::string, std::string>> ParseInputNames(
    const std::vector<std::string>& input_names);

}  // namespace llmctl::llm_train

#endif  // LLMCTL_TRAINER_CLI_TRIAL_ARGS_H_
