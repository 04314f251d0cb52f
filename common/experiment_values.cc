// ExperimentValueReader (experiment_values.h): an experiment file's trial keys read from its YAML
// nodes, each problem at its place in the file.
#include "common/experiment_values.h"

#include <algorithm>
#include <string>
#include <utility>
#include <variant>

#include "common/spelling.h"
#include "common/text.h"
#include "common/trial_config.h"
#include "common/trial_keys.h"
#include "common/yaml_document.h"

namespace llmctl::experiment_internal {
namespace {

// The experiment's own fields beside the trial keys at the top level (ExperimentParser reads them),
// for the "unknown key" message.
constexpr std::string_view kTopLevelFields[] = {"name", "description", "target", "trials", "sweep"};

}  // namespace

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

ExperimentValueReader::ExperimentValueReader(std::string_view filename,
                                             const ExperimentParseOptions& options)
    : filename_(filename), options_(options) {}

Status ExperimentValueReader::ErrorAt(const YAML::Mark& mark, const std::string& message) const {
  return YamlErrorAt(filename_, mark, message);
}

Status ExperimentValueReader::DuplicateKey(const YAML::Mark& mark, const std::string& key,
                                           const YAML::Mark& first) const {
  return ErrorAt(mark, "'" + key + "' is set twice (first at line " +
                           std::to_string(first.line + 1) + ", column " +
                           std::to_string(first.column + 1) + ")");
}

Status ExperimentValueReader::CheckDuplicateKeys(const YAML::Node& map,
                                                 const std::string& prefix) const {
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

Status ExperimentValueReader::UnknownKey(const YAML::Mark& mark, const std::string& dotted,
                                         std::string_view prefix, Scope scope) const {
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
  if (!suggestion.empty()) return ErrorAt(mark, message + " (did you mean '" + suggestion + "'?)");
  std::vector<std::string_view> valid;
  if (scope == Scope::kTopLevel && prefix.empty()) {
    valid.assign(std::begin(kTopLevelFields), std::end(kTopLevelFields));
  }
  for (std::string_view name : KeysDirectlyUnder(prefix)) valid.push_back(name);
  message += prefix.empty() ? "; valid keys here: " : "; keys under " + std::string(prefix) + ": ";
  return ErrorAt(mark, message + Join(valid, ", "));
}

Status ExperimentValueReader::CollectAssignments(const YAML::Node& key_node,
                                                 const YAML::Node& value, const std::string& prefix,
                                                 Scope scope,
                                                 std::map<std::string, YAML::Mark>& seen,
                                                 std::vector<Assignment>& out) const {
  if (!key_node.IsScalar()) return ErrorAt(key_node.Mark(), "expected a key name here");
  const std::string dotted = prefix.empty() ? key_node.Scalar() : prefix + "." + key_node.Scalar();
  const KeySpec* spec = FindTrialKey(dotted);
  if (spec == nullptr) {
    if (!IsTrialKeyGroup(dotted)) return UnknownKey(key_node.Mark(), dotted, prefix, scope);
    if (!value.IsMap()) {
      std::vector<std::string_view> members = KeysDirectlyUnder(dotted);
      return ErrorAt(value.IsNull() ? key_node.Mark() : value.Mark(),
                     "'" + dotted + "' groups keys (" + Join(members, ", ") +
                         "); write them nested, e.g. " + dotted + ": {" + std::string(members[0]) +
                         ": ...}, or dotted, e.g. " + dotted + "." + std::string(members[0]) +
                         ": ...");
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

StatusOr<Assignment> ExperimentValueReader::ConvertValue(const KeySpec& spec,
                                                         const YAML::Mark& key_mark,
                                                         const YAML::Node& value) const {
  Assignment assignment;
  assignment.spec = &spec;
  assignment.key_mark = key_mark;
  // yaml-cpp places a missing value at the next token; the key is where the user should look.
  assignment.value_mark = value.IsNull() ? key_mark : value.Mark();
  const std::string name(spec.name);

  if (value.IsNull() || (value.IsScalar() && value.Scalar().empty())) {
    if (!spec.default_value.empty()) {
      return ErrorAt(assignment.value_mark,
                     name + ": a value is required (expected " + DescribeExpectedValue(spec) + ")");
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
        return ErrorAt(item.Mark(), name + ": expected " + DescribeExpectedValue(spec) + ", got " +
                                        std::string(NodeKindName(item)) + " inside the list");
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

// See "Relative paths" in experiment.h.
KeyValue ExperimentValueReader::ResolvePath(const KeySpec& spec, KeyValue value) const {
  if (spec.type != KeyType::kPath && spec.name != "model") return value;
  const std::string& written = std::get<std::string>(value);
  if (IsNodePath(written) || !options_.resolve_local_paths) return value;
  if (!IsPathValue(spec, written)) return value;
  return KeyValue(ResolveLocalPath(filename_, written));
}

}  // namespace llmctl::experiment_internal
