#include "controller/cli/report.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "common/text.h"
#include "common/trial_outcome.h"
#include "controller/cli/report_charts.h"
#include "controller/cli/report_format.h"

namespace llmctl::cli {
namespace {

// The cells of one row of the lab table, in LabColumns order; the outcome cell without emphasis.
struct LabRow {
  std::vector<std::string> cells;
  bool unexpected = false;
};

constexpr size_t kOutcomeColumn = 2;
constexpr size_t kFirstNumericColumn = 3;

// The lab table's optional columns.
struct LabLayout {
  // Some trial's snapshot at peak holds data parallelism's buffers or gathered parameters: a
  // column for them, so that the memory columns add up to the allocated bytes.
  bool comm = false;
  // Some trial was submitted with the estimate's prediction: predicted peak and its error.
  bool predicted = false;
  // Some trial's prediction has a time: predicted tokens/s and its error.
  bool timed = false;
};

LabLayout LabLayoutOf(const v1::ReportResponse& report) {
  LabLayout layout;
  for (const v1::TrialReport& trial : report.trials()) {
    layout.comm |= trial.at_peak().comm_bytes() != 0 || trial.at_peak().gathered_bytes() != 0;
    layout.predicted |= trial.has_prediction();
    layout.timed |= trial.prediction().step_seconds() > 0;
  }
  return layout;
}

std::vector<std::string> LabColumns(const LabLayout& layout) {
  std::vector<std::string> columns = {"trial",      "expected",  "outcome",
                                      "Params MiB", "Grads MiB", "Optim MiB (device + host)"};
  if (layout.comm) columns.push_back("Comm MiB (+ gathered)");
  columns.insert(columns.end(), {"Acts MiB", "peak MiB"});
  if (layout.predicted) columns.insert(columns.end(), {"predicted MiB", "error"});
  columns.insert(columns.end(), {"train s", "tokens/s"});
  if (layout.timed) columns.insert(columns.end(), {"predicted tokens/s", "error"});
  return columns;
}

constexpr std::string_view kPredictionNote =
    "predicted MiB: the peak `llmctl estimate` predicted at submit, at the longest micro-batch the "
    "run draws when its data was on the submitting machine, else at max_seq_length tokens; error: "
    "(predicted - measured) / measured, for trials that ended ok";

constexpr std::string_view kTimeNote =
    "predicted tokens/s: what `llmctl estimate` predicted at submit, in real tokens at the mean "
    "micro-batch the run draws (else full sequences); measured tokens/s is the whole run's, its "
    "first steps and anything else on the machine included; error: (predicted - measured) / "
    "measured, for trials that ended ok";

// The predicted tokens/s' error against the measured, as PredictionError; nullopt without both.
std::optional<double> TimePredictionError(const v1::TrialReport& trial) {
  const double measured = trial.tokens_per_second();
  const double predicted = trial.prediction().tokens_per_second();
  if (trial.outcome() != "ok" || measured <= 0 || predicted <= 0) return std::nullopt;
  return (predicted - measured) / measured;
}

// The predicted peak's error against the measured one, (predicted - measured) / measured: for a
// trial that ran to the end (an out-of-memory trial's peak is where the allocation failed, not its
// peak); nullopt otherwise.
std::optional<double> PredictionError(const v1::TrialReport& trial) {
  const int64_t measured = trial.peak_bytes();
  if (!trial.has_prediction() || trial.outcome() != "ok" || measured <= 0) return std::nullopt;
  return (static_cast<double>(trial.prediction().peak_bytes()) - static_cast<double>(measured)) /
         static_cast<double>(measured);
}

// A multi-rank trial's highest peak over its ranks.
int64_t MaxRankPeak(const v1::TrialReport& trial) {
  int64_t peak = 0;
  for (const v1::RankMemory& rank : trial.ranks()) peak = std::max(peak, rank.peak_bytes());
  return peak;
}

// One phase's allocated bytes over a multi-rank trial's ranks.
struct PhaseRange {
  std::string phase;
  int64_t min = 0;
  int64_t max = 0;
};

// Per phase, in the ranks' step-anatomy order, the least and the most over the ranks of the
// phase's snapshot with the most allocated bytes.
std::vector<PhaseRange> PhaseRanges(const v1::TrialReport& trial) {
  std::vector<PhaseRange> ranges;
  for (const v1::RankMemory& rank : trial.ranks()) {
    for (const v1::PhaseBytes& phase : rank.per_phase()) {
      auto range = std::find_if(ranges.begin(), ranges.end(),
                                [&](const PhaseRange& r) { return r.phase == phase.phase(); });
      if (range == ranges.end()) {
        ranges.push_back({phase.phase(), phase.allocated_bytes(), phase.allocated_bytes()});
      } else {
        range->min = std::min(range->min, phase.allocated_bytes());
        range->max = std::max(range->max, phase.allocated_bytes());
      }
    }
  }
  return ranges;
}

// "69.6–73.9" (MiB), or one figure when both ends are the same.
std::string MibRange(int64_t min, int64_t max) {
  return min == max ? Mib(min) : Mib(min) + "\u2013" + Mib(max);
}

// "train: 2 ranks; peak MiB 45.3 (rank 0), 45.4 (rank 1); allocated MiB per phase over the ranks:
// phase0_before_fwd 40.1, phase1_after_fwd 44.0–44.2; tokens/s is the whole job's\n".
std::string DescribeRanks(const v1::TrialReport& trial) {
  std::string out = trial.name() + ": " + std::to_string(trial.ranks_size()) + " ranks; peak MiB ";
  for (int i = 0; i < trial.ranks_size(); ++i) {
    out += (i > 0 ? ", " : "") + Mib(trial.ranks(i).peak_bytes()) + " (rank " +
           std::to_string(trial.ranks(i).rank()) + ")";
  }
  const std::vector<PhaseRange> ranges = PhaseRanges(trial);
  if (!ranges.empty()) {
    out += "; allocated MiB per phase, min\u2013max over the ranks:";
    for (size_t i = 0; i < ranges.size(); ++i) {
      out += std::string(i > 0 ? "," : "") + " " + ranges[i].phase + " " +
             MibRange(ranges[i].min, ranges[i].max);
    }
  }
  return out + "; tokens/s is the whole job's\n";
}

LabRow MakeLabRow(const v1::TrialReport& trial, const LabLayout& layout) {
  LabRow row;
  row.unexpected = IsUnexpected(trial);
  const bool ended = HasEnded(trial);
  row.cells.push_back(trial.name());
  row.cells.push_back(trial.expected().empty() ? std::string(kNone) : trial.expected());
  row.cells.push_back(trial.outcome());
  if (trial.has_at_peak()) {
    const v1::MemorySnapshot& snap = trial.at_peak();
    std::string optim = Mib(snap.optim_device_bytes());
    if (snap.optim_host_bytes() != 0) optim += " + " + Mib(snap.optim_host_bytes());
    row.cells.insert(row.cells.end(), {Mib(snap.params_bytes()), Mib(snap.grads_bytes()), optim});
    if (layout.comm) {
      std::string comm = Mib(snap.comm_bytes());
      if (snap.gathered_bytes() != 0) comm += " + " + Mib(snap.gathered_bytes());
      row.cells.push_back(comm);
    }
    row.cells.push_back(Mib(snap.other_bytes()));
  } else {
    row.cells.insert(row.cells.end(), layout.comm ? 5 : 4, std::string(kNone));
  }
  if (!ended) {
    row.cells.push_back(std::string(kNone));
  } else if (trial.ranks_size() > 1) {
    // A multi-rank trial: the highest rank's, said so.
    row.cells.push_back(Mib(std::max(trial.peak_bytes(), MaxRankPeak(trial))) + " (max of " +
                        std::to_string(trial.ranks_size()) + " ranks)");
  } else {
    row.cells.push_back(Mib(trial.peak_bytes()));
  }
  if (layout.predicted) {
    if (!trial.has_prediction()) {
      row.cells.insert(row.cells.end(), 2, std::string(kNone));
    } else {
      // One rank's prediction, against rank 0's measured peak (every rank holds alike).
      row.cells.push_back(Mib(trial.prediction().peak_bytes()) +
                          (trial.prediction().verdict() == "oom" ? " (OOM)" : ""));
      const std::optional<double> error = PredictionError(trial);
      row.cells.push_back(ended && error ? Printf("%+.1f%%", 100.0 * *error) : std::string(kNone));
    }
  }
  row.cells.push_back(ended ? Printf("%.1f", trial.train_seconds()) : std::string(kNone));
  row.cells.push_back(ended && trial.tokens_per_second() != 0
                          ? Grouped(trial.tokens_per_second(), 0)
                          : std::string(kNone));
  if (layout.timed) {
    const double predicted = trial.prediction().tokens_per_second();
    row.cells.push_back(predicted > 0 ? Grouped(predicted, 0) : std::string(kNone));
    const std::optional<double> error = TimePredictionError(trial);
    row.cells.push_back(ended && error ? Printf("%+.1f%%", 100.0 * *error) : std::string(kNone));
  }
  return row;
}

// "long: resumed; steps 1-3 in attempt 1, 4-6 in attempt 3\n" (steps counted from 1, as the
// live view and the checkpoint messages count them): which attempt ran which part of the run.
std::string DescribeResumedRun(const v1::TrialReport& trial) {
  std::string parts;
  for (int i = 0; i < trial.steps_size();) {
    int end = i;
    while (end + 1 < trial.steps_size() &&
           trial.steps(end + 1).attempt() == trial.steps(i).attempt()) {
      ++end;
    }
    if (!parts.empty()) parts += ", ";
    parts += std::to_string(trial.steps(i).step() + 1) + "-" +
             std::to_string(trial.steps(end).step() + 1) + " in attempt " +
             std::to_string(trial.steps(i).attempt());
    i = end + 1;
  }
  return trial.name() + ": resumed; " + (parts.empty() ? "no steps" : "steps " + parts) + "\n";
}

// Display width of UTF-8 text: code points (every character here is one column wide).
std::string RenderTable(const v1::ReportResponse& report) {
  const LabLayout layout = LabLayoutOf(report);
  std::vector<std::vector<std::string>> rows;
  rows.push_back(LabColumns(layout));
  for (const v1::TrialReport& trial : report.trials()) {
    LabRow row = MakeLabRow(trial, layout);
    if (row.unexpected) {
      row.cells[kOutcomeColumn] += " (expected " + trial.expected() + ")";
    }
    rows.push_back(std::move(row.cells));
  }
  std::string out = "experiment " + std::to_string(report.experiment_id()) + ": " + report.name() +
                    "\n" + FormatColumns(rows, kFirstNumericColumn);
  if (layout.predicted) out += std::string(kPredictionNote) + "\n";
  if (layout.timed) out += std::string(kTimeNote) + "\n";
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.run_attempts_size() > 1) out += DescribeResumedRun(trial);
  }
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.ranks_size() > 1) out += DescribeRanks(trial);
  }
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.refused_event_lines() > 0) {
      out +=
          trial.name() + ": " + std::to_string(trial.refused_event_lines()) +
          " event line(s) refused (not a JSON object with a string \"type\", not UTF-8, or over " +
          "the cap): stored as refused_line events\n";
    }
  }
  for (const v1::TrialReport& trial : report.trials()) {
    for (const v1::KernelFallback& fallback : trial.kernel_fallbacks()) {
      out +=
          trial.name() + ": kernels: fused ran ATen's " + fallback.op() + " instead of its kernel";
      if (trial.ranks_size() > 1) out += " on rank " + std::to_string(fallback.rank());
      out += " from step " + std::to_string(fallback.step()) + " (" + fallback.reason() + ")\n";
    }
  }
  const int unexpected = CountUnexpectedOutcomes(report);
  if (unexpected > 0) {
    out += "\n" + std::to_string(unexpected) +
           " trial(s) ended other than the experiment file expects.\n";
  }
  return out;
}

std::string RenderMarkdown(const v1::ReportResponse& report) {
  const LabLayout layout = LabLayoutOf(report);
  const std::vector<std::string> columns = LabColumns(layout);
  std::string out;
  out += "| ";
  for (size_t i = 0; i < columns.size(); ++i) {
    out += columns[i] + (i + 1 < columns.size() ? " | " : " |\n");
  }
  out += "|";
  for (size_t i = 0; i < columns.size(); ++i) out += i < kFirstNumericColumn ? "---|" : "---:|";
  out += "\n";
  for (const v1::TrialReport& trial : report.trials()) {
    LabRow row = MakeLabRow(trial, layout);
    if (row.unexpected) {
      row.cells[kOutcomeColumn] =
          "**" + row.cells[kOutcomeColumn] + "** (expected " + trial.expected() + ")";
    }
    out += "|";
    for (const std::string& cell : row.cells) {
      std::string escaped;  // a '|' inside a cell would end it
      for (char c : cell) escaped += c == '|' ? std::string("\\|") : std::string(1, c);
      out += " " + escaped + " |";
    }
    out += "\n";
  }
  return out;
}

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
  }
  const std::optional<double> error = PredictionError(trial);
  json["prediction_error"] = error ? nlohmann::ordered_json(*error) : nlohmann::ordered_json();
  const std::optional<double> time_error = TimePredictionError(trial);
  json["tokens_per_second_prediction_error"] =
      time_error ? nlohmann::ordered_json(*time_error) : nlohmann::ordered_json();
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
  json["train_seconds"] = trial.train_seconds();
  json["tokens_per_second"] = trial.tokens_per_second();
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
  // The controller's resolved config as an object; kept as text should it not be JSON.
  nlohmann::ordered_json config =
      nlohmann::ordered_json::parse(trial.config_json(), nullptr, /*allow_exceptions=*/false);
  json["config"] = config.is_discarded() ? nlohmann::ordered_json(trial.config_json()) : config;
  return json;
}

std::string RenderJson(const v1::ReportResponse& report) {
  nlohmann::ordered_json root;
  root["experiment_id"] = report.experiment_id();
  root["name"] = report.name();
  root["trials"] = nlohmann::ordered_json::array();
  for (const v1::TrialReport& trial : report.trials()) root["trials"].push_back(TrialJson(trial));
  return root.dump(2, ' ', /*ensure_ascii=*/false,
                   nlohmann::ordered_json::error_handler_t::replace) +
         "\n";
}

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

std::string Number(double value) { return nlohmann::json(value).dump(); }

std::string RenderCsv(const v1::ReportResponse& report) {
  std::string out =
      "trial,description,expected,outcome,attempt,node,params_bytes,grads_bytes,"
      "optim_device_bytes,optim_host_bytes,comm_bytes,gathered_bytes,other_bytes,allocated_bytes,"
      "reserved_bytes,peak_bytes,train_seconds,tokens_per_second,final_loss,error,ranks,rank_peak_"
      "bytes,"
      "rank_phase_allocated_bytes,predicted_peak_bytes,predicted_verdict,prediction_error\n";
  for (const v1::TrialReport& trial : report.trials()) {
    std::vector<std::string> fields = {trial.name(),
                                       trial.description(),
                                       trial.expected(),
                                       trial.outcome(),
                                       std::to_string(trial.attempt()),
                                       trial.node()};
    if (trial.has_at_peak()) {
      const v1::MemorySnapshot& snap = trial.at_peak();
      for (int64_t bytes : {snap.params_bytes(), snap.grads_bytes(), snap.optim_device_bytes(),
                            snap.optim_host_bytes(), snap.comm_bytes(), snap.gathered_bytes(),
                            snap.other_bytes(), snap.allocated_bytes(), snap.reserved_bytes()}) {
        fields.push_back(std::to_string(bytes));
      }
    } else {
      fields.insert(fields.end(), 9, "");
    }
    const bool ended = HasEnded(trial);
    fields.push_back(ended ? std::to_string(trial.peak_bytes()) : "");
    fields.push_back(ended ? Number(trial.train_seconds()) : "");
    fields.push_back(ended ? Number(trial.tokens_per_second()) : "");
    fields.push_back(trial.has_final_loss() ? Number(trial.final_loss()) : "");
    fields.push_back(trial.error());
    // A multi-rank trial: the rank count, each rank's peak ("45331104;45400000", rank order) and
    // each rank's per-phase most allocated bytes ("0:phase0_before_fwd=...|phase1...;1:...").
    std::string rank_peaks;
    std::string rank_phases;
    for (const v1::RankMemory& rank : trial.ranks()) {
      if (!rank_peaks.empty()) rank_peaks += ';';
      rank_peaks += std::to_string(rank.peak_bytes());
      if (!rank_phases.empty()) rank_phases += ';';
      rank_phases += std::to_string(rank.rank()) + ":";
      for (int i = 0; i < rank.per_phase_size(); ++i) {
        if (i > 0) rank_phases += '|';
        rank_phases +=
            rank.per_phase(i).phase() + "=" + std::to_string(rank.per_phase(i).allocated_bytes());
      }
    }
    fields.push_back(trial.ranks_size() > 0 ? std::to_string(trial.ranks_size()) : "");
    fields.push_back(rank_peaks);
    fields.push_back(rank_phases);
    // What the estimate predicted at submit (empty when it did not), and its error as a fraction.
    fields.push_back(trial.has_prediction() ? std::to_string(trial.prediction().peak_bytes()) : "");
    fields.push_back(trial.has_prediction() ? trial.prediction().verdict() : "");
    const std::optional<double> error = PredictionError(trial);
    fields.push_back(error ? Number(*error) : "");
    for (size_t i = 0; i < fields.size(); ++i) {
      out += CsvField(fields[i]) + (i + 1 < fields.size() ? "," : "\n");
    }
  }
  return out;
}

// The multi-rank trials' memory per rank and each phase's range over the ranks; "" when no
// trial has ranks.
std::string RanksHtml(const v1::ReportResponse& report) {
  std::string out;
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.ranks_size() == 0) continue;
    const std::vector<PhaseRange> ranges = PhaseRanges(trial);
    out += "<h3>" + EscapeHtml(trial.name()) + ": " + std::to_string(trial.ranks_size()) +
           " ranks</h3>\n<table>\n<tr><th>rank</th><th>peak MiB</th>";
    for (const PhaseRange& range : ranges) out += "<th>" + EscapeHtml(range.phase) + " MiB</th>";
    out += "</tr>\n";
    for (const v1::RankMemory& rank : trial.ranks()) {
      out += "<tr><td>" + std::to_string(rank.rank()) + "</td><td class=\"n\">" +
             Mib(rank.peak_bytes()) + "</td>";
      for (const PhaseRange& range : ranges) {
        std::string cell(kNone);
        for (const v1::PhaseBytes& phase : rank.per_phase()) {
          if (phase.phase() == range.phase) cell = Mib(phase.allocated_bytes());
        }
        out += "<td class=\"n\">" + EscapeHtml(cell) + "</td>";
      }
      out += "</tr>\n";
    }
    out += "<tr><td>min&#8211;max</td><td class=\"n\">" +
           EscapeHtml(MibRange(std::min_element(trial.ranks().begin(), trial.ranks().end(),
                                                [](const auto& a, const auto& b) {
                                                  return a.peak_bytes() < b.peak_bytes();
                                                })
                                   ->peak_bytes(),
                               MaxRankPeak(trial))) +
           "</td>";
    for (const PhaseRange& range : ranges) {
      out += "<td class=\"n\">" + EscapeHtml(MibRange(range.min, range.max)) + "</td>";
    }
    out += "</tr>\n</table>\n";
  }
  if (out.empty()) return out;
  return "<h2>Memory per rank</h2>\n<p>Each rank of a data-parallel trial writes its own events: "
         "its peak and, per phase, its snapshot with the most allocated bytes. The trials table "
         "shows the highest rank's peak; tokens/s is the whole job's.</p>\n" +
         out;
}

std::string RenderHtml(const v1::ReportResponse& report) {
  const std::string title = "llmctl report: " + report.name() + " (experiment " +
                            std::to_string(report.experiment_id()) + ")";
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" +
      EscapeHtml(title) +
      "</title>\n<style>\n"
      "body{font-family:system-ui,sans-serif;margin:2em;color:#222}\n"
      "table{border-collapse:collapse;font-size:14px}\n"
      "th,td{border:1px solid #ccc;padding:3px 8px}td.n{text-align:right}\n"
      "tr.unexpected td{background:#fde2e2}\n"
      "svg{font-size:12px;font-family:inherit}svg .head{font-weight:bold}\n"
      ".grid{display:flex;flex-wrap:wrap;gap:1em}figure{margin:0}\n"
      "figcaption{font-weight:bold;font-size:13px}\n"
      ".legend span{margin-right:1.2em}"
      ".legend i{display:inline-block;width:12px;height:12px;margin-right:4px}\n"
      "</style>\n</head>\n<body>\n<h1>" +
      EscapeHtml(title) + "</h1>\n";

  const LabLayout layout = LabLayoutOf(report);
  out += "<h2>Trials</h2>\n<table>\n<tr>";
  for (const std::string& column : LabColumns(layout)) {
    out += "<th>" + EscapeHtml(column) + "</th>";
  }
  out += "</tr>\n";
  for (const v1::TrialReport& trial : report.trials()) {
    LabRow row = MakeLabRow(trial, layout);
    if (row.unexpected) row.cells[kOutcomeColumn] += " (expected " + trial.expected() + ")";
    out += row.unexpected ? "<tr class=\"unexpected\">" : "<tr>";
    for (size_t i = 0; i < row.cells.size(); ++i) {
      out += (i >= kFirstNumericColumn ? "<td class=\"n\">" : "<td>") + EscapeHtml(row.cells[i]) +
             "</td>";
    }
    out += "</tr>\n";
  }
  out +=
      "</table>\n<p>MiB = 2<sup>20</sup> bytes. Memory columns are the snapshot with the most "
      "allocated bytes (for an out-of-memory trial, the moment the allocation failed).</p>\n";
  if (layout.predicted) out += "<p>" + EscapeHtml(std::string(kPredictionNote)) + ".</p>\n";
  if (layout.timed) out += "<p>" + EscapeHtml(std::string(kTimeNote)) + ".</p>\n";

  out += RanksHtml(report);
  out +=
      "<h2>Memory per phase</h2>\n<p>The snapshot with the most allocated bytes of each phase "
      "(0 before forward, 1 after forward, 2 after backward, 3 after the optimizer step), on one "
      "scale for every trial.</p>\n" +
      PhaseCharts(report);
  out +=
      "<h2>Memory over time</h2>\n<p>Allocated and reserved bytes at each of the trainer's "
      "snapshots, each marked with the phase it closes (0&#8211;3 as above), against seconds "
      "since the trainer started; each trial on its own scales. A resumed trial's attempts follow "
      "each other on one axis, each from its own start, without the time between them.</p>\n" +
      MemoryTimelineCharts(report);
  out += "<h2>Train time</h2>\n" + TrainTimeChart(report);
  out += "<h2>Tokens per second</h2>\n" + TokensPerSecondChart(report);
  out += "<h2>Expected and observed outcomes</h2>\n" + OutcomeChart(report);
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.error().empty()) continue;
    out += "<p><b>" + EscapeHtml(trial.name()) + "</b>: " + EscapeHtml(trial.error()) + "</p>\n";
  }
  return out + "</body>\n</html>\n";
}

}  // namespace

StatusOr<ReportFormat> ParseReportFormat(std::string_view name) {
  if (name == "table") return ReportFormat::kTable;
  if (name == "csv") return ReportFormat::kCsv;
  if (name == "json") return ReportFormat::kJson;
  if (name == "markdown" || name == "md") return ReportFormat::kMarkdown;
  if (name == "html") return ReportFormat::kHtml;
  return InvalidArgumentError("--format: unknown format '" + std::string(name) +
                              "' (one of table, csv, json, markdown, html)");
}

// An oom without `expect:` is a measurement (the labs run trials to see whether they fit), not a
// failure: it counts only when the file says `expect: ok`.
bool IsUnexpected(const v1::TrialReport& trial) {
  if (!trial.expected().empty()) return trial.outcome() != trial.expected();
  const std::string& outcome = trial.outcome();
  return outcome == trial_outcome::kFailed || outcome == trial_outcome::kInvalid ||
         outcome == trial_outcome::kDiverged || outcome == trial_outcome::kCancelled;
}

bool HasEnded(const v1::TrialReport& trial) {
  const std::string& outcome = trial.outcome();
  return outcome == trial_outcome::kOk || outcome == trial_outcome::kOom ||
         outcome == trial_outcome::kDiverged || outcome == trial_outcome::kFailed ||
         outcome == trial_outcome::kCancelled;
}

int CountUnexpectedOutcomes(const v1::ReportResponse& report) {
  return static_cast<int>(
      std::count_if(report.trials().begin(), report.trials().end(), IsUnexpected));
}

std::string EscapeHtml(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string RenderReport(const v1::ReportResponse& report, ReportFormat format) {
  switch (format) {
    case ReportFormat::kTable:
      return RenderTable(report);
    case ReportFormat::kCsv:
      return RenderCsv(report);
    case ReportFormat::kJson:
      return RenderJson(report);
    case ReportFormat::kMarkdown:
      return RenderMarkdown(report);
    case ReportFormat::kHtml:
      return RenderHtml(report);
  }
  return {};
}

}  // namespace llmctl::cli
