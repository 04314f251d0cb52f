#include "common/experiment.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <utility>

#include "common/blip2_config.h"
#include "common/files.h"
#include "common/model_config.h"
#include "common/spelling.h"
#include "common/text.h"
#include "common/trial_keys.h"
#include "common/yaml_document.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

// An experiment of more trials than this, listed or swept, is almost certainly a mistake (and would
// flood the scheduler and the store): the file is refused, saying so.
constexpr size_t kMaxTrials = 1000;

constexpr std::string_view kTopLevelFields[] = {"name", "description", "target", "trials", "sweep"};
constexpr std::string_view kTrialFields[] = {"name", "description", "set", "expect"};
constexpr std::string_view kExpectValues[] = {"oom", "ok"};

// Where a key got its value; a later level overrides an earlier one.
enum class Level { kBase = 0, kTrial = 1, kSweep = 2 };

// One `key: value` from the file, already parsed and checked against the registry.
struct Assignment {
  const KeySpec* spec = nullptr;
  std::optional<KeyValue> value;  // nullopt: cleared (null or "" for a key without a default)
  YAML::Mark key_mark;
  YAML::Mark value_mark;
  std::string text;  // the value as written, for sweep trial names
};

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

struct Origin {
  Level level;
  YAML::Mark mark;
};

bool IsNameCharacter(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

bool IsValidName(std::string_view name) {
  return !name.empty() && name.size() <= 100 &&
         std::all_of(name.begin(), name.end(), IsNameCharacter);
}

std::string Join(const std::vector<std::string_view>& items) {
  std::string joined;
  for (std::string_view item : items) {
    if (!joined.empty()) joined += ", ";
    joined += item;
  }
  return joined;
}

std::string_view NodeKindName(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "a single value";
    default:
      return "an undefined value";
  }
}

// Keys that may appear directly inside `prefix` ("" for the top level), in registry order.
std::vector<std::string_view> KeysDirectlyUnder(std::string_view prefix) {
  std::vector<std::string_view> names;
  for (const KeySpec& spec : TrialKeys()) {
    std::string_view rest = spec.name;
    if (!prefix.empty()) {
      if (rest.size() <= prefix.size() + 1 || rest.substr(0, prefix.size()) != prefix ||
          rest[prefix.size()] != '.') {
        continue;
      }
      rest.remove_prefix(prefix.size() + 1);
    }
    const std::string_view segment = rest.substr(0, rest.find('.'));
    if (std::find(names.begin(), names.end(), segment) == names.end()) names.push_back(segment);
  }
  return names;
}

class ExperimentParser {
 public:
  ExperimentParser(std::string_view filename, const ExperimentParseOptions& options)
      : filename_(filename), options_(options) {}

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
    std::map<std::string, YAML::Mark>
        seen_keys;  // dotted key -> first place, across nested/dotted forms
    bool has_name = false;
    RETURN_IF_ERROR(CheckDuplicateKeys(root, ""));

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
            CollectAssignments(key_node, value, "", Scope::kTopLevel, seen_keys, base_));
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
    named_trials_ = trials_node.has_value() || !sweep.empty();
    RETURN_IF_ERROR(CheckSweepConflicts(trial_specs, sweep));
    ASSIGN_OR_RETURN(experiment.trials, Expand(trial_specs, sweep));
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

  Status DuplicateKey(const YAML::Mark& mark, const std::string& key,
                      const YAML::Mark& first) const {
    return ErrorAt(mark, "'" + key + "' is set twice (first at line " +
                             std::to_string(first.line + 1) + ", column " +
                             std::to_string(first.column + 1) + ")");
  }

  // YAML forbids a key twice in one map, but yaml-cpp keeps both; the second would silently win.
  Status CheckDuplicateKeys(const YAML::Node& map, const std::string& prefix) const {
    std::map<std::string, YAML::Mark> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      if (!it->first.IsScalar()) continue;  // reported as "expected a key name" by the caller
      auto [previous, inserted] = seen.emplace(it->first.Scalar(), it->first.Mark());
      if (!inserted) {
        const std::string key =
            prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar();
        return DuplicateKey(it->first.Mark(), key, previous->second);
      }
    }
    return Status::Ok();
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
    RETURN_IF_ERROR(CheckDuplicateKeys(value, "target"));
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (!it->first.IsScalar()) return ErrorAt(it->first.Mark(), "expected a key name here");
      const std::string name = it->first.Scalar();
      ASSIGN_OR_RETURN(target[name], ScalarText(it->first, it->second, "target." + name));
    }
    return Status::Ok();
  }

  enum class Scope { kTopLevel, kTrialSet, kSweep };

  // The "unknown key" message: nearest key (or top-level field) if one is close, else what is valid
  // here.
  Status UnknownKey(const YAML::Mark& mark, const std::string& dotted, std::string_view prefix,
                    Scope scope) const {
    std::string suggestion;
    if (scope == Scope::kTopLevel && prefix.empty()) {
      std::vector<std::string_view> fields(std::begin(kTopLevelFields), std::end(kTopLevelFields));
      const std::string_view field = ClosestMatch(dotted, fields);
      if (!field.empty() && EditDistance(dotted, field) <= 1) suggestion = std::string(field);
      if (suggestion.empty()) suggestion = NearestTrialKey(dotted);
      if (suggestion.empty()) suggestion = std::string(field);
    } else {
      suggestion = NearestTrialKey(dotted);
    }
    std::string message = "unknown key '" + dotted + "'";
    if (!suggestion.empty())
      return ErrorAt(mark, message + " (did you mean '" + suggestion + "'?)");
    std::vector<std::string_view> valid;
    if (scope == Scope::kTopLevel && prefix.empty()) {
      valid.assign(std::begin(kTopLevelFields), std::end(kTopLevelFields));
    }
    for (std::string_view name : KeysDirectlyUnder(prefix)) valid.push_back(name);
    message +=
        prefix.empty() ? "; valid keys here: " : "; keys under " + std::string(prefix) + ": ";
    return ErrorAt(mark, message + Join(valid));
  }

  // Flattens `key: value` (value possibly a nested map of a key group) into assignments.
  Status CollectAssignments(const YAML::Node& key_node, const YAML::Node& value,
                            const std::string& prefix, Scope scope,
                            std::map<std::string, YAML::Mark>& seen,
                            std::vector<Assignment>& out) const {
    if (!key_node.IsScalar()) return ErrorAt(key_node.Mark(), "expected a key name here");
    const std::string dotted =
        prefix.empty() ? key_node.Scalar() : prefix + "." + key_node.Scalar();
    const KeySpec* spec = FindTrialKey(dotted);
    if (spec == nullptr) {
      if (!IsTrialKeyGroup(dotted)) return UnknownKey(key_node.Mark(), dotted, prefix, scope);
      if (!value.IsMap()) {
        std::vector<std::string_view> members = KeysDirectlyUnder(dotted);
        return ErrorAt(value.IsNull() ? key_node.Mark() : value.Mark(),
                       "'" + dotted + "' groups keys (" + Join(members) +
                           "); write them nested, e.g. " + dotted + ": {" +
                           std::string(members[0]) + ": ...}, or dotted, e.g. " + dotted + "." +
                           std::string(members[0]) + ": ...");
      }
      RETURN_IF_ERROR(CheckDuplicateKeys(value, dotted));
      for (auto it = value.begin(); it != value.end(); ++it) {
        RETURN_IF_ERROR(CollectAssignments(it->first, it->second, dotted, scope, seen, out));
      }
      return Status::Ok();
    }
    auto [previous, inserted] = seen.emplace(dotted, key_node.Mark());
    if (!inserted) return DuplicateKey(key_node.Mark(), dotted, previous->second);
    ASSIGN_OR_RETURN(Assignment assignment, ConvertValue(*spec, key_node.Mark(), value));
    out.push_back(std::move(assignment));
    return Status::Ok();
  }

  // Parses one value of `spec` from its YAML node.
  StatusOr<Assignment> ConvertValue(const KeySpec& spec, const YAML::Mark& key_mark,
                                    const YAML::Node& value) const {
    Assignment assignment;
    assignment.spec = &spec;
    assignment.key_mark = key_mark;
    // yaml-cpp places a missing value at the next token; the key is where the user should look.
    assignment.value_mark = value.IsNull() ? key_mark : value.Mark();
    const std::string name(spec.name);

    if (value.IsNull() || (value.IsScalar() && value.Scalar().empty())) {
      if (!spec.default_value.empty()) {
        return ErrorAt(assignment.value_mark, name + ": a value is required (expected " +
                                                  DescribeExpectedValue(spec) + ")");
      }
      return assignment;  // cleared: the key has no value, like its default
    }
    if (value.IsMap()) {
      return ErrorAt(value.Mark(),
                     name + ": expected " + DescribeExpectedValue(spec) + ", got a map");
    }
    if (value.IsSequence()) {
      if (spec.type != KeyType::kFloatList && spec.type != KeyType::kStringList) {
        return ErrorAt(value.Mark(),
                       name + ": expected " + DescribeExpectedValue(spec) + ", got a list");
      }
      std::vector<std::string> items;
      for (const YAML::Node& item : value) {
        if (!item.IsScalar()) {
          return ErrorAt(item.Mark(), name + ": expected " + DescribeExpectedValue(spec) +
                                          ", got " + std::string(NodeKindName(item)) +
                                          " inside the list");
        }
        // Check items one by one so an error points at the bad one.
        StatusOr<KeyValue> single = ParseKeyValueList(spec, {item.Scalar()});
        if (!single.ok()) return ErrorAt(item.Mark(), single.status().message());
        items.push_back(item.Scalar());
      }
      ASSIGN_OR_RETURN(KeyValue parsed, ParseKeyValueList(spec, items));
      assignment.value = std::move(parsed);
      assignment.text = FormatKeyValue(*assignment.value);
      return assignment;
    }
    StatusOr<KeyValue> parsed = ParseKeyValue(spec, value.Scalar());
    if (!parsed.ok()) return ErrorAt(value.Mark(), parsed.status().message());
    if (options_.output_dir_in_run && spec.name == "output_dir") {
      // Inside the run's output/ on the node, not beside this file: kept as written.
      const StatusOr<std::string> inside = OutputDirInRun(value.Scalar());
      if (!inside.ok()) return ErrorAt(value.Mark(), inside.status().message());
      assignment.value = std::move(*parsed);
      assignment.text = value.Scalar();
      return assignment;
    }
    assignment.value = ResolvePath(spec, std::move(*parsed));
    assignment.text = value.Scalar();
    return assignment;
  }

  // See "Relative paths" in the header.
  KeyValue ResolvePath(const KeySpec& spec, KeyValue value) const {
    if (spec.type != KeyType::kPath && spec.name != "model") return value;
    const std::string& written = std::get<std::string>(value);
    if (IsNodePath(written) || !options_.resolve_local_paths) return value;
    if (!IsPathValue(spec, written)) return value;
    return KeyValue(ResolveLocalPath(filename_, written));
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
    RETURN_IF_ERROR(CheckDuplicateKeys(item, ""));
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
      RETURN_IF_ERROR(CheckDuplicateKeys(set, ""));
      std::map<std::string, YAML::Mark> seen;
      for (auto it = set.begin(); it != set.end(); ++it) {
        RETURN_IF_ERROR(
            CollectAssignments(it->first, it->second, "", Scope::kTrialSet, seen, trial.set));
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
    RETURN_IF_ERROR(CheckDuplicateKeys(node, ""));
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
        return UnknownKey(key_node.Mark(), dotted, prefix, Scope::kSweep);
      if (!value.IsMap()) {
        return ErrorAt(value.IsNull() ? key_node.Mark() : value.Mark(),
                       "sweep: '" + dotted + "' groups keys; write e.g. " + dotted + ": {" +
                           std::string(KeysDirectlyUnder(dotted)[0]) + ": [...]}");
      }
      RETURN_IF_ERROR(CheckDuplicateKeys(value, dotted));
      for (auto it = value.begin(); it != value.end(); ++it) {
        RETURN_IF_ERROR(CollectSweepAxes(it->first, it->second, dotted, seen, axes));
      }
      return Status::Ok();
    }
    auto [previous, inserted] = seen.emplace(dotted, key_node.Mark());
    if (!inserted) return DuplicateKey(key_node.Mark(), dotted, previous->second);
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
      ASSIGN_OR_RETURN(Assignment choice, ConvertValue(*spec, key_node.Mark(), item));
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

  StatusOr<std::vector<Trial>> Expand(const std::vector<TrialSpec>& specs,
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

  StatusOr<Trial> BuildTrial(const TrialSpec& spec,
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
        if (!suffix.empty()) suffix += ",";
        suffix += std::string(choice->spec->name) + "=" + choice->text;
      }
      trial.name += "/" + suffix;
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
    const std::string model_name = trial.config.settings().model.name;
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
        return ErrorAt(location({"model"}), prefix + "model: " + resolved.status().message());
      }
      blip2 = resolved->has_value();
    }
    if (blip2) {
      if (std::optional<ConfigProblem> problem = FindModelFamilyProblem(trial.config, *blip2)) {
        return ErrorAt(location(problem->keys), prefix + problem->message);
      }
    }
    if (blip2.value_or(false)) {
      // BLIP-2's shape is not a ModelConfig: the checks that need one are llm-train's.
    } else if (const ModelConfig* preset = FindPreset(model_name)) {
      model = preset;
    } else if (IsHubModelRef(model_name)) {
      // Checked for form everywhere; its shape is known only once an agent has downloaded it, so
      // the checks that need it are skipped, as for any model taken on trust.
      if (StatusOr<HubModelRef> ref = ParseHubModelRef(model_name); !ref.ok()) {
        return ErrorAt(location({"model"}), prefix + ref.status().message());
      }
    } else if (IsNodePath(model_name)) {
      // A directory only the node has: taken on trust, as above (llm-train checks it there).
    } else if (options_.resolve_local_paths) {
      auto cached = models_.find(model_name);
      if (cached == models_.end()) {
        StatusOr<ModelConfig> resolved = ResolveModel(model_name);
        if (!resolved.ok()) {
          return ErrorAt(location({"model"}), prefix + "model: " + resolved.status().message());
        }
        cached = models_.emplace(model_name, std::move(*resolved)).first;
      }
      model = &cached->second;
    }

    if (std::optional<ConfigProblem> problem = FindConfigProblem(trial.config, model)) {
      return ErrorAt(location(problem->keys), prefix + problem->message);
    }
    return trial;
  }

  const std::string filename_;
  const ExperimentParseOptions options_;
  std::vector<Assignment> base_;
  bool named_trials_ = false;  // messages name the trial when the file has trials or a sweep
  std::map<std::string, ModelConfig> models_;  // model directories read so far
};

}  // namespace

bool IsPathValue(const KeySpec& spec, std::string_view value) {
  return spec.type == KeyType::kPath || (spec.name == "model" && FindPreset(value) == nullptr &&
                                         !IsBlip2Preset(value) && !IsHubModelRef(value));
}

bool IsInputPathValue(const KeySpec& spec, std::string_view value) {
  return IsPathValue(spec, value) && spec.name != "output_dir" && !IsNodePath(value);
}

StatusOr<std::string> OutputDirInRun(std::string_view written) {
  const std::string quoted = "output_dir: '" + std::string(written) + "'";
  const std::string rule =
      ": a trial writes inside its run's output/ directory, so output_dir is a relative path "
      "below it (e.g. out), or unset for output/ itself";
  if (IsNodePath(written)) return InvalidArgumentError(quoted + " is a node path" + rule);
  const fs::path path{std::string(written)};
  if (path.is_absolute()) return InvalidArgumentError(quoted + " is an absolute path" + rule);
  fs::path normal = path.lexically_normal();
  if (!normal.empty() && normal.filename().empty()) normal = normal.parent_path();  // "out/"
  if (normal.empty()) return std::string(".");
  if (*normal.begin() == "..") {
    return InvalidArgumentError(quoted + " climbs out of output/ with '..'" + rule);
  }
  return normal.string();
}

void LocalizeNodePaths(TrialConfig& config) {
  for (const KeySpec& spec : TrialKeys()) {
    if (spec.type != KeyType::kPath && spec.name != "model") continue;
    const std::string value = config.GetString(spec.name);
    if (!IsNodePath(value)) continue;
    const Status set = config.Set(spec.name, KeyValue(value.substr(kNodePathPrefix.size())));
    (void)set;  // a shorter absolute path of the same key: always valid
  }
}

std::string ResolveLocalPath(std::string_view filename, std::string_view written) {
  const fs::path base_dir = fs::path(std::string(filename)).parent_path();
  const fs::path path{std::string(written)};
  if (base_dir.empty() || path.empty() || path.is_absolute()) return std::string(written);
  const fs::path beside_file = base_dir / path;
  std::error_code error;
  if (!fs::exists(beside_file, error)) return std::string(written);
  return beside_file.lexically_normal().string();
}

StatusOr<Experiment> ParseExperiment(std::string_view yaml_text, std::string_view filename,
                                     const ExperimentParseOptions& options) {
  ExperimentParser parser(filename, options);
  return parser.Parse(yaml_text);
}

Status KeepOnlyTrials(const std::vector<std::string>& names, std::string_view filename,
                      Experiment& experiment) {
  std::string listed;
  for (const Trial& trial : experiment.trials) listed += (listed.empty() ? "" : ", ") + trial.name;
  for (const std::string& wanted : names) {
    if (std::none_of(experiment.trials.begin(), experiment.trials.end(),
                     [&](const Trial& trial) { return trial.name == wanted; })) {
      return InvalidArgumentError(std::string(filename) + ": no trial named '" + wanted +
                                  "' (its trials: " + listed + ")");
    }
  }
  std::erase_if(experiment.trials, [&](const Trial& trial) {
    return std::find(names.begin(), names.end(), trial.name) == names.end();
  });
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

}  // namespace llmctl
