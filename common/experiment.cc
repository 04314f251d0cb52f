// ParseExperiment, KeepOnlyTrials and LoadExperimentFile (experiment.h): an experiment file's
// structure read (name, description, target, trials and sweep, each checked at its place), its
// trial keys read by ExperimentValueReader and its trials made by TrialExpander.
#include "common/experiment.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>
#include <utility>

#include "common/experiment_trials.h"
#include "common/experiment_values.h"
#include "common/files.h"
#include "common/spelling.h"
#include "common/trial_keys.h"
#include "common/yaml_document.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

using experiment_internal::Assignment;
using experiment_internal::ExperimentValueReader;
using experiment_internal::KeysDirectlyUnder;
using experiment_internal::kMaxTrials;
using experiment_internal::NodeKindName;
using experiment_internal::Scope;
using experiment_internal::SweepAxis;
using experiment_internal::TrialExpander;
using experiment_internal::TrialSpec;

constexpr std::string_view kTrialFields[] = {"name", "description", "set", "expect"};
constexpr std::string_view kExpectValues[] = {"oom", "ok"};

bool IsNameCharacter(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

constexpr size_t kMaxNameBytes = 100;

bool IsValidName(std::string_view name) {
  return !name.empty() && name.size() <= kMaxNameBytes &&
         std::all_of(name.begin(), name.end(), IsNameCharacter);
}

class ExperimentParser {
 public:
  ExperimentParser(std::string_view filename, const ExperimentParseOptions& options)
      : filename_(filename), options_(options), values_(filename, options) {}

  StatusOr<Experiment> Parse(std::string_view text) {
    ASSIGN_OR_RETURN(const YAML::Node root, LoadYamlDocument(text, filename_));
    try {
      return ParseRoot(text, root);
    } catch (const YAML::Exception& error) {  // defensive: node accessors are used on checked types
      return ErrorAt(error.mark, "YAML error: " + error.msg);
    } catch (const std::exception& error) {
      return ErrorAt(YAML::Mark(), std::string("unexpected error: ") + error.what());
    }
  }

 private:
  Status ErrorAt(const YAML::Mark& mark, const std::string& message) const {
    return YamlErrorAt(filename_, mark, message);
  }

  StatusOr<Experiment> ParseRoot(std::string_view text, const YAML::Node& root) {
    if (root.IsNull() && HasNoYamlContent(text)) {
      return ErrorAt(YAML::Mark(),
                     "the experiment file is empty; it needs at least the training data, e.g. "
                     "`data: {path: train.jsonl}`");
    }
    if (!root.IsMap()) {
      return ErrorAt(root.Mark(),
                     "expected a map of keys at the top level (name:, model:, trials: ...), "
                     "got " +
                         std::string(NodeKindName(root)));
    }

    Experiment experiment;
    std::optional<YAML::Node> trials_node;
    std::optional<YAML::Node> sweep_node;
    YAML::Mark trials_key_mark;
    // Dotted key -> first place, across nested/dotted forms.
    std::map<std::string, YAML::Mark> seen_keys;
    std::vector<Assignment> base;  // the base config, which every trial starts from
    bool has_name = false;
    RETURN_IF_ERROR(values_.CheckDuplicateKeys(root, ""));

    for (auto it = root.begin(); it != root.end(); ++it) {
      // Copies: `it->` yields a temporary proxy in yaml-cpp, so a reference to its member would
      // dangle.
      const YAML::Node key_node = it->first;
      const YAML::Node value = it->second;
      if (!key_node.IsScalar()) return ErrorAt(key_node.Mark(), "expected a key name here");
      const std::string key = key_node.Scalar();
      if (key == "name") {
        ASSIGN_OR_RETURN(experiment.name, ScalarText(key_node, value, "name"));
        if (!IsValidName(experiment.name)) {
          return ErrorAt(value.Mark(), "experiment name '" + experiment.name +
                                           "' may contain only letters, digits, '.', '_' and '-' "
                                           "(at most 100)");
        }
        has_name = true;
      } else if (key == "description") {
        ASSIGN_OR_RETURN(experiment.description, ScalarText(key_node, value, "description"));
      } else if (key == "target") {
        RETURN_IF_ERROR(ParseTarget(key_node, value, experiment.target));
      } else if (key == "trials") {
        trials_node = value;
        trials_key_mark = key_node.Mark();
      } else if (key == "sweep") {
        sweep_node = value;
      } else {
        RETURN_IF_ERROR(
            values_.CollectAssignments(key_node, value, "", Scope::kTopLevel, seen_keys, base));
      }
    }
    if (!has_name) experiment.name = DefaultName();

    std::vector<TrialSpec> trial_specs;
    if (trials_node) {
      ASSIGN_OR_RETURN(trial_specs, ParseTrials(*trials_node, trials_key_mark));
    } else {
      TrialSpec single;
      single.name = experiment.name;
      single.implicit = true;
      trial_specs.push_back(std::move(single));
    }

    std::vector<SweepAxis> sweep;
    if (sweep_node) {
      ASSIGN_OR_RETURN(sweep, ParseSweep(*sweep_node));
    }
    RETURN_IF_ERROR(CheckSweepConflicts(trial_specs, sweep));
    TrialExpander expander(filename_, options_, std::move(base),
                           trials_node.has_value() || !sweep.empty());
    ASSIGN_OR_RETURN(experiment.trials, expander.Expand(trial_specs, sweep));
    return experiment;
  }

  std::string DefaultName() const {
    std::string stem = fs::path(filename_).stem().string();
    for (char& c : stem) {
      if (!IsNameCharacter(c)) c = '-';
    }
    if (stem.size() > 100) stem.resize(100);
    return stem.empty() ? "experiment" : stem;
  }

  StatusOr<std::string> ScalarText(const YAML::Node& key_node, const YAML::Node& value,
                                   std::string_view what) const {
    if (value.IsNull())
      return ErrorAt(key_node.Mark(), std::string(what) + ": a value is required");
    if (!value.IsScalar()) {
      return ErrorAt(value.Mark(), std::string(what) + ": expected a single value, got " +
                                       std::string(NodeKindName(value)));
    }
    return value.Scalar();
  }

  Status ParseTarget(const YAML::Node& key_node, const YAML::Node& value,
                     std::map<std::string, std::string>& target) const {
    if (!value.IsMap()) {
      return ErrorAt(
          value.IsNull() ? key_node.Mark() : value.Mark(),
          "target: expected a map such as {site: KVM@TACC, flavor: g1.h100.pci.1}, got " +
              std::string(NodeKindName(value)));
    }
    RETURN_IF_ERROR(values_.CheckDuplicateKeys(value, "target"));
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (!it->first.IsScalar()) return ErrorAt(it->first.Mark(), "expected a key name here");
      const std::string name = it->first.Scalar();
      ASSIGN_OR_RETURN(target[name], ScalarText(it->first, it->second, "target." + name));
    }
    return Status::Ok();
  }

  StatusOr<std::vector<TrialSpec>> ParseTrials(const YAML::Node& node,
                                               const YAML::Mark& key_mark) const {
    if (!node.IsSequence()) {
      return ErrorAt(node.IsNull() ? key_mark : node.Mark(),
                     "trials: expected a list of trials (- name: ...), got " +
                         std::string(NodeKindName(node)));
    }
    if (node.size() == 0) {
      return ErrorAt(node.Mark(),
                     "trials: the list is empty; add at least one trial (- name: ...), or "
                     "remove 'trials:' to run the base config as a single trial");
    }
    // Before any trial is parsed: a 4 MiB file lists some 200,000 one-line trials.
    if (node.size() > kMaxTrials) {
      return ErrorAt(key_mark, "trials: the list has " + std::to_string(node.size()) +
                                   " trials, more than " + std::to_string(kMaxTrials) +
                                   "; split the experiment");
    }
    std::vector<TrialSpec> trials;
    std::map<std::string, YAML::Mark> names;
    size_t index = 0;
    for (const YAML::Node& item : node) {
      ++index;
      ASSIGN_OR_RETURN(TrialSpec trial, ParseTrial(item, index));
      auto [previous, inserted] = names.emplace(trial.name, trial.item_mark);
      if (!inserted) {
        return ErrorAt(trial.item_mark, "duplicate trial name '" + trial.name +
                                            "' (first at line " +
                                            std::to_string(previous->second.line + 1) +
                                            "); trial names must be unique");
      }
      trials.push_back(std::move(trial));
    }
    return trials;
  }

  StatusOr<TrialSpec> ParseTrial(const YAML::Node& item, size_t index) const {
    const std::string which = "trial " + std::to_string(index);
    if (!item.IsMap()) {
      return ErrorAt(item.Mark(), which + ": expected a map (- name: ..., set: {...}), got " +
                                      std::string(NodeKindName(item)));
    }
    TrialSpec trial;
    trial.item_mark = item.Mark();
    std::optional<YAML::Mark> name_mark;
    std::optional<std::pair<YAML::Node, YAML::Node>> set_entry;
    RETURN_IF_ERROR(values_.CheckDuplicateKeys(item, ""));
    for (auto it = item.begin(); it != item.end(); ++it) {
      if (!it->first.IsScalar()) return ErrorAt(it->first.Mark(), "expected a key name here");
      const std::string field = it->first.Scalar();
      if (field == "name") {
        ASSIGN_OR_RETURN(trial.name, ScalarText(it->first, it->second, "name"));
        name_mark = it->second.Mark();
      } else if (field == "description") {
        ASSIGN_OR_RETURN(trial.description, ScalarText(it->first, it->second, "description"));
      } else if (field == "expect") {
        ASSIGN_OR_RETURN(std::string expect, ScalarText(it->first, it->second, "expect"));
        if (std::find(std::begin(kExpectValues), std::end(kExpectValues), expect) ==
            std::end(kExpectValues)) {
          return ErrorAt(it->second.Mark(),
                         "expect: '" + expect + "' is not allowed; choose one of oom, ok");
        }
        trial.expect = expect;
      } else if (field == "set") {
        set_entry = std::make_pair(it->first, it->second);
        trial.set_mark = it->first.Mark();
      } else if (FindTrialKey(field) != nullptr || IsTrialKeyGroup(field)) {
        return ErrorAt(it->first.Mark(), "'" + field +
                                             "' is a trial key, not a trial field; put it under "
                                             "'set:' (set: {" +
                                             field + ": ...})");
      } else {
        std::vector<std::string_view> fields(std::begin(kTrialFields), std::end(kTrialFields));
        const std::string_view nearest = ClosestMatch(field, fields);
        std::string message = "unknown trial field '" + field + "'";
        if (!nearest.empty()) {
          message += " (did you mean '" + std::string(nearest) + "'?)";
        } else {
          message += "; a trial has name, description, set and expect";
        }
        return ErrorAt(it->first.Mark(), message);
      }
    }
    if (!name_mark) {
      return ErrorAt(item.Mark(),
                     which + " has no name; add `name: ...` (names label the trial's results)");
    }
    if (!IsValidName(trial.name)) {
      return ErrorAt(*name_mark,
                     "trial name '" + trial.name +
                         "' may contain only letters, digits, '.', '_' and '-' (at most 100)");
    }
    if (set_entry) {
      const YAML::Node& set = set_entry->second;
      if (!set.IsMap()) {
        return ErrorAt(set.IsNull() ? set_entry->first.Mark() : set.Mark(),
                       "trial '" + trial.name +
                           "': set: expected a map of keys to change, e.g. "
                           "set: {train.micro_batch_size: 8}, got " +
                           std::string(NodeKindName(set)));
      }
      RETURN_IF_ERROR(values_.CheckDuplicateKeys(set, ""));
      std::map<std::string, YAML::Mark> seen;
      for (auto it = set.begin(); it != set.end(); ++it) {
        RETURN_IF_ERROR(values_.CollectAssignments(it->first, it->second, "", Scope::kTrialSet,
                                                   seen, trial.set));
      }
    }
    return trial;
  }

  StatusOr<std::vector<SweepAxis>> ParseSweep(const YAML::Node& node) const {
    if (!node.IsMap()) {
      return ErrorAt(node.Mark(),
                     "sweep: expected a map of keys to lists of values, e.g. "
                     "sweep: {precision: [32-true, bf16-true]}, got " +
                         std::string(NodeKindName(node)));
    }
    RETURN_IF_ERROR(values_.CheckDuplicateKeys(node, ""));
    std::vector<SweepAxis> axes;
    std::map<std::string, YAML::Mark> seen;
    for (auto it = node.begin(); it != node.end(); ++it) {
      RETURN_IF_ERROR(CollectSweepAxes(it->first, it->second, "", seen, axes));
    }
    return axes;
  }

  Status CollectSweepAxes(const YAML::Node& key_node, const YAML::Node& value,
                          const std::string& prefix, std::map<std::string, YAML::Mark>& seen,
                          std::vector<SweepAxis>& axes) const {
    if (!key_node.IsScalar()) return ErrorAt(key_node.Mark(), "expected a key name here");
    const std::string dotted =
        prefix.empty() ? key_node.Scalar() : prefix + "." + key_node.Scalar();
    const KeySpec* spec = FindTrialKey(dotted);
    if (spec == nullptr) {
      if (!IsTrialKeyGroup(dotted))
        return values_.UnknownKey(key_node.Mark(), dotted, prefix, Scope::kSweep);
      if (!value.IsMap()) {
        return ErrorAt(value.IsNull() ? key_node.Mark() : value.Mark(),
                       "sweep: '" + dotted + "' groups keys; write e.g. " + dotted + ": {" +
                           std::string(KeysDirectlyUnder(dotted)[0]) + ": [...]}");
      }
      RETURN_IF_ERROR(values_.CheckDuplicateKeys(value, dotted));
      for (auto it = value.begin(); it != value.end(); ++it) {
        RETURN_IF_ERROR(CollectSweepAxes(it->first, it->second, dotted, seen, axes));
      }
      return Status::Ok();
    }
    auto [previous, inserted] = seen.emplace(dotted, key_node.Mark());
    if (!inserted) return values_.DuplicateKey(key_node.Mark(), dotted, previous->second);
    if (!value.IsSequence() || value.size() == 0) {
      return ErrorAt(value.IsNull() ? key_node.Mark() : value.Mark(),
                     "sweep: " + dotted + ": expected a non-empty list of values to try, e.g. " +
                         dotted + ": [a, b]");
    }
    // Expand refuses this too, but only after the values are checked for duplicates, which takes
    // quadratic time: a list of 100,000 values would take minutes.
    if (value.size() > kMaxTrials) {
      return ErrorAt(key_node.Mark(), "the sweep makes more than " + std::to_string(kMaxTrials) +
                                          " trials; split the experiment or sweep fewer values");
    }
    SweepAxis axis;
    axis.spec = spec;
    axis.key_mark = key_node.Mark();
    for (const YAML::Node& item : value) {
      if (item.IsNull() || (item.IsScalar() && item.Scalar().empty())) {
        return ErrorAt(item.IsNull() ? value.Mark() : item.Mark(),
                       "sweep: " + dotted + ": a value to try cannot be empty");
      }
      ASSIGN_OR_RETURN(Assignment choice, values_.ConvertValue(*spec, key_node.Mark(), item));
      for (const Assignment& earlier : axis.values) {
        if (earlier.value == choice.value) {
          return ErrorAt(choice.value_mark,
                         "sweep: " + dotted + ": value '" + choice.text + "' is listed twice");
        }
      }
      axis.values.push_back(std::move(choice));
    }
    axes.push_back(std::move(axis));
    return Status::Ok();
  }

  Status CheckSweepConflicts(const std::vector<TrialSpec>& trials,
                             const std::vector<SweepAxis>& sweep) const {
    for (const TrialSpec& trial : trials) {
      for (const Assignment& assignment : trial.set) {
        for (const SweepAxis& axis : sweep) {
          if (axis.spec == assignment.spec) {
            return ErrorAt(assignment.key_mark,
                           "trial '" + trial.name + "' sets " + std::string(axis.spec->name) +
                               ", which the sweep also varies (line " +
                               std::to_string(axis.key_mark.line + 1) +
                               "); remove it from the trial's set or from the sweep");
          }
        }
      }
    }
    return Status::Ok();
  }

  const std::string filename_;
  const ExperimentParseOptions options_;
  const ExperimentValueReader values_;
};

}  // namespace

StatusOr<Experiment> ParseExperiment(std::string_view yaml_text, std::string_view filename,
                                     const ExperimentParseOptions& options) {
  ExperimentParser parser(filename, options);
  return parser.Parse(yaml_text);
}

Status KeepOnlyTrials(const std::vector<std::string>& names, std::string_view filename,
                      Experiment& experiment) {
  // Sets, not scans: a request may name a trial millions of times (Submit's only_trials).
  std::set<std::string_view> trials;
  std::string listed;
  for (const Trial& trial : experiment.trials) {
    trials.insert(trial.name);
    listed += (listed.empty() ? "" : ", ") + trial.name;
  }
  for (const std::string& wanted : names) {
    if (!trials.contains(wanted)) {
      return InvalidArgumentError(std::string(filename) + ": no trial named '" + wanted +
                                  "' (its trials: " + listed + ")");
    }
  }
  const std::set<std::string_view> kept(names.begin(), names.end());
  std::erase_if(experiment.trials, [&](const Trial& trial) { return !kept.contains(trial.name); });
  return Status::Ok();
}

StatusOr<Experiment> LoadExperimentFile(const std::string& path,
                                        const ExperimentParseOptions& options) {
  StatusOr<std::string> text = ReadFileToString(path, kMaxExperimentFileBytes);
  if (!text.ok()) {
    return Status(text.status().code(), "experiment file: " + text.status().message());
  }
  return ParseExperiment(*text, path, options);
}

std::string NameFrom(std::string_view text) {
  std::string name;
  bool dropped = false;  // characters a name may not hold since the last one it may
  for (const char c : text) {
    if (!IsNameCharacter(c)) {
      dropped = true;
      continue;
    }
    if (dropped && !name.empty()) name += '-';
    dropped = false;
    name += c;
  }
  return name.substr(0, kMaxNameBytes);
}

}  // namespace llmctl
