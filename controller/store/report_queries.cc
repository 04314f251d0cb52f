// Store's reports: an experiment's trials as `llmctl report` shows them, read from the report views
// (controller/store/schema.cc: trial_results, trial_phase_peaks, the per-rank views and
// trial_memory_timeline), and the steps of its trials' runs (trial_steps).
#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/event_line.h"
#include "common/foreign_json.h"
#include "common/kernel_fallback_event.h"
#include "common/machine_cpu.h"
#include "common/median.h"
#include "common/text.h"
#include "controller/store/sqlite.h"
#include "controller/store/store.h"
#include "controller/store/store_internal.h"

namespace llmctl::store {
namespace {

using internal::LatestEventOfType;
using internal::LoadExperiment;
using internal::ParseStoredJson;
using internal::StoredTrialState;
using json = nlohmann::json;
using sqlite::Statement;
using sqlite::Transaction;

// One stored event line, parsed; null when there is no event with that key.
StatusOr<json> LoadEventJson(sqlite3* db, int64_t trial_id, int64_t attempt, int64_t seq) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "SELECT json FROM events WHERE trial_id = ? AND attempt = ? "
                                      "AND seq = ?"));
  stmt.Bind(1, trial_id).Bind(2, attempt).Bind(3, seq);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return json(nullptr);
  return ParseStoredJson(stmt.Text(0), "event");
}

// The trial's refused_line events, every attempt's and rank's.
StatusOr<int64_t> CountRefusedEventLines(sqlite3* db, int64_t trial_id) {
  ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db,
                         "SELECT (SELECT COUNT(*) FROM events WHERE trial_id = ?1 AND type = ?2) + "
                         "(SELECT COUNT(*) FROM rank_events WHERE trial_id = ?1 AND type = ?2)"));
  stmt.Bind(1, trial_id).Bind(2, event_line::kRefusedType);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  return has_row ? stmt.Int(0) : 0;
}

// The most kernel fallbacks a trial's report names, and the most bytes of an op's name and of a
// reason: the trainer writes one per op (six of them) and rank, with a reason of about 80 bytes,
// but its lines are untrusted, and a report must stay far under the CLI's 64 MiB answer.
constexpr int kMaxKernelFallbacks = 256;
constexpr size_t kMaxFallbackOpBytes = 64;
constexpr size_t kMaxFallbackReasonBytes = 512;

// The attempt's kernel_fallback events: each rank's first of each op, in the order the ranks wrote
// them, at most kMaxKernelFallbacks. A field of another type than the header names reads as empty,
// and a text longer than its cap is cut (the cut kept valid UTF-8).
StatusOr<std::vector<KernelFallback>> LoadKernelFallbacks(sqlite3* db, int64_t trial_id,
                                                          int64_t attempt) {
  // SQLite takes the bare `json` from the row that MIN(seq) chose.
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "SELECT rank, json, MIN(seq) AS first FROM all_rank_events "
                                      "WHERE trial_id = ? AND attempt = ? AND type = ? "
                                      "GROUP BY rank, json_extract(json, '$.op') "
                                      "ORDER BY rank, first LIMIT ?"));
  stmt.Bind(1, trial_id)
      .Bind(2, attempt)
      .Bind(3, kernel_fallback_event::kType)
      .Bind(4, int64_t{kMaxKernelFallbacks});
  std::vector<KernelFallback> fallbacks;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    const json event = ParseForeignJson(stmt.Text(1));
    if (!event.is_object()) continue;
    const auto text = [&event](std::string_view key, size_t max_bytes) {
      const auto it = event.find(key);
      if (it == event.end() || !it->is_string()) return std::string();
      const std::string& value = it->get_ref<const std::string&>();
      return value.size() <= max_bytes ? value : ReplaceInvalidUtf8(value.substr(0, max_bytes));
    };
    const auto step = event.find(kernel_fallback_event::kStep);
    fallbacks.push_back(
        {.op = text(kernel_fallback_event::kOp, kMaxFallbackOpBytes),
         .reason = text(kernel_fallback_event::kReason, kMaxFallbackReasonBytes),
         .step = step != event.end() && step->is_number_integer() ? step->get<int64_t>() : 0,
         .rank = static_cast<int>(stmt.Int(0))});
  }
  return fallbacks;
}

// The experiment's rows of the trial_results view (schema.cc: the report's rules), in file order.
StatusOr<std::vector<TrialReport>> QueryTrialResults(sqlite3* db, int64_t experiment_id) {
  ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db,
                         "SELECT trial_id, trial, expected, outcome, attempt, node, exit_code, "
                         "error, train_seconds, tokens_per_second, final_loss, peak_bytes, "
                         "load_peak_bytes, at_peak_attempt, at_peak_seq, run_attempts "
                         "FROM trial_results WHERE experiment_id = ? ORDER BY ordinal"));
  stmt.Bind(1, experiment_id);
  std::vector<TrialReport> trials;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    TrialReport& report = trials.emplace_back();
    report.trial_id = stmt.Int(0);
    report.name = stmt.Text(1);
    report.expect = stmt.OptionalText(2);
    ASSIGN_OR_RETURN(report.state, StoredTrialState(stmt.Text(3)));
    report.attempt = stmt.OptionalInt(4).value_or(0);
    report.node = stmt.Text(5);
    report.exit_code = stmt.OptionalInt(6);
    // The view falls back on the result event's error, the trainer's text as its line held it,
    // and a database of an older controller kept any agent's error whole.
    report.error = OnOneLine(stmt.Text(7), kMaxErrorBytes);
    // Sums and products of the trainer's figures: SQLite makes inf of ones past a double's range,
    // which no report should print.
    const auto finite = [](std::optional<double> x) {
      return x && std::isfinite(*x) ? x : std::nullopt;
    };
    report.train_seconds = finite(stmt.OptionalNumber(8));
    report.tokens_per_second = finite(stmt.OptionalNumber(9));
    report.final_loss = stmt.OptionalNumber(10);
    report.peak_bytes = stmt.OptionalInt(11);
    report.load_peak_bytes = stmt.OptionalInt(12);
    if (!stmt.IsNull(13)) {
      ASSIGN_OR_RETURN(report.peak_snapshot,
                       LoadEventJson(db, report.trial_id, stmt.Int(13), stmt.Int(14)));
    }
    std::istringstream run_attempts(stmt.Text(15));  // "1,3"
    for (std::string attempt; std::getline(run_attempts, attempt, ',');) {
      report.run_attempts.push_back(std::stoll(attempt));
    }
  }
  return trials;
}

// Adds the experiment's rows of the trial_phase_peaks view to its trials' reports.
Status FillPhasePeaks(sqlite3* db, int64_t experiment_id, std::vector<TrialReport>& trials) {
  std::map<int64_t, TrialReport*> by_id;
  for (TrialReport& trial : trials) by_id[trial.trial_id] = &trial;
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "SELECT v.trial_id, v.phase, e.json FROM trial_phase_peaks v "
                                      "JOIN events e ON e.trial_id = v.trial_id AND "
                                      "e.attempt = v.attempt AND e.seq = v.seq "
                                      "WHERE v.experiment_id = ? ORDER BY v.phase_order"));
  stmt.Bind(1, experiment_id);
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    auto trial = by_id.find(stmt.Int(0));
    if (trial == by_id.end()) continue;
    ASSIGN_OR_RETURN(json snapshot, ParseStoredJson(stmt.Text(2), "snapshot event"));
    trial->second->phase_peaks.emplace_back(stmt.Text(1), std::move(snapshot));
  }
  return Status::Ok();
}

// Adds every rank's memory (trial_rank_peaks, trial_rank_phase_peaks) to the reports of the
// experiment's trials that have events of a rank above 0.
Status FillRankMemory(sqlite3* db, int64_t experiment_id, std::vector<TrialReport>& trials) {
  std::map<int64_t, TrialReport*> by_id;
  for (TrialReport& trial : trials) by_id[trial.trial_id] = &trial;
  ASSIGN_OR_RETURN(Statement multi,
                   Statement::Prepare(db,
                                      "SELECT DISTINCT r.trial_id FROM rank_events r "
                                      "JOIN trials t ON t.id = r.trial_id "
                                      "WHERE t.experiment_id = ?"));
  multi.Bind(1, experiment_id);
  std::set<int64_t> multi_rank;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, multi.Step());
    if (!has_row) break;
    multi_rank.insert(multi.Int(0));
  }
  if (multi_rank.empty()) return Status::Ok();
  ASSIGN_OR_RETURN(Statement peaks,
                   Statement::Prepare(db,
                                      "SELECT trial_id, rank, peak_bytes, allocated_bytes "
                                      "FROM trial_rank_peaks WHERE experiment_id = ?"));
  peaks.Bind(1, experiment_id);
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, peaks.Step());
    if (!has_row) break;
    auto trial = by_id.find(peaks.Int(0));
    if (trial == by_id.end() || !multi_rank.contains(peaks.Int(0))) continue;
    trial->second->ranks.push_back(RankMemory{.rank = static_cast<int32_t>(peaks.Int(1)),
                                              .peak_bytes = peaks.OptionalInt(2),
                                              .allocated_bytes = peaks.OptionalInt(3),
                                              .phase_allocated = {}});
  }
  ASSIGN_OR_RETURN(Statement phases,
                   Statement::Prepare(db,
                                      "SELECT trial_id, rank, phase, allocated_bytes "
                                      "FROM trial_rank_phase_peaks WHERE experiment_id = ? "
                                      "AND allocated_bytes IS NOT NULL"));
  phases.Bind(1, experiment_id);
  std::map<std::pair<int64_t, int64_t>, RankMemory*> by_rank;  // (trial id, rank)
  for (TrialReport& trial : trials) {
    for (RankMemory& rank : trial.ranks) by_rank[{trial.trial_id, rank.rank}] = &rank;
  }
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, phases.Step());
    if (!has_row) break;
    auto rank = by_rank.find({phases.Int(0), phases.Int(1)});
    if (rank == by_rank.end()) continue;
    rank->second->phase_allocated.emplace_back(phases.Text(2), phases.Int(3));
  }
  return Status::Ok();
}

// A multi-node attempt's other nodes' zeros (AttemptMemory::node_started_unix_ms): when node rank
// 0's trainer started, read on node k's clock. Node rank k runs ranks k * R to k * R + R - 1, R the
// world size over the nodes (as llm-train's launcher numbers them), and its first rank's `start`
// event is dated by node k's clock. That rank's own started_unix_ms is not the zero: node k is
// launched only once node rank 0's launcher has written its port, and rank 0 waits for it where the
// ranks meet, so from the meeting on the nodes train together, rank 0 that wait longer after its
// start. The meeting is the one moment both clocks read (each start event's
// ranks_met_elapsed_ms): the zero is node k's first rank's start plus its time to the meeting, less
// rank 0's.
StatusOr<std::map<int64_t, int64_t>> LoadNodeStarts(sqlite3* db, int64_t trial_id,
                                                    int64_t attempt) {
  std::map<int64_t, int64_t> starts;
  ASSIGN_OR_RETURN(const std::vector<AttemptNode> nodes,
                   internal::LoadAttemptNodes(db, trial_id, attempt));
  if (nodes.size() < 2) return starts;
  ASSIGN_OR_RETURN(const json start, LatestEventOfType(db, trial_id, attempt, "start"));
  if (!start.is_object()) return starts;
  const auto world_size = start.find("world_size");
  const auto rank_zero_met_ms = start.find("ranks_met_elapsed_ms");
  if (world_size == start.end() || !world_size->is_number_integer() ||
      rank_zero_met_ms == start.end() || !rank_zero_met_ms->is_number()) {
    return starts;
  }
  const auto node_count = static_cast<int64_t>(nodes.size());
  const int64_t ranks_per_node = world_size->get<int64_t>() / node_count;
  // An event line is the trainer's word: a world that is not whole nodes' ranks places nothing.
  if (ranks_per_node < 1 || world_size->get<int64_t>() % node_count != 0) return starts;
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "SELECT rank, json_extract(json, '$.started_unix_ms'), "
                                      "json_extract(json, '$.ranks_met_elapsed_ms') "
                                      "FROM rank_events r WHERE trial_id = ? AND attempt = ? "
                                      "AND type = 'start' AND rank % ? = 0 AND seq = "
                                      "(SELECT MAX(seq) FROM rank_events WHERE "
                                      "trial_id = r.trial_id AND attempt = r.attempt AND "
                                      "type = 'start' AND rank = r.rank)"));
  stmt.Bind(1, trial_id).Bind(2, attempt).Bind(3, ranks_per_node);
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    const std::optional<int64_t> started = stmt.OptionalInt(1);
    const std::optional<double> met_ms = stmt.OptionalNumber(2);
    const int64_t node_rank = stmt.Int(0) / ranks_per_node;
    if (!started || !met_ms || node_rank >= node_count) continue;
    const double zero = static_cast<double>(*started) + *met_ms - rank_zero_met_ms->get<double>();
    // Below 2^53 ms, where a double still holds every millisecond; an infinite or NaN figure fails
    // the test too.
    if (zero > 0 && zero < 9e15) starts[node_rank] = std::llround(zero);
  }
  return starts;
}

// Adds the experiment's rows of the trial_memory_timeline view to its trials' reports.
Status FillMemoryTimeline(sqlite3* db, int64_t experiment_id, std::vector<TrialReport>& trials) {
  std::map<int64_t, TrialReport*> by_id;
  for (TrialReport& trial : trials) by_id[trial.trial_id] = &trial;
  ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db,
                         "SELECT v.trial_id, v.attempt, v.attempt_started_unix_ms, "
                         "v.device_limit_bytes, e.json FROM trial_memory_timeline v "
                         "LEFT JOIN events e ON e.trial_id = v.trial_id AND "
                         "e.attempt = v.attempt AND e.seq = v.seq "
                         "WHERE v.experiment_id = ? ORDER BY v.trial_id, v.attempt, v.seq"));
  stmt.Bind(1, experiment_id);
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    auto trial = by_id.find(stmt.Int(0));
    if (trial == by_id.end()) continue;
    std::vector<AttemptMemory>& timeline = trial->second->memory_timeline;
    if (timeline.empty() || timeline.back().attempt != stmt.Int(1)) {
      timeline.push_back(AttemptMemory{.attempt = stmt.Int(1),
                                       .started_unix_ms = stmt.OptionalInt(2),
                                       .device_limit_bytes = stmt.OptionalInt(3),
                                       .snapshots = {},
                                       .ended_elapsed_ms = std::nullopt,
                                       .node_started_unix_ms = {}});
    }
    if (stmt.IsNull(4)) continue;  // an attempt without snapshots
    ASSIGN_OR_RETURN(json snapshot, ParseStoredJson(stmt.Text(4), "snapshot event"));
    timeline.back().snapshots.push_back(std::move(snapshot));
  }
  for (TrialReport& trial : trials) {
    for (AttemptMemory& attempt : trial.memory_timeline) {
      ASSIGN_OR_RETURN(const json result,
                       LatestEventOfType(db, trial.trial_id, attempt.attempt, "result"));
      if (result.is_object() && result.contains("elapsed_ms") && result["elapsed_ms"].is_number()) {
        attempt.ended_elapsed_ms = result["elapsed_ms"].get<double>();
      }
      ASSIGN_OR_RETURN(attempt.node_started_unix_ms,
                       LoadNodeStarts(db, trial.trial_id, attempt.attempt));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string AttemptNodesText(const TrialReport& trial) {
  if (trial.nodes.empty()) return trial.node;
  std::string text;
  for (const std::string& node : trial.nodes) text += (text.empty() ? "" : "+") + node;
  return text;
}

StatusOr<ExperimentReport> Store::Report(int64_t experiment_id, ReportDetail detail) {
  MutexLock lock(mutex_);
  // One snapshot for all trials, though ingestion goes on meanwhile.
  ASSIGN_OR_RETURN(Transaction snapshot, Transaction::BeginRead(db_));
  ExperimentReport report;
  ASSIGN_OR_RETURN(report.experiment, LoadExperiment(db_, experiment_id));
  ASSIGN_OR_RETURN(report.trials, QueryTrialResults(db_, experiment_id));
  for (TrialReport& trial : report.trials) {
    if (trial.attempt == 0) continue;
    if (detail == ReportDetail::kFull) {
      ASSIGN_OR_RETURN(trial.refused_event_lines, CountRefusedEventLines(db_, trial.trial_id));
      ASSIGN_OR_RETURN(trial.kernel_fallbacks,
                       LoadKernelFallbacks(db_, trial.trial_id, trial.attempt));
    }
    ASSIGN_OR_RETURN(trial.start, LatestEventOfType(db_, trial.trial_id, trial.attempt, "start"));
    ASSIGN_OR_RETURN(trial.last_step,
                     LatestEventOfType(db_, trial.trial_id, trial.attempt, "step"));
    ASSIGN_OR_RETURN(const std::vector<AttemptNode> nodes,
                     internal::LoadAttemptNodes(db_, trial.trial_id, trial.attempt));
    for (const AttemptNode& node : nodes) trial.nodes.push_back(node.node);
  }
  RETURN_IF_ERROR(FillRankMemory(db_, experiment_id, report.trials));
  if (detail == ReportDetail::kFull) {
    RETURN_IF_ERROR(FillPhasePeaks(db_, experiment_id, report.trials));
    RETURN_IF_ERROR(FillMemoryTimeline(db_, experiment_id, report.trials));
  }
  RETURN_IF_ERROR(snapshot.Commit());
  return report;
}

StatusOr<std::vector<TrialStep>> Store::RunSteps(int64_t experiment_id) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction snapshot, Transaction::BeginRead(db_));
  RETURN_IF_ERROR(LoadExperiment(db_, experiment_id).status());
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_,
                                      "SELECT trial_id, attempt, step, loss, tokens, seconds, "
                                      "others_cpu_share, pace_seconds FROM trial_steps WHERE "
                                      "experiment_id = ?"));
  stmt.Bind(1, experiment_id);
  std::vector<TrialStep> steps;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    steps.push_back(TrialStep{.trial_id = stmt.Int(0),
                              .attempt = stmt.Int(1),
                              .step = stmt.Int(2),
                              .loss = stmt.OptionalNumber(3),
                              .tokens = stmt.OptionalInt(4),
                              .seconds = stmt.OptionalNumber(5),
                              .others_cpu_share = stmt.OptionalNumber(6),
                              .pace_seconds = stmt.OptionalNumber(7)});
  }
  RETURN_IF_ERROR(snapshot.Commit());
  return steps;
}

StatusOr<std::vector<TimedRun>> Store::TimedRuns() {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction snapshot, Transaction::BeginRead(db_));
  ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_,
                         "WITH timed AS (SELECT t.id, t.prediction_json, s.step, s.tokens, "
                         "s.seconds, s.pace_seconds FROM trials t JOIN trial_steps s ON "
                         "s.trial_id = t.id "
                         "WHERE t.state = 'ok' AND t.prediction_json IS NOT NULL AND s.step >= 1 "
                         "AND s.tokens > 0 AND s.seconds > 0 AND (s.others_cpu_share IS NULL OR "
                         "s.others_cpu_share < ?2)) "
                         "SELECT id, prediction_json, tokens, seconds, pace_seconds FROM timed "
                         "WHERE id IN "
                         "(SELECT DISTINCT id FROM timed ORDER BY id DESC LIMIT ?1) "
                         "ORDER BY id, step"));
  stmt.Bind(1, static_cast<int64_t>(kMaxTimedRuns));
  stmt.BindOptional(2, std::optional<double>(kBusyMachineShare));
  std::vector<TimedRun> runs;
  std::vector<double> steps;  // the current run's seconds per token
  std::vector<double> paces;  // its steps' pace canary seconds, those that are one
  const auto take_median = [&runs, &steps, &paces] {
    if (steps.empty()) return;
    runs.back().seconds_per_token = Median(steps);
    runs.back().steps = static_cast<int64_t>(steps.size());
    runs.back().pace_seconds = paces.empty() ? 0 : Median(paces);
    steps.clear();
    paces.clear();
  };
  int64_t current = -1;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    if (stmt.Int(0) != current) {
      take_median();
      current = stmt.Int(0);
      runs.push_back({.prediction_json = stmt.Text(1)});
    }
    steps.push_back(stmt.OptionalNumber(3).value_or(0) /
                    static_cast<double>(stmt.OptionalInt(2).value_or(1)));
    // The trainer's word: a reader checks the median's range (estimate::IsPaceSeconds).
    if (const std::optional<double> pace = stmt.OptionalNumber(4);
        pace && std::isfinite(*pace) && *pace > 0) {
      paces.push_back(*pace);
    }
  }
  take_median();
  RETURN_IF_ERROR(snapshot.Commit());
  return runs;
}

}  // namespace llmctl::store
