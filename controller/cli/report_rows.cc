#include "controller/cli/report_rows.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "common/estimate/memory_verdict.h"
#include "common/estimate/rate_probe.h"
#include "common/machine_cpu.h"
#include "common/median.h"
#include "common/printf.h"
#include "common/snapshot_event.h"
#include "common/text.h"
#include "common/trial_name.h"
#include "controller/cli/report.h"
#include "controller/cli/report_format.h"

namespace llmctl::cli {

LabLayout LabLayoutOf(const v1::ReportResponse& report) {
  LabLayout layout;
  for (const v1::TrialReport& trial : report.trials()) {
    layout.comm |= trial.at_peak().comm_bytes() != 0 || trial.at_peak().gathered_bytes() != 0;
    layout.predicted |= trial.has_prediction();
    layout.timed |= trial.prediction().step_seconds() > 0;
    layout.paced |= MachinePace(trial).has_value();
  }
  return layout;
}

std::vector<std::string> LabColumns(const LabLayout& layout) {
  std::vector<std::string> columns = {"trial",      "expected",  "outcome",
                                      "Params MiB", "Grads MiB", "Optim MiB (device + host)"};
  if (layout.comm) columns.push_back("Comm MiB (+ gathered)");
  columns.insert(columns.end(), {"Acts MiB", "peak MiB"});
  if (layout.predicted) columns.insert(columns.end(), {"predicted MiB", "error"});
  columns.insert(columns.end(), {"train s", "tokens/s", "steps \u00b1"});
  if (layout.timed) columns.insert(columns.end(), {"predicted tokens/s", "error"});
  if (layout.paced) columns.insert(columns.end(), {"pace", "error at pace"});
  return columns;
}

std::vector<std::string> TimeSourceLines(const v1::ReportResponse& report) {
  // (source, its trials), in the order the sources first appear; indexed by source.
  std::vector<std::pair<std::string, std::vector<std::string>>> sources;
  std::map<std::string, size_t> index;
  for (const v1::TrialReport& trial : report.trials()) {
    if (trial.prediction().step_seconds() <= 0) continue;
    const std::string& source = trial.prediction().calibration();
    const auto [it, added] = index.try_emplace(source, sources.size());
    if (added) sources.emplace_back(source, std::vector<std::string>());
    sources[it->second].second.push_back(OnOneLine(trial.name(), kMaxTrialNameBytes));
  }
  std::vector<std::string> lines;
  for (const auto& [source, trials] : sources) {
    // A prediction stored before the source was kept with it.
    // Another process's text (the submitting client's), on the user's terminal.
    const std::string said =
        source.empty() ? "an unrecorded calibration" : OnOneLine(source, kMaxShownBytes);
    if (sources.size() == 1) {
      lines.push_back("predicted tokens/s at: " + said);
      continue;
    }
    std::string names;
    for (const std::string& name : trials) names += (names.empty() ? "" : ", ") + name;
    lines.push_back("predicted tokens/s of " + names + " at: " + said);
  }
  return lines;
}

namespace {

// What follows a predicted peak: " (OOM)", " (tight)", or nothing for one that fits or was stored
// without a verdict.
const char* VerdictMark(std::optional<estimate::MemoryVerdict> verdict) {
  if (verdict == estimate::MemoryVerdict::kOom) return " (OOM)";
  if (verdict == estimate::MemoryVerdict::kTight) return " (tight)";
  return "";
}

// The steps a steady figure (the tokens/s, the busy share) is taken over: the run's steps but each
// attempt's first, and of those only the ones that took a time. A hostile line's step of negative,
// infinite or no seconds weighs nothing in either figure, so the two are taken over the same steps.
std::vector<const v1::TrialStep*> SteadySteps(const v1::TrialReport& trial) {
  std::map<int32_t, int64_t> first_steps;  // attempt -> its first step
  for (const v1::TrialStep& step : trial.steps()) {
    auto [first, added] = first_steps.try_emplace(step.attempt(), step.step());
    if (!added) first->second = std::min(first->second, step.step());
  }
  std::vector<const v1::TrialStep*> steady;
  for (const v1::TrialStep& step : trial.steps()) {
    const bool timed = step.seconds() > 0 && std::isfinite(step.seconds());
    if (timed && step.step() != first_steps.at(step.attempt())) steady.push_back(&step);
  }
  return steady;
}

// A prediction's error as the table prints it, "+20.0%"; "–" for none, and for one whose
// percentage overflows a double (2.4e307, against a measured rate of a hostile step line's).
std::string ErrorCell(std::optional<double> error) {
  if (!error || !std::isfinite(100.0 * *error)) return std::string(kNone);
  return Printf("%+.1f%%", 100.0 * *error);
}

}  // namespace

double SteadyTokensPerSecond(const v1::TrialReport& trial) {
  // Summed as doubles: the steps' figures come from the trainer's event lines, and an int64 sum of
  // a hostile line's tokens could overflow.
  double tokens = 0;
  double seconds = 0;
  for (const v1::TrialStep* step : SteadySteps(trial)) {
    tokens += static_cast<double>(step->tokens());
    seconds += step->seconds();
  }
  // No timed step, or seconds that add up past every double (hostile lines' steps of 1e308 s), are
  // no time: the whole run's figure instead.
  return tokens > 0 && seconds > 0 && std::isfinite(seconds) ? tokens / seconds
                                                             : trial.tokens_per_second();
}

std::optional<double> StepVariation(const v1::TrialReport& trial) {
  if (!MeasuredRate(trial, SteadyTokensPerSecond(trial))) return std::nullopt;
  std::vector<double> seconds_a_token;
  for (const v1::TrialStep* step : SteadySteps(trial)) {
    if (step->tokens() > 0) {
      seconds_a_token.push_back(step->seconds() / static_cast<double>(step->tokens()));
    }
  }
  if (seconds_a_token.size() < 2) return std::nullopt;
  const double n = static_cast<double>(seconds_a_token.size());
  const double mean = std::accumulate(seconds_a_token.begin(), seconds_a_token.end(), 0.0) / n;
  double squares = 0;
  for (const double s : seconds_a_token) squares += (s - mean) * (s - mean);
  const double variation = std::sqrt(squares / (n - 1)) / mean;
  if (!std::isfinite(variation)) return std::nullopt;
  return variation;
}

std::optional<double> OthersCpuShare(const v1::TrialReport& trial) {
  // A share beside a tokens/s that is no measurement (a running trial's steps so far) says nothing.
  if (!MeasuredRate(trial, SteadyTokensPerSecond(trial))) return std::nullopt;
  double busy = 0;
  double seconds = 0;
  for (const v1::TrialStep* step : SteadySteps(trial)) {
    if (!step->has_others_cpu_share()) continue;
    busy += step->others_cpu_share() * step->seconds();
    seconds += step->seconds();
  }
  if (!(seconds > 0) || !std::isfinite(seconds)) return std::nullopt;
  return busy / seconds;
}

std::string BusyMachineLine(const v1::ReportResponse& report) {
  std::string trials;
  for (const v1::TrialReport& trial : report.trials()) {
    const std::optional<double> share = OthersCpuShare(trial);
    if (!share || *share < kBusyMachineShare) continue;
    char percent[16];
    std::snprintf(percent, sizeof percent, "%.0f%%", *share * 100);
    trials +=
        (trials.empty() ? "" : ", ") + OnOneLine(trial.name(), kMaxTrialNameBytes) + " " + percent;
  }
  if (trials.empty()) return "";
  return "busy machine: other processes took this share of the trainer's CPUs' time while these "
         "trials' tokens/s were measured: " +
         trials +
         "; their tokens/s (and its error) are the machine's load as much as the trial's (a CPU "
         "trial's LibTorch threads, one a core, wait for each other where another process holds "
         "a core: free the cores, or start the agent with OMP_NUM_THREADS at the free ones, "
         "which measures its rates again at that count)";
}

std::optional<double> MeasuredRate(const v1::TrialReport& trial, double rate) {
  // Infinite: a hostile event line's step of 1e-310 s.
  if (!HasEnded(trial) || !(rate > 0) || !std::isfinite(rate)) return std::nullopt;
  return rate;
}

std::optional<double> TimePredictionError(const v1::TrialReport& trial) {
  const std::optional<double> measured = MeasuredRate(trial, SteadyTokensPerSecond(trial));
  const double predicted = trial.prediction().tokens_per_second();
  if (trial.outcome() != "ok" || !measured || !(predicted > 0) || !std::isfinite(predicted)) {
    return std::nullopt;
  }
  const double error = (predicted - *measured) / *measured;
  // A measured rate so small (a hostile line's step of 1e300 s) that the error overflows.
  if (!std::isfinite(error)) return std::nullopt;
  return error;
}

std::optional<double> MachinePace(const v1::TrialReport& trial) {
  const double probed = trial.prediction().pace_seconds();
  if (!TimePredictionError(trial) || !estimate::IsPaceSeconds(probed)) return std::nullopt;
  std::vector<double> paces;
  for (const v1::TrialStep* step : SteadySteps(trial)) {
    // Another process's word: only a canary's seconds count.
    if (step->has_pace_seconds() && estimate::IsPaceSeconds(step->pace_seconds())) {
      paces.push_back(step->pace_seconds());
    }
  }
  if (paces.empty()) return std::nullopt;
  return probed / Median(paces);
}

std::optional<double> TimePredictionErrorAtPace(const v1::TrialReport& trial) {
  const std::optional<double> pace = MachinePace(trial);
  const std::optional<double> measured = MeasuredRate(trial, SteadyTokensPerSecond(trial));
  if (!pace || !measured) return std::nullopt;
  const double error = (trial.prediction().tokens_per_second() * *pace - *measured) / *measured;
  if (!std::isfinite(error)) return std::nullopt;
  return error;
}

std::optional<double> PredictionError(const v1::TrialReport& trial) {
  const int64_t measured = trial.peak_bytes();
  if (!trial.has_prediction() || trial.outcome() != "ok" || measured <= 0) return std::nullopt;
  return (static_cast<double>(trial.prediction().peak_bytes()) - static_cast<double>(measured)) /
         static_cast<double>(measured);
}

int64_t MaxRankPeak(const v1::TrialReport& trial) {
  int64_t peak = 0;
  for (const v1::RankMemory& rank : trial.ranks()) peak = std::max(peak, rank.peak_bytes());
  return peak;
}

std::vector<PhaseRange> PhaseRanges(const v1::TrialReport& trial) {
  // Only the step's phases (common/snapshot_event.h), in its order: the controller's answer is
  // another process's, and a made-up phase per rank would make a column each.
  std::vector<std::optional<PhaseRange>> by_phase(snapshot_event::kPhases.size());
  for (const v1::RankMemory& rank : trial.ranks()) {
    for (const v1::PhaseBytes& phase : rank.per_phase()) {
      const auto known =
          std::find(snapshot_event::kPhases.begin(), snapshot_event::kPhases.end(), phase.phase());
      if (known == snapshot_event::kPhases.end()) continue;
      std::optional<PhaseRange>& range = by_phase[known - snapshot_event::kPhases.begin()];
      if (!range.has_value()) {
        range = PhaseRange{phase.phase(), phase.allocated_bytes(), phase.allocated_bytes()};
      } else {
        range->min = std::min(range->min, phase.allocated_bytes());
        range->max = std::max(range->max, phase.allocated_bytes());
      }
    }
  }
  std::vector<PhaseRange> ranges;
  for (std::optional<PhaseRange>& range : by_phase) {
    if (range.has_value()) ranges.push_back(std::move(*range));
  }
  return ranges;
}

std::string MibRange(int64_t min, int64_t max) {
  return min == max ? Mib(min) : Mib(min) + "\u2013" + Mib(max);
}

LabRow MakeLabRow(const v1::TrialReport& trial, const LabLayout& layout) {
  LabRow row;
  row.unexpected = IsUnexpected(trial);
  const bool ended = HasEnded(trial);
  // The controller's words, on one line of the table (and of a Markdown row).
  row.cells.push_back(OnOneLine(trial.name(), kMaxTrialNameBytes));
  row.cells.push_back(trial.expected().empty() ? std::string(kNone)
                                               : OnOneLine(trial.expected(), kMaxShownBytes));
  row.cells.push_back(OnOneLine(trial.outcome(), kMaxShownBytes));
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
                          VerdictMark(estimate::ParseVerdict(trial.prediction().verdict())));
      const std::optional<double> error = PredictionError(trial);
      row.cells.push_back(ended ? ErrorCell(error) : std::string(kNone));
    }
  }
  row.cells.push_back(ended ? Printf("%.1f", trial.train_seconds()) : std::string(kNone));
  const std::optional<double> tokens_per_second = MeasuredRate(trial, SteadyTokensPerSecond(trial));
  row.cells.push_back(tokens_per_second ? Grouped(*tokens_per_second, 0) : std::string(kNone));
  const std::optional<double> variation = StepVariation(trial);
  row.cells.push_back(variation ? Printf("%.0f%%", 100.0 * *variation) : std::string(kNone));
  if (layout.timed) {
    const double predicted = trial.prediction().tokens_per_second();
    row.cells.push_back(predicted > 0 ? Grouped(predicted, 0) : std::string(kNone));
    const std::optional<double> error = TimePredictionError(trial);
    row.cells.push_back(ended ? ErrorCell(error) : std::string(kNone));
  }
  if (layout.paced) {
    const std::optional<double> pace = MachinePace(trial);
    row.cells.push_back(pace ? Printf("%.2f", *pace) : std::string(kNone));
    row.cells.push_back(pace ? ErrorCell(TimePredictionErrorAtPace(trial)) : std::string(kNone));
  }
  return row;
}

}  // namespace llmctl::cli
