#include "trainer/cli/series.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <variant>
#include <vector>

#include "common/foreign_json.h"
#include "common/model_config.h"
#include "trainer/train/trained_model.h"

namespace llmctl::llm_train {

llmctl::StatusOr<SeriesRun> ParseSeriesLine(const std::string& line,
                                            const llmctl::Experiment& experiment,
                                            const TrialArgs& args) {
  const nlohmann::json run = llmctl::ParseForeignJson(line);
  if (!run.is_object()) {
    return llmctl::InvalidArgumentError(
        "expected a JSON object {\"events\": FILE, \"trial\": NAME, \"set\": [\"key=value\", "
        "...]}");
  }
  for (const auto& [key, value] : run.items()) {
    if (key != "events" && key != "trial" && key != "set") {
      return llmctl::InvalidArgumentError("unknown key \"" + key + "\" (events, trial, set)");
    }
  }
  if (!run.contains("events") || !run["events"].is_string() || run["events"] == "") {
    return llmctl::InvalidArgumentError("\"events\" must name the run's events file");
  }
  std::string trial_name = args.trial_name;
  if (run.contains("trial")) {
    if (!run["trial"].is_string()) return llmctl::InvalidArgumentError("\"trial\" is not a name");
    trial_name = run["trial"].get<std::string>();
  }
  std::vector<std::string> overrides = args.overrides;
  if (run.contains("set")) {
    if (!run["set"].is_array()) {
      return llmctl::InvalidArgumentError("\"set\" must be a list of \"key=value\" strings");
    }
    for (const nlohmann::json& assignment : run["set"]) {
      if (!assignment.is_string()) {
        return llmctl::InvalidArgumentError("\"set\" must be a list of \"key=value\" strings");
      }
      overrides.push_back(assignment.get<std::string>());
    }
  }
  ASSIGN_OR_RETURN(const llmctl::Trial* trial, PickTrial(experiment, args.config_path, trial_name));
  SeriesRun series_run{run["events"].get<std::string>(), trial->config};
  RETURN_IF_ERROR(ApplyOverrides(overrides, series_run.config));
  ASSIGN_OR_RETURN(const llmctl::trainer::TrialModelConfig model,
                   llmctl::trainer::ResolveTrialModel(series_run.config.settings().model.name));
  RETURN_IF_ERROR(
      llmctl::ValidateTrialConfig(series_run.config, std::get_if<llmctl::ModelConfig>(&model)));
  if (llmctl::DataParallelRanks(series_run.config) > 1) {
    return llmctl::InvalidArgumentError(
        "a data-parallel trial's ranks each need a process: run it on its own with --nproc");
  }
  return series_run;
}

llmctl::StatusOr<std::vector<SeriesRun>> ReadSeries(const llmctl::Experiment& experiment,
                                                    const TrialArgs& args) {
  std::ifstream in(args.runs_path);
  if (!in) return llmctl::InvalidArgumentError("--runs " + args.runs_path + ": cannot read it");
  std::vector<SeriesRun> runs;
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto run = ParseSeriesLine(line, experiment, args);
    if (!run.ok()) {
      return llmctl::InvalidArgumentError("--runs " + args.runs_path + ":" +
                                          std::to_string(line_number) + ": " +
                                          run.status().message());
    }
    runs.push_back(std::move(*run));
  }
  if (runs.empty()) return llmctl::InvalidArgumentError("--runs " + args.runs_path + ": no runs");
  return runs;
}

}  // namespace llmctl::llm_train
