#include "agent/trial_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/experiment.h"
#include "common/foreign_json.h"
#include "common/trial_config.h"
#include "common/trial_keys.h"

namespace llmctl::agent {
namespace {

std::string ScalarText(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  return value.dump();  // numbers in the shortest form that reads back exactly; true/false
}

// Writes `object`'s members as a block map; null (a key cleared to "no value") as YAML's null,
// which the experiment parser reads back as the same cleared key.
void EmitMap(YAML::Emitter& out, const nlohmann::json& object) {
  out << YAML::BeginMap;
  for (const auto& [name, value] : object.items()) {
    out << YAML::Key << name << YAML::Value;
    if (value.is_object()) {
      EmitMap(out, value);
    } else if (value.is_null()) {
      out << YAML::Null;
    } else if (value.is_array()) {
      out << YAML::Flow << YAML::BeginSeq;
      for (const auto& item : value) out << ScalarText(item);
      out << YAML::EndSeq;
    } else {
      out << ScalarText(value);
    }
  }
  out << YAML::EndMap;
}

}  // namespace

StatusOr<TrialFile> MakeTrialFile(const std::string& config_json,
                                  const std::map<std::string, std::string>& input_paths,
                                  const std::string& default_output_dir) {
  const nlohmann::json json = ParseForeignJson(config_json);
  if (json.is_discarded() || !json.is_object()) {
    return InvalidArgumentError("config_json is not a JSON object");
  }
  auto config = TrialConfig::FromJson(json);
  if (!config.ok()) return config.status().WithContext("config_json");
  std::map<std::string, std::vector<std::string>> spellings;  // path -> its written names
  for (const auto& [key, path] : input_paths) {
    const KeySpec* spec = FindTrialKey(key);
    if (spec == nullptr) {
      return InvalidArgumentError("inputs: '" + key + "' is not a trial key");
    }
    if (spec->type != KeyType::kPath && key != "model") {
      return InvalidArgumentError("inputs: '" + key + "' does not name a file or directory (" +
                                  std::string(KeyTypeName(spec->type)) + ")");
    }
    const std::string written = config->GetString(key);
    RETURN_IF_ERROR(config->Set(key, path).WithContext("inputs"));
    if (written.empty() || written == path) continue;
    // The cache keeps a tree once by its digest (input_cache.h), and a tree's digest leaves out
    // the name it was written by: `model: models/x` and `tokenizer: ./models/x`, or two copies of
    // one file under the same file name, land on one path, which llm-train's messages name one way
    // (--input-name refuses a PATH given two names). Both are the user's: the name says both, in
    // the keys' order, rather than refusing a trial whose inputs are fine.
    std::vector<std::string>& names = spellings[path];
    if (std::find(names.begin(), names.end(), written) == names.end()) names.push_back(written);
  }
  std::map<std::string, std::string> input_names;
  for (const auto& [path, names] : spellings) {
    std::string& name = input_names[path];
    for (const std::string& written : names) name += (name.empty() ? "" : " or ") + written;
  }
  // The controller checked output_dir when the experiment was submitted, but the agent, which runs
  // the trial as root, does not take its word for it: a path that leaves the run's output/ is
  // refused here too.
  ASSIGN_OR_RETURN(const std::string inside, OutputDirInRun(config->settings().output.dir));
  RETURN_IF_ERROR(config->Set(
      "output_dir", inside == "." ? default_output_dir : default_output_dir + "/" + inside));
  // ToJson holds exactly the keys the experiment set, so llm-train's checks that look at which keys
  // were given (peft.r without peft.method) see what the experiment file said, and llm-train fills
  // in the same registry's defaults.
  YAML::Emitter out;
  EmitMap(out, config->ToJson());
  const TrialSettings& settings = config->settings();
  // Trial keys bound devices far below INT_MAX.
  const int ranks = static_cast<int>(RanksPerNode(*config));
  return TrialFile{std::string(out.c_str()) + "\n", std::string(Name(settings.device.kind)), ranks,
                   settings.parallel.nodes, std::move(input_names)};
}

}  // namespace llmctl::agent
