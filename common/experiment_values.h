// An experiment file's trial keys read from its YAML nodes: each key, nested or dotted, checked
// against the registry (trial_keys.h), each value parsed for its key and a path value resolved by
// experiment.h's "Relative paths" rule, every problem "FILE:LINE:COLUMN: problem" at its place.
//
// Internal to common/experiment*.cc.
#ifndef LLMCTL_COMMON_EXPERIMENT_VALUES_H_
#define LLMCTL_COMMON_EXPERIMENT_VALUES_H_

#include <yaml-cpp/yaml.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/experiment.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "common/trial_keys.h"

namespace llmctl::experiment_internal {

// One `key: value` from the file, already parsed and checked against the registry.
struct Assignment {
  const KeySpec* spec = nullptr;
  std::optional<KeyValue> value;  // nullopt: cleared (null or "" for a key without a default)
  YAML::Mark key_mark;
  YAML::Mark value_mark;
  std::string text;  // the value as written, for sweep trial names
};

// Where keys are read: the base config at the top level, a trial's `set:`, or the sweep.
enum class Scope { kTopLevel, kTrialSet, kSweep };

// "a map", "a list", "nothing", ... for messages about a node of the wrong kind.
std::string_view NodeKindName(const YAML::Node& node);

// Keys that may appear directly inside `prefix` ("" for the top level), in registry order.
std::vector<std::string_view> KeysDirectlyUnder(std::string_view prefix);

class ExperimentValueReader {
 public:
  ExperimentValueReader(std::string_view filename, const ExperimentParseOptions& options);

  // YamlErrorAt in this file.
  Status ErrorAt(const YAML::Mark& mark, const std::string& message) const;

  // `key` written again at `mark`, first at `first`.
  Status DuplicateKey(const YAML::Mark& mark, const std::string& key,
                      const YAML::Mark& first) const;

  // YAML forbids a key twice in one map, but yaml-cpp keeps both; the second would silently win.
  Status CheckDuplicateKeys(const YAML::Node& map, const std::string& prefix) const;

  // The "unknown key" message: nearest key (or top-level field) if one is close, else what is valid
  // here.
  Status UnknownKey(const YAML::Mark& mark, const std::string& dotted, std::string_view prefix,
                    Scope scope) const;

  // Flattens `key: value` (value possibly a nested map of a key group) into assignments.
  Status CollectAssignments(const YAML::Node& key_node, const YAML::Node& value,
                            const std::string& prefix, Scope scope,
                            std::map<std::string, YAML::Mark>& seen,
                            std::vector<Assignment>& out) const;

  // Parses one value of `spec` from its YAML node.
  StatusOr<Assignment> ConvertValue(const KeySpec& spec, const YAML::Mark& key_mark,
                                    const YAML::Node& value) const;

 private:
  KeyValue ResolvePath(const KeySpec& spec, KeyValue value) const;

  const std::string filename_;
  const ExperimentParseOptions options_;
};

}  // namespace llmctl::experiment_internal

#endif  // LLMCTL_COMMON_EXPERIMENT_VALUES_H_
