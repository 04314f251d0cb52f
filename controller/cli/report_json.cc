// `llmctl report --format json`: every trial's figures, prediction, snapshots, steps, ranks and
// memory over time.
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/foreign_json.h"
#include "controller/cli/report.h"
#include "controller/cli/report_renderers.h"
#include "controller/cli/report_rows.h"

namespace llmctl::cli {
namespace {

nlohmann::ordered_json SnapshotJson(const v1::MemorySnapshot& snap) {
  nlohmann::ordered_json json;
  json["step"] = snap.step();
  json["micro_batch"] = snap.micro_batch();
  json["phase"] = snap.phase();
  json["params_bytes"] = snap.params_bytes();
  json["grads_bytes"] = snap.grads_bytes();
  json["optim_device_bytes"] = snap.optim_device_bytes();
  json["optim_host_bytes"] = snap.optim_host_bytes();
  json["comm_bytes"] = snap.comm_bytes();
  json["gathered_bytes"] = snap.gathered_bytes();
  json["other_bytes"] = snap.other_bytes();
  json["allocated_bytes"] = snap.allocated_bytes();
  json["peak_bytes"] = snap.peak_bytes();
  json["reserved_bytes"] = snap.reserved_bytes();
  json["elapsed_ms"] = snap.elapsed_ms();
  return json;
}

// The trial's prediction and how far the measured peak and tokens/s were from it; null without
// one.
void AddPredictionJson(const v1::TrialReport& trial, nlohmann::ordered_json& json) {
  if (!trial.has_prediction()) {
    json["prediction"] = nullptr;
    return;
  }
  const v1::TrialPrediction& p = trial.prediction();
  json["prediction"] = {{"peak_bytes", p.peak_bytes()},
                        {"activation_bytes", p.activation_bytes()},
                        {"model_state_bytes", p.model_state_bytes()},
                        {"peak_phase", p.peak_phase()},
                        {"device_memory_bytes", p.device_memory_bytes()},
                        {"verdict", p.verdict()}};
  if (p.step_seconds() > 0) {
    json["prediction"].update({{"step_seconds", p.step_seconds()},
                               {"tokens_per_second", p.tokens_per_second()},
                               {"trial_seconds", p.trial_seconds()},
                               {"time_device", p.time_device()},
                               {"calibration", p.calibration()}});
    // The probe's pace, null without one.
    json["prediction"]["pace_seconds"] =
        p.pace_seconds() > 0 ? nlohmann::ordered_json(p.pace_seconds()) : nlohmann::ordered_json();
  }
  const std::optional<double> error = PredictionError(trial);
  json["prediction_error"] = error ? nlohmann::ordered_json(*error) : nlohmann::ordered_json();
  const std::optional<double> time_error = TimePredictionError(trial);
  json["tokens_per_second_prediction_error"] =
      time_error ? nlohmann::ordered_json(*time_error) : nlohmann::ordered_json();
  // The machine's pace over those steps against the probe's (MachinePace), and the error at it.
  const std::optional<double> pace = MachinePace(trial);
  json["machine_pace"] = pace ? nlohmann::ordered_json(*pace) : nlohmann::ordered_json();
  const std::optional<double> paced_error = TimePredictionErrorAtPace(trial);
  json["tokens_per_second_prediction_error_at_pace"] =
      paced_error ? nlohmann::ordered_json(*paced_error) : nlohmann::ordered_json();
}

nlohmann::ordered_json StepsJson(const v1::TrialReport& trial) {
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const v1::TrialStep& step : trial.steps()) {
    nlohmann::ordered_json& entry = steps.emplace_back();
    entry["attempt"] = step.attempt();
    entry["step"] = step.step();
    entry["loss"] = step.loss();
    entry["tokens"] = step.tokens();
    entry["seconds"] = step.seconds();
    entry["others_cpu_share"] = step.has_others_cpu_share()
                                    ? nlohmann::ordered_json(step.others_cpu_share())
                                    : nlohmann::ordered_json();
    entry["pace_seconds"] = step.has_pace_seconds() ? nlohmann::ordered_json(step.pace_seconds())
                                                    : nlohmann::ordered_json();
  }
  return steps;
}

// A multi-rank trial: every rank's figures, and each phase's range over the ranks.
void AddRanksJson(const v1::TrialReport& trial, nlohmann::ordered_json& json) {
  json["ranks"] = nlohmann::ordered_json::array();
  for (const v1::RankMemory& rank : trial.ranks()) {
    nlohmann::ordered_json& entry = json["ranks"].emplace_back();
    entry["rank"] = rank.rank();
    entry["peak_bytes"] = rank.peak_bytes();
    entry["allocated_bytes"] = rank.allocated_bytes();
    entry["per_phase"] = nlohmann::ordered_json::array();
    for (const v1::PhaseBytes& phase : rank.per_phase()) {
      entry["per_phase"].push_back(
          {{"phase", phase.phase()}, {"allocated_bytes", phase.allocated_bytes()}});
    }
  }
  json["max_rank_peak_bytes"] = MaxRankPeak(trial);
  json["per_phase_over_ranks"] = nlohmann::ordered_json::array();
  for (const PhaseRange& range : PhaseRanges(trial)) {
    json["per_phase_over_ranks"].push_back({{"phase", range.phase},
                                            {"min_allocated_bytes", range.min},
                                            {"max_allocated_bytes", range.max}});
  }
}

nlohmann::ordered_json MemoryTimelineJson(const v1::TrialReport& trial) {
  nlohmann::ordered_json timeline = nlohmann::ordered_json::array();
  for (const v1::AttemptMemory& attempt : trial.memory_timeline()) {
    nlohmann::ordered_json& entry = timeline.emplace_back();
    entry["attempt"] = attempt.attempt();
    entry["started_unix_ms"] = attempt.started_unix_ms();
    entry["device_limit_bytes"] = attempt.device_limit_bytes();
    entry["ended_elapsed_ms"] = attempt.ended_elapsed_ms();
    if (!attempt.node_started_unix_ms().empty()) {
      // By node rank, in order (a protobuf map's order is unspecified).
      const std::map<int32_t, int64_t> node_starts(attempt.node_started_unix_ms().begin(),
                                                   attempt.node_started_unix_ms().end());
      nlohmann::ordered_json& starts = entry["node_started_unix_ms"];
      for (const auto& [node_rank, started_unix_ms] : node_starts) {
        starts[std::to_string(node_rank)] = started_unix_ms;
      }
    }
    entry["snapshots"] = nlohmann::ordered_json::array();
    for (const v1::MemorySnapshot& snap : attempt.snapshots()) {
      entry["snapshots"].push_back(SnapshotJson(snap));
    }
    entry["device_samples"] = nlohmann::ordered_json::array();
    for (const v1::DeviceMemorySample& sample : attempt.device_samples()) {
      nlohmann::ordered_json& row = entry["device_samples"].emplace_back();
      row["device"] = sample.device();
      row["node_rank"] = sample.node_rank();
      row["unix_ms"] = sample.unix_ms();
      row["memory_used_bytes"] = sample.memory_used_bytes();
      row["memory_total_bytes"] = sample.memory_total_bytes();
    }
  }
  return timeline;
}

nlohmann::ordered_json TrialJson(const v1::TrialReport& trial) {
  nlohmann::ordered_json json;
  json["name"] = trial.name();
  json["description"] = trial.description();
  json["outcome"] = trial.outcome();
  json["expected"] = trial.expected().empty() ? nlohmann::ordered_json()
                                              : nlohmann::ordered_json(trial.expected());
  json["attempt"] = trial.attempt();
  json["node"] = trial.node();
  // Null where the table has "–": 0.0 read as a measured standstill or an instant run.
  json["train_seconds"] =
      HasEnded(trial) ? nlohmann::ordered_json(trial.train_seconds()) : nlohmann::ordered_json();
  auto measured = [&trial](double rate) {
    const std::optional<double> rate_measured = MeasuredRate(trial, rate);
    return rate_measured ? nlohmann::ordered_json(*rate_measured) : nlohmann::ordered_json();
  };
  json["tokens_per_second"] = measured(trial.tokens_per_second());
  json["steady_tokens_per_second"] = measured(SteadyTokensPerSecond(trial));
  // How much those steps' time a token moved around its mean (StepVariation).
  const std::optional<double> variation = StepVariation(trial);
  json["steady_step_variation"] =
      variation ? nlohmann::ordered_json(*variation) : nlohmann::ordered_json();
  // What others took of the machine's CPU over those steps.
  const std::optional<double> others = OthersCpuShare(trial);
  json["others_cpu_share"] = others ? nlohmann::ordered_json(*others) : nlohmann::ordered_json();
  json["peak_bytes"] = trial.peak_bytes();
  json["load_peak_bytes"] = trial.load_peak_bytes();
  AddPredictionJson(trial, json);
  json["final_loss"] =
      trial.has_final_loss() ? nlohmann::ordered_json(trial.final_loss()) : nullptr;
  json["error"] = trial.error();
  json["refused_event_lines"] = trial.refused_event_lines();
  json["kernel_fallbacks"] = nlohmann::ordered_json::array();
  for (const v1::KernelFallback& fallback : trial.kernel_fallbacks()) {
    json["kernel_fallbacks"].push_back({{"op", fallback.op()},
                                        {"reason", fallback.reason()},
                                        {"step", fallback.step()},
                                        {"rank", fallback.rank()}});
  }
  json["at_peak"] = trial.has_at_peak() ? SnapshotJson(trial.at_peak()) : nullptr;
  json["per_phase"] = nlohmann::ordered_json::array();
  for (const v1::MemorySnapshot& snap : trial.per_phase()) {
    json["per_phase"].push_back(SnapshotJson(snap));
  }
  json["run_attempts"] = nlohmann::ordered_json(
      std::vector<int32_t>(trial.run_attempts().begin(), trial.run_attempts().end()));
  json["steps"] = StepsJson(trial);
  if (trial.ranks_size() > 0) AddRanksJson(trial, json);
  json["memory_timeline"] = MemoryTimelineJson(trial);
  // The controller's resolved config as an object, in its order; kept as text should it not be
  // JSON or nest deeper than any config (copying and dumping recurse once per level: a 200 KB
  // answer of brackets overflowed the stack).
  const bool foreign_ok = !ParseForeignJson(trial.config_json()).is_discarded();
  nlohmann::ordered_json config =
      foreign_ok ? nlohmann::ordered_json::parse(trial.config_json(), nullptr,
                                                 /*allow_exceptions=*/false)
                 : nlohmann::ordered_json(nlohmann::ordered_json::value_t::discarded);
  json["config"] = config.is_discarded() ? nlohmann::ordered_json(trial.config_json()) : config;
  return json;
}

}  // namespace

std::string RenderJson(const v1::ReportResponse& report) {
  nlohmann::ordered_json root;
  root["experiment_id"] = report.experiment_id();
  root["name"] = report.name();
  root["trials"] = nlohmann::ordered_json::array();
  for (const v1::TrialReport& trial : report.trials()) root["trials"].push_back(TrialJson(trial));
  return DumpForTerminal(root, 2) + "\n";
}

}  // namespace llmctl::cli
