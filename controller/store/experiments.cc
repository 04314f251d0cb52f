// Store's experiments and their trials: submitting an experiment, reading its rows back, the
// trial and experiment states, and cancelling queued and running trials.
#include <sqlite3.h>

#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/foreign_json.h"
#include "controller/store/sqlite.h"
#include "controller/store/store.h"
#include "controller/store/store_internal.h"

namespace llmctl::store {
namespace {

using internal::FromMillis;
using internal::LoadExperiment;
using internal::LoadTrial;
using internal::ParseStoredJson;
using internal::QueryRunningAttempts;
using internal::Quoted;
using internal::RefreshExperimentState;
using internal::StoredTrialState;
using internal::ToMillis;
using internal::TrialLabel;
using json = nlohmann::json;
using sqlite::Statement;
using sqlite::Transaction;

constexpr std::array<std::string_view, 7> kTrialStateNames = {
    "queued", "running", "ok", "oom", "diverged", "failed", "cancelled"};

StatusOr<ExperimentState> ParseExperimentState(std::string_view name) {
  if (name == "active") return ExperimentState::kActive;
  if (name == "done") return ExperimentState::kDone;
  return DataLossError("stored experiment state " + Quoted(name) + " is unknown");
}

constexpr std::string_view kExperimentColumns =
    "id, name, filename, yaml_text, description, target_json, created_at, state";

StatusOr<ExperimentRecord> ReadExperiment(const Statement& stmt) {
  ExperimentRecord record;
  record.id = stmt.Int(0);
  record.name = stmt.Text(1);
  record.filename = stmt.Text(2);
  record.yaml_text = stmt.Text(3);
  record.description = stmt.Text(4);
  ASSIGN_OR_RETURN(const json target, ParseStoredJson(stmt.Text(5), "experiment target"));
  if (!target.is_object()) return DataLossError("stored experiment target is not a JSON object");
  for (const auto& [key, value] : target.items()) {
    if (!value.is_string()) return DataLossError("stored experiment target has a non-string value");
    record.target[key] = value.get<std::string>();
  }
  record.created_at = FromMillis(stmt.Int(6));
  ASSIGN_OR_RETURN(record.state, ParseExperimentState(stmt.Text(7)));
  return record;
}

constexpr std::string_view kTrialColumns =
    "id, experiment_id, ordinal, name, description, config_json, expect, device_type, "
    "device_count, state, current_attempt, cancel_requested, resume_attempt, resume_step, "
    "resume_checkpoint, (SELECT node FROM attempts WHERE trial_id = trials.id AND "
    "attempt = trials.resume_attempt), (SELECT checkpoint_tree FROM attempts WHERE "
    "trial_id = trials.id AND attempt = trials.resume_attempt), prediction_json";

StatusOr<TrialRecord> ReadTrial(const Statement& stmt) {
  TrialRecord record;
  record.id = stmt.Int(0);
  record.experiment_id = stmt.Int(1);
  record.ordinal = stmt.Int(2);
  record.name = stmt.Text(3);
  record.description = stmt.Text(4);
  record.config_json = stmt.Text(5);
  record.expect = stmt.OptionalText(6);
  record.device_type = stmt.Text(7);
  record.device_count = stmt.Int(8);
  ASSIGN_OR_RETURN(record.state, StoredTrialState(stmt.Text(9)));
  record.current_attempt = stmt.Int(10);
  record.cancel_requested = stmt.Int(11) != 0;
  if (!stmt.IsNull(12)) {
    record.resume = TrialResume{.attempt = stmt.Int(12),
                                .node = stmt.Text(15),
                                .checkpoint = stmt.Text(14),
                                .step = stmt.Int(13),
                                .tree = stmt.IsNull(16) ? "" : stmt.Text(16)};
  }
  record.prediction_json = stmt.OptionalText(17);
  return record;
}

StatusOr<std::vector<TrialRecord>> QueryTrials(sqlite3* db, const std::string& where_and_order,
                                               std::optional<int64_t> bound) {
  ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db, "SELECT " + std::string(kTrialColumns) +
                                                              " FROM trials " + where_and_order));
  if (bound) stmt.Bind(1, *bound);
  std::vector<TrialRecord> trials;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    ASSIGN_OR_RETURN(TrialRecord trial, ReadTrial(stmt));
    trials.push_back(std::move(trial));
  }
  return trials;
}

}  // namespace

StatusOr<TrialState> internal::StoredTrialState(std::string_view name) {
  StatusOr<TrialState> state = ParseTrialState(name);
  if (!state.ok()) return DataLossError("stored " + state.status().message());
  return state;
}

StatusOr<ExperimentRecord> internal::LoadExperiment(sqlite3* db, int64_t experiment_id) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db, "SELECT " + std::string(kExperimentColumns) +
                                              " FROM experiments WHERE id = ?"));
  stmt.Bind(1, experiment_id);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return NotFoundError("no experiment " + std::to_string(experiment_id));
  return ReadExperiment(stmt);
}

StatusOr<TrialRecord> internal::LoadTrial(sqlite3* db, int64_t trial_id) {
  ASSIGN_OR_RETURN(std::vector<TrialRecord> trials, QueryTrials(db, "WHERE id = ?", trial_id));
  if (trials.empty()) return NotFoundError("no " + TrialLabel(trial_id));
  return std::move(trials.front());
}

Status internal::RefreshExperimentState(sqlite3* db, int64_t experiment_id) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "UPDATE experiments SET state = CASE WHEN EXISTS ("
                                      "SELECT 1 FROM trials WHERE experiment_id = ?1 AND state IN "
                                      "('queued', 'running')) THEN 'active' ELSE 'done' END "
                                      "WHERE id = ?1"));
  stmt.Bind(1, experiment_id);
  return stmt.Run();
}

namespace {

// Cancels the trials matching `trial_filter` ("t.id = ?" or "t.experiment_id = ?").
StatusOr<std::vector<RunningAttempt>> CancelTrials(sqlite3* db, const std::string& trial_filter,
                                                   int64_t bound, int64_t experiment_id) {
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db));
  ASSIGN_OR_RETURN(Statement cancel_queued,
                   Statement::Prepare(db,
                                      "UPDATE trials AS t SET state = 'cancelled' WHERE "
                                      "t.state = 'queued' AND " +
                                          trial_filter));
  cancel_queued.Bind(1, bound);
  RETURN_IF_ERROR(cancel_queued.Run());
  ASSIGN_OR_RETURN(Statement mark_running,
                   Statement::Prepare(db,
                                      "UPDATE trials AS t SET cancel_requested = 1 WHERE "
                                      "t.state = 'running' AND " +
                                          trial_filter));
  mark_running.Bind(1, bound);
  RETURN_IF_ERROR(mark_running.Run());
  ASSIGN_OR_RETURN(std::vector<RunningAttempt> running,
                   QueryRunningAttempts(db, "AND " + trial_filter, bound));
  RETURN_IF_ERROR(RefreshExperimentState(db, experiment_id));
  RETURN_IF_ERROR(txn.Commit());
  return running;
}

Status ValidateTrial(const NewExperiment& experiment, const NewTrial& trial) {
  const std::string where =
      "experiment " + Quoted(experiment.name) + ", trial " + Quoted(trial.name) + ": ";
  if (trial.name.empty()) {
    return InvalidArgumentError("experiment " + Quoted(experiment.name) +
                                ": a trial has an empty name");
  }
  if (trial.device_type != "cpu" && trial.device_type != "cuda") {
    return InvalidArgumentError(where + "device type must be cpu or cuda, not " +
                                Quoted(trial.device_type));
  }
  if (trial.device_count < 1) {
    return InvalidArgumentError(where + "device count must be at least 1, not " +
                                std::to_string(trial.device_count));
  }
  if (trial.expect && *trial.expect != "ok" && *trial.expect != "oom") {
    return InvalidArgumentError(where + "expect must be ok or oom, not " + Quoted(*trial.expect));
  }
  if (!ParseForeignJson(trial.config_json).is_object()) {
    return InvalidArgumentError(where + "config is not a JSON object");
  }
  if (trial.prediction_json && !ParseForeignJson(*trial.prediction_json).is_object()) {
    return InvalidArgumentError(where + "prediction is not a JSON object");
  }
  return Status::Ok();
}

Status ValidateExperiment(const NewExperiment& experiment) {
  if (experiment.name.empty()) return InvalidArgumentError("the experiment has an empty name");
  if (experiment.trials.empty()) {
    return InvalidArgumentError("experiment " + Quoted(experiment.name) + " has no trials");
  }
  for (const NewTrial& trial : experiment.trials) RETURN_IF_ERROR(ValidateTrial(experiment, trial));
  for (const auto& [path, digest] : experiment.inputs) {
    if (path.empty() || digest.empty()) {
      return InvalidArgumentError("experiment " + Quoted(experiment.name) + ": input " +
                                  Quoted(path) + " needs a path and a digest");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view TrialStateName(TrialState state) {
  return kTrialStateNames[static_cast<size_t>(state)];
}

StatusOr<TrialState> ParseTrialState(std::string_view name) {
  for (size_t i = 0; i < kTrialStateNames.size(); ++i) {
    if (kTrialStateNames[i] == name) return static_cast<TrialState>(i);
  }
  return InvalidArgumentError("trial state " + Quoted(name) +
                              " is not one of queued, running, ok, oom, diverged, failed, "
                              "cancelled");
}

bool IsOutcome(TrialState state) {
  return state != TrialState::kQueued && state != TrialState::kRunning;
}

std::string_view ExperimentStateName(ExperimentState state) {
  return state == ExperimentState::kDone ? "done" : "active";
}

StatusOr<int64_t> Store::CreateExperiment(const NewExperiment& experiment, Time now) {
  RETURN_IF_ERROR(ValidateExperiment(experiment));
  json target = json::object();
  for (const auto& [key, value] : experiment.target) target[key] = value;

  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  ASSIGN_OR_RETURN(Statement insert_experiment,
                   Statement::Prepare(db_,
                                      "INSERT INTO experiments (name, filename, yaml_text, "
                                      "description, target_json, created_at, state) "
                                      "VALUES (?, ?, ?, ?, ?, ?, 'active')"));
  insert_experiment.Bind(1, experiment.name)
      .Bind(2, experiment.filename)
      .Bind(3, experiment.yaml_text)
      .Bind(4, experiment.description)
      .Bind(5, target.dump())
      .Bind(6, ToMillis(now));
  RETURN_IF_ERROR(insert_experiment.Run());
  const int64_t experiment_id = sqlite3_last_insert_rowid(db_);

  ASSIGN_OR_RETURN(Statement insert_trial,
                   Statement::Prepare(db_,
                                      "INSERT INTO trials (experiment_id, ordinal, name, "
                                      "description, config_json, expect, device_type, "
                                      "device_count, prediction_json, state) "
                                      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'queued')"));
  for (size_t ordinal = 0; ordinal < experiment.trials.size(); ++ordinal) {
    const NewTrial& trial = experiment.trials[ordinal];
    insert_trial.Reset();
    insert_trial.Bind(1, experiment_id)
        .Bind(2, static_cast<int64_t>(ordinal))
        .Bind(3, trial.name)
        .Bind(4, trial.description)
        .Bind(5, trial.config_json)
        .BindOptional(6, trial.expect)
        .Bind(7, trial.device_type)
        .Bind(8, trial.device_count)
        .BindOptional(9, trial.prediction_json);
    Status status = insert_trial.Run();
    if (status.code() == StatusCode::kAlreadyExists) {
      return AlreadyExistsError("experiment " + Quoted(experiment.name) + " names trial " +
                                Quoted(trial.name) + " twice; trial names must be unique");
    }
    RETURN_IF_ERROR(status);
  }

  ASSIGN_OR_RETURN(Statement insert_input,
                   Statement::Prepare(db_,
                                      "INSERT INTO inputs (experiment_id, path_as_written, digest) "
                                      "VALUES (?, ?, ?)"));
  for (const auto& [path, digest] : experiment.inputs) {
    insert_input.Reset();
    insert_input.Bind(1, experiment_id).Bind(2, path).Bind(3, digest);
    RETURN_IF_ERROR(insert_input.Run());
  }
  RETURN_IF_ERROR(txn.Commit());
  return experiment_id;
}

StatusOr<std::vector<ExperimentRecord>> Store::ListExperiments() {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_, "SELECT " + std::string(kExperimentColumns) +
                                               " FROM experiments ORDER BY id"));
  std::vector<ExperimentRecord> experiments;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    ASSIGN_OR_RETURN(ExperimentRecord record, ReadExperiment(stmt));
    experiments.push_back(std::move(record));
  }
  return experiments;
}

StatusOr<ExperimentRecord> Store::GetExperiment(int64_t experiment_id) {
  MutexLock lock(mutex_);
  return LoadExperiment(db_, experiment_id);
}

StatusOr<int64_t> Store::LatestExperimentId() {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_, "SELECT MAX(id) FROM experiments"));
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row || stmt.IsNull(0)) return NotFoundError("no experiment has been submitted yet");
  return stmt.Int(0);
}

StatusOr<std::map<std::string, std::string>> Store::GetInputs(int64_t experiment_id) {
  MutexLock lock(mutex_);
  RETURN_IF_ERROR(LoadExperiment(db_, experiment_id).status());
  ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_,
                                                      "SELECT path_as_written, digest FROM inputs "
                                                      "WHERE experiment_id = ?"));
  stmt.Bind(1, experiment_id);
  std::map<std::string, std::string> inputs;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    inputs[stmt.Text(0)] = stmt.Text(1);
  }
  return inputs;
}

StatusOr<std::vector<TrialRecord>> Store::ListTrials(int64_t experiment_id) {
  MutexLock lock(mutex_);
  RETURN_IF_ERROR(LoadExperiment(db_, experiment_id).status());
  return QueryTrials(db_, "WHERE experiment_id = ? ORDER BY ordinal", experiment_id);
}

StatusOr<TrialRecord> Store::GetTrial(int64_t trial_id) {
  MutexLock lock(mutex_);
  return LoadTrial(db_, trial_id);
}

StatusOr<std::vector<TrialRecord>> Store::NextQueuedTrials() {
  MutexLock lock(mutex_);
  return QueryTrials(db_, "WHERE state = 'queued' ORDER BY experiment_id, ordinal", std::nullopt);
}

StatusOr<std::vector<RunningAttempt>> Store::CancelTrial(int64_t trial_id) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(const TrialRecord trial, LoadTrial(db_, trial_id));
  return CancelTrials(db_, "t.id = ?", trial_id, trial.experiment_id);
}

StatusOr<std::vector<RunningAttempt>> Store::CancelExperiment(int64_t experiment_id) {
  MutexLock lock(mutex_);
  RETURN_IF_ERROR(LoadExperiment(db_, experiment_id).status());
  return CancelTrials(db_, "t.experiment_id = ?", experiment_id, experiment_id);
}

}  // namespace llmctl::store
