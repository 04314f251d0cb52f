// Store's attempts of a trial: starting one, ending it with an outcome, declaring it lost or
// withdrawing one that never ran, the fence that refuses a stale attempt's writes, the running
// attempts, the lost attempts' runs not yet confirmed stopped, and resuming a trial from its final
// attempt's checkpoint.
#include <sqlite3.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/result_event.h"
#include "common/text.h"
#include "controller/store/sqlite.h"
#include "controller/store/store.h"
#include "controller/store/store_internal.h"

namespace llmctl::store {
namespace {

using internal::AttemptLabel;
using internal::FromMillis;
using internal::LatestEventOfType;
using internal::LoadNodeRemovedAt;
using internal::LoadTrial;
using internal::LoseAttempt;
using internal::ParseStoredJson;
using internal::QueryRunningAttempts;
using internal::Quoted;
using internal::RefreshExperimentState;
using internal::ToMillis;
using internal::TrialLabel;
using json = nlohmann::json;
using sqlite::Statement;
using sqlite::Transaction;

enum class AttemptState { kRunning, kEnded, kLost };

StatusOr<AttemptState> ParseAttemptState(std::string_view name) {
  if (name == "running") return AttemptState::kRunning;
  if (name == "ended") return AttemptState::kEnded;
  if (name == "lost") return AttemptState::kLost;
  return DataLossError("stored attempt state " + Quoted(name) + " is unknown");
}

// The stored row of one attempt.
struct AttemptRow {
  std::string node;
  AttemptState state = AttemptState::kRunning;
  std::optional<std::string> outcome;
  std::optional<int64_t> exit_code;
  std::string error;
};

StatusOr<std::optional<AttemptRow>> LoadAttempt(sqlite3* db, int64_t trial_id, int64_t attempt) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "SELECT node, state, outcome, exit_code, error FROM attempts "
                                      "WHERE trial_id = ? AND attempt = ?"));
  stmt.Bind(1, trial_id).Bind(2, attempt);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return std::optional<AttemptRow>();
  AttemptRow row;
  row.node = stmt.Text(0);
  ASSIGN_OR_RETURN(row.state, ParseAttemptState(stmt.Text(1)));
  row.outcome = stmt.OptionalText(2);
  row.exit_code = stmt.OptionalInt(3);
  row.error = stmt.Text(4);
  return std::optional<AttemptRow>(std::move(row));
}

// The trial and its attempt `attempt`, which must be the trial's current attempt and not lost:
// the fence that keeps a stale attempt (an agent that came back after its trial was requeued)
// from writing.
struct CurrentAttempt {
  TrialRecord trial;
  AttemptRow attempt;
};

StatusOr<CurrentAttempt> LoadCurrentAttempt(sqlite3* db, int64_t trial_id, int64_t attempt) {
  if (attempt < 1) {
    return InvalidArgumentError("attempt numbers start at 1, not " + std::to_string(attempt));
  }
  ASSIGN_OR_RETURN(TrialRecord trial, LoadTrial(db, trial_id));
  const std::string stale =
      "stale attempt " + std::to_string(attempt) + " of " + TrialLabel(trial_id);
  const std::string current = "; current is " + std::to_string(trial.current_attempt);
  if (attempt > trial.current_attempt) {
    return FailedPreconditionError(AttemptLabel(trial_id, attempt) + " was never started" +
                                   current);
  }
  if (attempt < trial.current_attempt) return FailedPreconditionError(stale + current);
  ASSIGN_OR_RETURN(std::optional<AttemptRow> row, LoadAttempt(db, trial_id, attempt));
  if (!row) return DataLossError(TrialLabel(trial_id) + " has no row for its current attempt");
  if (row->state == AttemptState::kLost) {
    return FailedPreconditionError(stale + ": it was declared lost; the trial is " +
                                   std::string(TrialStateName(trial.state)));
  }
  return CurrentAttempt{std::move(trial), std::move(*row)};
}

}  // namespace

StatusOr<std::vector<int64_t>> internal::ParseStoredDeviceIndices(const std::string& text,
                                                                  int64_t trial_id,
                                                                  int64_t attempt) {
  const std::string what =
      "device indices of attempt " + std::to_string(attempt) + " of " + TrialLabel(trial_id);
  ASSIGN_OR_RETURN(const json value, ParseStoredJson(text, what));
  const auto damaged = [&] {
    return DataLossError("stored " + what + " are not a list of indices: " + text);
  };
  if (!value.is_array()) return damaged();
  std::vector<int64_t> indices;
  for (const json& index : value) {
    if (!index.is_number_integer() || index.get<int64_t>() < 0) return damaged();
    indices.push_back(index.get<int64_t>());
  }
  return indices;
}

Status internal::CheckCurrentAttempt(sqlite3* db, int64_t trial_id, int64_t attempt) {
  return LoadCurrentAttempt(db, trial_id, attempt).status();
}

Status internal::LoseAttempt(sqlite3* db, int64_t trial_id, int64_t attempt, Time now) {
  StatusOr<CurrentAttempt> current = LoadCurrentAttempt(db, trial_id, attempt);
  if (!current.ok()) {
    // Declaring the same attempt lost twice is not an error.
    ASSIGN_OR_RETURN(const std::optional<AttemptRow> row, LoadAttempt(db, trial_id, attempt));
    if (row && row->state == AttemptState::kLost) return Status::Ok();
    return current.status();
  }
  if (current->attempt.state == AttemptState::kEnded) {
    return FailedPreconditionError(AttemptLabel(trial_id, attempt) + " has ended as " +
                                   current->attempt.outcome.value_or("?") + "; it cannot be lost");
  }
  ASSIGN_OR_RETURN(Statement lose,
                   Statement::Prepare(db,
                                      "UPDATE attempts SET state = 'lost', ended_at = ? "
                                      "WHERE trial_id = ? AND attempt = ?"));
  lose.Bind(1, ToMillis(now)).Bind(2, trial_id).Bind(3, attempt);
  RETURN_IF_ERROR(lose.Run());
  // Its runs that have not ended may go on and hold their devices until the controller confirms
  // each stopped (ReleaseLostRun): recorded with the loss, so that no restart forgets them.
  ASSIGN_OR_RETURN(Statement hold,
                   Statement::Prepare(db,
                                      "INSERT OR IGNORE INTO lost_runs (trial_id, attempt, node) "
                                      "SELECT trial_id, attempt, node FROM attempts WHERE "
                                      "trial_id = ?1 AND attempt = ?2 AND NOT EXISTS (SELECT 1 "
                                      "FROM attempt_nodes WHERE trial_id = ?1 AND attempt = ?2) "
                                      "UNION SELECT trial_id, attempt, node FROM attempt_nodes "
                                      "WHERE trial_id = ?1 AND attempt = ?2 AND ended_at IS NULL"));
  hold.Bind(1, trial_id).Bind(2, attempt);
  RETURN_IF_ERROR(hold.Run());
  ASSIGN_OR_RETURN(Statement requeue,
                   Statement::Prepare(db,
                                      "UPDATE trials SET state = CASE WHEN cancel_requested "
                                      "THEN 'cancelled' ELSE 'queued' END WHERE id = ?"));
  requeue.Bind(1, trial_id);
  RETURN_IF_ERROR(requeue.Run());
  return RefreshExperimentState(db, current->trial.experiment_id);
}

StatusOr<std::vector<RunningAttempt>> internal::QueryRunningAttempts(
    sqlite3* db, const std::string& trial_filter, std::optional<int64_t> bound) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "SELECT a.trial_id, t.experiment_id, a.attempt, a.node, "
                                      "a.started_at, a.device_indices_json FROM attempts a JOIN "
                                      "trials t ON t.id = a.trial_id WHERE a.state = 'running' " +
                                          trial_filter + " ORDER BY a.trial_id"));
  if (bound) stmt.Bind(1, *bound);
  std::vector<RunningAttempt> attempts;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    RunningAttempt& attempt = attempts.emplace_back(RunningAttempt{
        .trial_id = stmt.Int(0),
        .experiment_id = stmt.Int(1),
        .attempt = stmt.Int(2),
        .node = stmt.Text(3),
        .started_at = FromMillis(stmt.Int(4)),
        .device_indices = {},
        .nodes = {},
    });
    if (std::optional<std::string> indices = stmt.OptionalText(5)) {
      ASSIGN_OR_RETURN(attempt.device_indices, internal::ParseStoredDeviceIndices(
                                                   *indices, attempt.trial_id, attempt.attempt));
    }
  }
  for (RunningAttempt& attempt : attempts) {
    ASSIGN_OR_RETURN(attempt.nodes,
                     internal::LoadAttemptNodes(db, attempt.trial_id, attempt.attempt));
  }
  return attempts;
}

StatusOr<std::vector<RunningAttempt>> Store::ListRunningAttempts() {
  MutexLock lock(mutex_);
  return QueryRunningAttempts(db_, "", std::nullopt);
}

StatusOr<std::vector<LostRun>> Store::ListLostRuns() {
  MutexLock lock(mutex_);
  // A multi-node attempt's run holds the devices of its attempt_nodes row, a single-node one those
  // of the attempt.
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_,
                                      "SELECT l.trial_id, t.experiment_id, t.name, l.attempt, "
                                      "l.node, a.started_at, COALESCE(n.device_indices_json, "
                                      "a.device_indices_json) FROM lost_runs l JOIN attempts a "
                                      "ON a.trial_id = l.trial_id AND a.attempt = l.attempt JOIN "
                                      "trials t ON t.id = l.trial_id LEFT JOIN attempt_nodes n ON "
                                      "n.trial_id = l.trial_id AND n.attempt = l.attempt AND "
                                      "n.node = l.node ORDER BY l.trial_id, l.attempt, l.node"));
  std::vector<LostRun> runs;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    LostRun& run = runs.emplace_back(LostRun{.attempt = {.trial_id = stmt.Int(0),
                                                         .experiment_id = stmt.Int(1),
                                                         .attempt = stmt.Int(3),
                                                         .node = stmt.Text(4),
                                                         .started_at = FromMillis(stmt.Int(5)),
                                                         .device_indices = {},
                                                         .nodes = {}},
                                             .trial_name = stmt.Text(2)});
    if (std::optional<std::string> indices = stmt.OptionalText(6)) {
      ASSIGN_OR_RETURN(
          run.attempt.device_indices,
          internal::ParseStoredDeviceIndices(*indices, run.attempt.trial_id, run.attempt.attempt));
    }
  }
  return runs;
}

Status Store::ReleaseLostRun(int64_t trial_id, int64_t attempt, std::string_view node) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement release,
                   Statement::Prepare(db_,
                                      "DELETE FROM lost_runs WHERE trial_id = ? AND attempt = ? "
                                      "AND node = ?"));
  release.Bind(1, trial_id).Bind(2, attempt).Bind(3, node);
  return release.Run();
}

StatusOr<int64_t> internal::InsertAttempt(sqlite3* db, int64_t trial_id, std::string_view node,
                                          Time now, const std::vector<int64_t>& device_indices) {
  if (node.empty()) return InvalidArgumentError("starting " + TrialLabel(trial_id) + ": no node");
  std::vector<int64_t> sorted = device_indices;
  std::sort(sorted.begin(), sorted.end());
  if ((!sorted.empty() && sorted.front() < 0) ||
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return InvalidArgumentError("starting " + TrialLabel(trial_id) + " on node " +
                                std::string(node) + ": device indices " +
                                json(device_indices).dump() + " must be distinct and >= 0");
  }
  ASSIGN_OR_RETURN(const TrialRecord trial, LoadTrial(db, trial_id));
  if (trial.state != TrialState::kQueued) {
    return FailedPreconditionError(TrialLabel(trial_id) + " is " +
                                   std::string(TrialStateName(trial.state)) +
                                   "; only a queued trial can start");
  }
  RETURN_IF_ERROR(internal::CheckNodeNotRemoved(db, trial_id, node));
  const int64_t attempt = trial.current_attempt + 1;
  ASSIGN_OR_RETURN(Statement insert,
                   Statement::Prepare(db,
                                      "INSERT INTO attempts (trial_id, attempt, node, state, "
                                      "started_at, device_indices_json, first_step) VALUES "
                                      "(?, ?, ?, 'running', ?, ?, ?)"));
  insert.Bind(1, trial_id)
      .Bind(2, attempt)
      .Bind(3, node)
      .Bind(4, ToMillis(now))
      .Bind(5, json(sorted).dump())
      .Bind(6, trial.resume ? trial.resume->step : int64_t{0});
  RETURN_IF_ERROR(insert.Run());
  ASSIGN_OR_RETURN(Statement update,
                   Statement::Prepare(db,
                                      "UPDATE trials SET state = 'running', current_attempt = ? "
                                      "WHERE id = ?"));
  update.Bind(1, attempt).Bind(2, trial_id);
  RETURN_IF_ERROR(update.Run());
  return attempt;
}

Status internal::CheckNodeNotRemoved(sqlite3* db, int64_t trial_id, std::string_view node) {
  StatusOr<std::optional<Time>> removed = LoadNodeRemovedAt(db, node);
  if (removed.ok() && removed->has_value()) {
    return FailedPreconditionError("starting " + TrialLabel(trial_id) + ": node " + Quoted(node) +
                                   " has been removed");
  }
  if (!removed.ok() && removed.status().code() != StatusCode::kNotFound) return removed.status();
  return Status::Ok();
}

StatusOr<int64_t> Store::StartAttempt(int64_t trial_id, std::string_view node, Time now,
                                      const std::vector<int64_t>& device_indices) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  ASSIGN_OR_RETURN(const int64_t attempt,
                   internal::InsertAttempt(db_, trial_id, node, now, device_indices));
  RETURN_IF_ERROR(txn.Commit());
  return attempt;
}

Status Store::MarkAttemptLost(int64_t trial_id, int64_t attempt, Time now) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  RETURN_IF_ERROR(LoseAttempt(db_, trial_id, attempt, now));
  return txn.Commit();
}

Status Store::WithdrawAttempt(int64_t trial_id, int64_t attempt) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  ASSIGN_OR_RETURN(const CurrentAttempt current, LoadCurrentAttempt(db_, trial_id, attempt));
  const std::string label = AttemptLabel(trial_id, attempt);
  if (current.attempt.state != AttemptState::kRunning) {
    return FailedPreconditionError(label + " has ended; it cannot be withdrawn");
  }
  // Whatever a run stored proves that it ran: such an attempt is lost, never withdrawn.
  ASSIGN_OR_RETURN(Statement stored,
                   Statement::Prepare(db_,
                                      "SELECT EXISTS (SELECT 1 FROM events WHERE trial_id = ?1 AND "
                                      "attempt = ?2) OR EXISTS (SELECT 1 FROM rank_events WHERE "
                                      "trial_id = ?1 AND attempt = ?2) OR EXISTS (SELECT 1 FROM "
                                      "device_samples WHERE trial_id = ?1 AND attempt = ?2) OR "
                                      "EXISTS (SELECT 1 FROM attempt_nodes WHERE trial_id = ?1 AND "
                                      "attempt = ?2 AND ended_at IS NOT NULL)"));
  stored.Bind(1, trial_id).Bind(2, attempt);
  ASSIGN_OR_RETURN(const bool has_row, stored.Step());
  if (!has_row || stored.Int(0) != 0) {
    return FailedPreconditionError(label + " has stored what its runs did; it cannot be withdrawn");
  }
  // Its attempt_nodes rows go with it (ON DELETE CASCADE).
  ASSIGN_OR_RETURN(
      Statement remove,
      Statement::Prepare(db_, "DELETE FROM attempts WHERE trial_id = ? AND attempt = ?"));
  remove.Bind(1, trial_id).Bind(2, attempt);
  RETURN_IF_ERROR(remove.Run());
  ASSIGN_OR_RETURN(Statement requeue,
                   Statement::Prepare(db_,
                                      "UPDATE trials SET current_attempt = ?, state = CASE WHEN "
                                      "cancel_requested THEN 'cancelled' ELSE 'queued' END WHERE "
                                      "id = ?"));
  requeue.Bind(1, attempt - 1).Bind(2, trial_id);
  RETURN_IF_ERROR(requeue.Run());
  RETURN_IF_ERROR(RefreshExperimentState(db_, current.trial.experiment_id));
  return txn.Commit();
}

Status internal::EndAttempt(sqlite3* db, int64_t trial_id, int64_t attempt, TrialState outcome,
                            std::optional<int64_t> exit_code, std::string_view error, Time now) {
  if (!IsOutcome(outcome)) {
    return InvalidArgumentError("finishing attempt " + std::to_string(attempt) + " of " +
                                TrialLabel(trial_id) + ": " + std::string(TrialStateName(outcome)) +
                                " is not an outcome");
  }
  const std::string outcome_name(TrialStateName(outcome));
  const std::string kept_error = OnOneLine(error, kMaxErrorBytes);
  ASSIGN_OR_RETURN(const CurrentAttempt current, LoadCurrentAttempt(db, trial_id, attempt));
  if (current.attempt.state == AttemptState::kEnded) {
    if (current.attempt.outcome == outcome_name && current.attempt.exit_code == exit_code &&
        current.attempt.error == kept_error) {
      return Status::Ok();
    }
    return FailedPreconditionError(AttemptLabel(trial_id, attempt) + " already ended as " +
                                   current.attempt.outcome.value_or("?") + "; refusing to end it " +
                                   "again as " + outcome_name);
  }
  ASSIGN_OR_RETURN(Statement end,
                   Statement::Prepare(db,
                                      "UPDATE attempts SET state = 'ended', ended_at = ?, "
                                      "outcome = ?, exit_code = ?, error = ? "
                                      "WHERE trial_id = ? AND attempt = ?"));
  end.Bind(1, ToMillis(now))
      .Bind(2, outcome_name)
      .BindOptional(3, exit_code)
      .Bind(4, kept_error)
      .Bind(5, trial_id)
      .Bind(6, attempt);
  RETURN_IF_ERROR(end.Run());
  ASSIGN_OR_RETURN(Statement update, Statement::Prepare(db,
                                                        "UPDATE trials SET state = ? "
                                                        "WHERE id = ?"));
  update.Bind(1, outcome_name).Bind(2, trial_id);
  RETURN_IF_ERROR(update.Run());
  return RefreshExperimentState(db, current.trial.experiment_id);
}

Status Store::FinishAttempt(int64_t trial_id, int64_t attempt, TrialState outcome,
                            std::optional<int64_t> exit_code, std::string_view error, Time now) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  RETURN_IF_ERROR(internal::EndAttempt(db_, trial_id, attempt, outcome, exit_code, error, now));
  return txn.Commit();
}

namespace {

// Where `trial` (ended, not ok) continues from: its final attempt's checkpoint, else the checkpoint
// that attempt itself continued. FailedPrecondition saying why when there is none.
StatusOr<TrialResume> ResumePoint(sqlite3* db, const TrialRecord& trial, const std::string& label) {
  const std::string state(TrialStateName(trial.state));
  const int64_t final_attempt = trial.current_attempt;
  const std::string which = label + "'s final attempt " + std::to_string(final_attempt);
  ASSIGN_OR_RETURN(const std::optional<AttemptRow> row, LoadAttempt(db, trial.id, final_attempt));
  if (!row) {
    return FailedPreconditionError(label + " is " + state + " and never ran: it has no checkpoint");
  }
  if (row->state != AttemptState::kEnded) {
    return FailedPreconditionError(which +
                                   " was lost with its node: its end and any checkpoint "
                                   "are unknown");
  }
  ASSIGN_OR_RETURN(const json result, LatestEventOfType(db, trial.id, final_attempt,
                                                        std::string(result_event::kType)));
  if (const std::optional<result_event::Checkpoint> checkpoint =
          result_event::CheckpointOf(result)) {
    // The event counts steps from 0; the checkpoint holds the steps up to and including it.
    ASSIGN_OR_RETURN(Statement tree,
                     Statement::Prepare(db,
                                        "SELECT checkpoint_tree FROM attempts WHERE trial_id = ? "
                                        "AND attempt = ?"));
    tree.Bind(1, trial.id).Bind(2, final_attempt);
    ASSIGN_OR_RETURN(const bool has_row, tree.Step());
    return TrialResume{.attempt = final_attempt,
                       .node = row->node,
                       .checkpoint = checkpoint->path,
                       .step = checkpoint->step + 1,
                       .tree = has_row && !tree.IsNull(0) ? tree.Text(0) : ""};
  }
  if (trial.resume) {
    // The final attempt continued this checkpoint and ended before it wrote or named one (say, the
    // agent no longer had it, or the trainer refused its config): the checkpoint is still the
    // run's latest.
    return *trial.resume;
  }
  const std::string why = row->error.empty() ? result_event::ErrorOf(result) : row->error;
  return FailedPreconditionError(which + " ended " + state + " without a checkpoint" +
                                 (why.empty() ? "" : " (" + why + ")") +
                                 "; a running trial stopped with llmctl cancel --checkpoint "
                                 "keeps one");
}

// With the controller's copy any node can continue it; without, only the checkpoint's node, so
// that node must not have been removed.
Status CheckCheckpointReachable(sqlite3* db, const TrialResume& resume, const std::string& label) {
  if (!resume.tree.empty()) return Status::Ok();
  StatusOr<std::optional<Time>> removed = LoadNodeRemovedAt(db, resume.node);
  if (removed.ok() && removed->has_value()) {
    return FailedPreconditionError(label + "'s checkpoint is on node " + Quoted(resume.node) +
                                   ", which has been removed, and the controller has no copy "
                                   "of it");
  }
  if (!removed.ok() && removed.status().code() != StatusCode::kNotFound) {
    return removed.status();
  }
  return Status::Ok();
}

}  // namespace

StatusOr<TrialResume> Store::ResumeTrial(int64_t trial_id) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  ASSIGN_OR_RETURN(const TrialRecord trial, LoadTrial(db_, trial_id));
  const std::string label = "trial '" + trial.name + "'";
  if (!IsOutcome(trial.state)) {
    return FailedPreconditionError(label + " is " + std::string(TrialStateName(trial.state)) +
                                   "; only a trial that has ended can be resumed");
  }
  if (trial.state == TrialState::kOk) {
    return FailedPreconditionError(label + " ended ok: there is nothing left to run");
  }
  ASSIGN_OR_RETURN(const TrialResume resume, ResumePoint(db_, trial, label));
  RETURN_IF_ERROR(CheckCheckpointReachable(db_, resume, label));
  ASSIGN_OR_RETURN(Statement update,
                   Statement::Prepare(db_,
                                      "UPDATE trials SET state = 'queued', cancel_requested = 0, "
                                      "resume_attempt = ?, resume_step = ?, resume_checkpoint = ? "
                                      "WHERE id = ?"));
  update.Bind(1, resume.attempt).Bind(2, resume.step).Bind(3, resume.checkpoint).Bind(4, trial_id);
  RETURN_IF_ERROR(update.Run());
  RETURN_IF_ERROR(RefreshExperimentState(db_, trial.experiment_id));
  RETURN_IF_ERROR(txn.Commit());
  return resume;
}

Status Store::SetCheckpointTree(int64_t trial_id, int64_t attempt, std::string_view tree_digest) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement update,
                   Statement::Prepare(db_,
                                      "UPDATE attempts SET checkpoint_tree = ? WHERE trial_id = ? "
                                      "AND attempt = ?"));
  update.Bind(1, tree_digest).Bind(2, trial_id).Bind(3, attempt);
  RETURN_IF_ERROR(update.Run());
  if (sqlite3_changes(db_) == 0) {
    return NotFoundError("trial " + std::to_string(trial_id) + " has no attempt " +
                         std::to_string(attempt));
  }
  return Status::Ok();
}

}  // namespace llmctl::store
