// IsPathValue, IsInputPathValue, OutputDirInRun, ResolveLocalPath and LocalizeNodePaths
// (experiment.h): which values of an experiment file name files, where a relative one is on this
// machine, output_dir kept inside a run's output/, and node paths made local.
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

#include "common/blip2_config.h"
#include "common/experiment.h"
#include "common/model_config.h"
#include "common/trial_keys.h"

namespace llmctl {
namespace {

namespace fs = std::filesystem;

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

}  // namespace llmctl
