#include "trainer/cli/trial_args.h"

#include <string>

#include "common/text.h"

namespace llmctl::llm_train {

llmctl::StatusOr<const llmctl::Trial*> PickTrial(const llmctl::Experiment& experiment,
                                                 const std::string& config_path,
                                                 const std::string& trial_name) {
  if (trial_name.empty()) {
    if (experiment.trials.size() != 1) {
      std::string names;
      for (const auto& t : experiment.trials) names += (names.empty() ? "" : ", ") + t.name;
      return llmctl::InvalidArgumentError(config_path + " has " +
                                          std::to_string(experiment.trials.size()) +
                                          " trials; choose one with --trial (" + names + ")");
    }
    return &experiment.trials.front();
  }
  for (const auto& t : experiment.trials) {
    if (t.name == trial_name) return &t;
  }
  return llmctl::InvalidArgumentError(config_path + ": no trial named '" + trial_name + "'");
}

llmctl::Status ApplyOverrides(const std::vector<std::string>& overrides,
                              llmctl::TrialConfig& config) {
  // An assignment is quoted at most this long, as llmctl plan's --set is.
  constexpr size_t kMaxQuotedSetBytes = 200;
  for (const std::string& assignment : overrides) {
    const std::string quoted = llmctl::OnOneLine(assignment, kMaxQuotedSetBytes);
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos) {
      return llmctl::InvalidArgumentError("--set expects key=value, got '" + quoted + "'");
    }
    llmctl::Status status = config.SetFromText(assignment.substr(0, eq), assignment.substr(eq + 1));
    if (!status.ok())
      return llmctl::InvalidArgumentError("--set " + quoted + ": " + status.message());
  }
  llmctl::LocalizeNodePaths(config);
  llmctl::ApplyLabSpellings(config);
  return llmctl::Status::Ok();
}

llmctl::StatusOr<std::map<std::string, std::string>> ParseInputNames(
    const std::vector<std::string>& input_names) {
  std::map<std::string, std::string> names;
  for (const std::string& entry : input_names) {
    auto named = llmctl::ParseInputNameArgument(entry);
    if (!named) {
      return llmctl::InvalidArgumentError(
          std::string("--input-name expects PATH=NAME (neither empty; each '\\' and '=' of PATH "
                      "written '\\\\' and '\\='), got '")
              .append(entry)
              .append("'"));
    }
    // The same entry twice says one thing twice, so it is taken; two names for one PATH would
    // leave messages naming whichever came last.
    const auto [it, added] = names.emplace(named->first, named->second);
    if (!added && it->second != named->second) {
      return llmctl::InvalidArgumentError(std::string("--input-name names '")
                                              .append(named->first)
                                              .append("' twice: '")
                                              .append(it->second)
                                              .append("' and '")
                                              .append(named->second)
                                              .append("'"));
    }
  }
  return names;
}

}  // namespace llmctl::llm_train
