// TrialExpander (experiment_trials.h): an experiment's trials combined from the file's parts and
// checked one by one.
#include "common/experiment_trials.h"

#include <limits>
#include <utility>

#include "common/blip2_config.h"
#include "common/text.h"
#include "common/trial_config.h"
#include "common/trial_name.h"
#include "common/yaml_document.h"

namespace llmctl::experiment_internal {
namespace {

// Where a key got its value; a later level overrides an earlier one.
enum class Level { kBase = 0, kTrial = 1, kSweep = 2 };

struct Origin {
  Level level;
  YAML::Mark mark;
};

}  // namespace

TrialExpander::TrialExpander(std::string_view filename, const ExperimentParseOptions& options,
                             std::vector<Assignment> base, bool named_trials)
    : filename_(filename), options_(options), base_(std::move(base)), named_trials_(named_trials) {}

Status TrialExpander::ErrorAt(const YAML::Mark& mark, const std::string& message) const {
  return YamlErrorAt(filename_, mark, message);
}

StatusOr<std::vector<Trial>> TrialExpander::Expand(const std::vector<TrialSpec>& specs,
                                                   const std::vector<SweepAxis>& sweep) {
  size_t combinations = 1;
  for (const SweepAxis& axis : sweep) {
    combinations *= axis.values.size();
    if (combinations * specs.size() > kMaxTrials) {
      return ErrorAt(axis.key_mark, "the sweep makes more than " + std::to_string(kMaxTrials) +
                                        " trials; split the experiment or sweep fewer values");
    }
  }
  std::vector<Trial> trials;
  for (const TrialSpec& spec : specs) {
    for (size_t combination = 0; combination < combinations; ++combination) {
      // Mixed-radix digits of `combination`, the first axis the most significant (varies
      // slowest).
      std::vector<const Assignment*> choices(sweep.size());
      size_t rest = combination;
      for (size_t axis = sweep.size(); axis-- > 0;) {
        choices[axis] = &sweep[axis].values[rest % sweep[axis].values.size()];
        rest /= sweep[axis].values.size();
      }
      ASSIGN_OR_RETURN(Trial trial, BuildTrial(spec, choices));
      trials.push_back(std::move(trial));
    }
  }
  return trials;
}

StatusOr<Trial> TrialExpander::BuildTrial(const TrialSpec& spec,
                                          const std::vector<const Assignment*>& sweep_choices) {
  Trial trial;
  trial.name = spec.name;
  trial.description = spec.description;
  trial.expect = spec.expect;
  std::map<std::string, Origin> origins;

  auto apply = [&](const Assignment& assignment, Level level) -> Status {
    const std::string key(assignment.spec->name);
    Status status = assignment.value ? trial.config.Set(key, *assignment.value)
                                     : trial.config.SetFromText(key, "");
    if (!status.ok()) return ErrorAt(assignment.value_mark, status.message());
    // A sweep's key is shared by all its values; the value itself says which combination failed.
    origins[key] =
        Origin{level, level == Level::kSweep ? assignment.value_mark : assignment.key_mark};
    return Status::Ok();
  };
  for (const Assignment& assignment : base_) RETURN_IF_ERROR(apply(assignment, Level::kBase));
  for (const Assignment& assignment : spec.set) RETURN_IF_ERROR(apply(assignment, Level::kTrial));
  if (!sweep_choices.empty()) {
    std::string suffix;
    for (const Assignment* choice : sweep_choices) {
      RETURN_IF_ERROR(apply(*choice, Level::kSweep));
      // A value as written becomes part of the trial's name, which every listing prints: a local
      // model directory's name may hold an escape sequence.
      if (const std::string problem =
              PrintableTextProblem(choice->text, std::numeric_limits<size_t>::max());
          !problem.empty()) {
        return ErrorAt(choice->value_mark,
                       "sweep value of " + std::string(choice->spec->name) + " '" +
                           OnOneLine(choice->text, 80) + "' " + problem +
                           ", and trial names are made of the sweep's values: rename it");
      }
      if (!suffix.empty()) suffix += ",";
      suffix += std::string(choice->spec->name) + "=" + choice->text;
    }
    trial.name += "/" + suffix;
    // A node names the run's directory after the trial: a sweep's values can make it too long.
    if (const std::string problem = TrialNameProblem(trial.name); !problem.empty()) {
      return ErrorAt(sweep_choices.front()->value_mark,
                     "trial name '" + OnOneLine(trial.name) + "' " + problem +
                         ": shorten the trial's name or the sweep's values");
    }
  }

  // Where to point for a problem with these keys: the most specific place one of them was
  // written.
  auto location = [&](const std::vector<std::string>& keys) {
    const Origin* best = nullptr;
    for (const std::string& key : keys) {
      auto it = origins.find(key);
      if (it != origins.end() && (best == nullptr || it->second.level > best->level))
        best = &it->second;
    }
    if (best != nullptr) return best->mark;
    if (spec.set_mark) return *spec.set_mark;
    return spec.implicit ? YAML::Mark() : spec.item_mark;
  };
  const std::string prefix = named_trials_ ? "trial '" + trial.name + "': " : "";

  ApplyLabSpellings(trial.config);
  const ModelConfig* model = nullptr;
  if (std::optional<ConfigProblem> problem = FindModelProblem(trial.config, &model)) {
    return ErrorAt(location(problem->keys), prefix + problem->message);
  }
  if (std::optional<ConfigProblem> problem = FindConfigProblem(trial.config, model)) {
    return ErrorAt(location(problem->keys), prefix + problem->message);
  }
  return trial;
}

std::optional<ConfigProblem> TrialExpander::FindModelProblem(const TrialConfig& config,
                                                             const ModelConfig** model) {
  const std::string model_name = config.settings().model.name;
  // BLIP-2 reads images and LLaMA-family models read text: which one the model is decides
  // data.format. Taken on trust where the model is not here (a hub or node model).
  std::optional<bool> blip2;
  if (IsBlip2Preset(model_name)) {
    blip2 = true;
  } else if (FindPreset(model_name) != nullptr) {
    blip2 = false;
  } else if (options_.resolve_local_paths && !IsHubModelRef(model_name) &&
             !IsNodePath(model_name)) {
    StatusOr<std::optional<Blip2Config>> resolved = ResolveBlip2Model(model_name);
    if (!resolved.ok()) {
      return ConfigProblem{{"model"}, "model: " + resolved.status().message()};
    }
    blip2 = resolved->has_value();
  }
  if (blip2) {
    if (std::optional<ConfigProblem> problem = FindModelFamilyProblem(config, *blip2)) {
      return problem;
    }
  }
  if (blip2.value_or(false)) {
    // BLIP-2's shape is not a ModelConfig: the checks that need one are llm-train's.
  } else if (const ModelConfig* preset = FindPreset(model_name)) {
    *model = preset;
  } else if (IsHubModelRef(model_name)) {
    // Checked for form everywhere; its shape is known only once an agent has downloaded it, so
    // the checks that need it are skipped, as for any model taken on trust.
    if (StatusOr<HubModelRef> ref = ParseHubModelRef(model_name); !ref.ok()) {
      return ConfigProblem{{"model"}, ref.status().message()};
    }
  } else if (IsNodePath(model_name)) {
    // A directory only the node has: taken on trust, as above (llm-train checks it there).
  } else if (options_.resolve_local_paths) {
    auto cached = models_.find(model_name);
    if (cached == models_.end()) {
      StatusOr<ModelConfig> resolved = ResolveModel(model_name);
      if (!resolved.ok()) {
        return ConfigProblem{{"model"}, "model: " + resolved.status().message()};
      }
      cached = models_.emplace(model_name, std::move(*resolved)).first;
    }
    *model = &cached->second;
  }

  return std::nullopt;
}

}  // namespace llmctl::experiment_internal
