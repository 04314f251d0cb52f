// An experiment file's trials made from its parts: the base config, each trial's `set:` and the
// sweep's values combined in that order, once per combination of the sweep, and each trial checked
// (FindConfigProblem, with the model's shape where it can be known), a problem pointing where the
// offending key was written.
//
// Internal to common/experiment*.cc.
#ifndef LLMCTL_COMMON_EXPERIMENT_TRIALS_H_
#define LLMCTL_COMMON_EXPERIMENT_TRIALS_H_

#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/experiment.h"
#include "common/experiment_values.h"
#include "common/model_config.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "common/trial_keys.h"

namespace llmctl::experiment_internal {

// An experiment of more trials than this, listed or swept, is almost certainly a mistake (and would
// flood the scheduler and the store): the file is refused, saying so.
inline constexpr size_t kMaxTrials = 1000;

struct TrialSpec {
  std::string name;
  std::string description;
  std::optional<std::string> expect;
  std::vector<Assignment> set;
  YAML::Mark item_mark;                // the list item, for problems with no better place
  std::optional<YAML::Mark> set_mark;  // the `set:` key
  bool implicit = false;               // made up because the file has no `trials:`
};

struct SweepAxis {
  const KeySpec* spec = nullptr;
  YAML::Mark key_mark;
  std::vector<Assignment> values;
};

class TrialExpander {
 public:
  // `base`: the file's base config. `named_trials`: the file has trials or a sweep, so messages
  // name the trial.
  TrialExpander(std::string_view filename, const ExperimentParseOptions& options,
                std::vector<Assignment> base, bool named_trials);

  // Each of `specs` once per combination of the sweep's values, the first axis varying slowest.
  StatusOr<std::vector<Trial>> Expand(const std::vector<TrialSpec>& specs,
                                      const std::vector<SweepAxis>& sweep);

 private:
  Status ErrorAt(const YAML::Mark& mark, const std::string& message) const;

  StatusOr<Trial> BuildTrial(const TrialSpec& spec,
                             const std::vector<const Assignment*>& sweep_choices);

  // The model's shape for the checks that need one, into *model: null where the model is taken on
  // trust (BLIP-2, whose shape is not a ModelConfig; a hub or node model; a directory when paths
  // are not resolved here). A problem with the model (unreadable, wrong for data.format, a
  // malformed hub reference) names the keys to point at.
  std::optional<ConfigProblem> FindModelProblem(const TrialConfig& config,
                                                const ModelConfig** model);

  const std::string filename_;
  const ExperimentParseOptions options_;
  const std::vector<Assignment> base_;
  const bool named_trials_;  // messages name the trial when the file has trials or a sweep
  std::map<std::string, ModelConfig> models_;  // model directories read so far
};

}  // namespace llmctl::experiment_internal

#endif  // LLMCTL_COMMON_EXPERIMENT_TRIALS_H_
