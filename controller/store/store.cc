#include "controller/store/store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "common/event_line.h"
#include "common/result_event.h"
#include "controller/store/schema.h"
#include "controller/store/sqlite.h"
#include "controller/store/store_internal.h"

namespace llmctl::store {
namespace {

using sqlite::Statement;
using sqlite::Transaction;
using json = nlohmann::json;

constexpr int kBusyTimeoutMs = 5000;

constexpr std::array<std::string_view, 7> kTrialStateNames = {
    "queued", "running", "ok", "oom", "diverged", "failed", "cancelled"};

using internal::FromMillis;
using internal::LatestEventOfType;
using internal::LoadExperiment;
using internal::LoadNodeRemovedAt;
using internal::LoseAttempt;
using internal::ParseStoredJson;
using internal::QueryRunningAttempts;
using internal::Quoted;
using internal::StoredTrialState;
using internal::ToMillis;

std::string TrialLabel(int64_t trial_id) { return "trial " + std::to_string(trial_id); }

Status ErrnoStatus(int error, const std::string& what) {
  const StatusCode code = error == EACCES || error == EPERM || error == EROFS
                              ? StatusCode::kPermissionDenied
                              : StatusCode::kFailedPrecondition;
  return Status(code, what + ": " + std::strerror(error));
}

// Creates the missing directories above `path` with mode 0700: the database holds the user's
// experiments and the names of their secrets.
Status CreateParentDirectories(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) return Status::Ok();
  std::filesystem::path current;
  for (const std::filesystem::path& part : parent) {
    current /= part;
    if (current == current.root_path()) continue;
    if (::mkdir(current.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, "cannot create directory " + current.string());
    }
  }
  struct stat info {};
  if (::stat(parent.c_str(), &info) != 0) {
    return ErrnoStatus(errno, "cannot use directory " + parent.string());
  }
  if (!S_ISDIR(info.st_mode)) {
    return FailedPreconditionError(parent.string() + " is not a directory");
  }
  return Status::Ok();
}

// Creates the database file with mode 0600 before SQLite opens it (SQLite would create it with
// 0644 less the umask) and narrows an existing one. SQLite gives its -wal and -shm files the mode
// of the database file.
Status CreatePrivateFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus(errno, "cannot open " + path);
  struct stat info {};
  Status status;
  if (::fstat(fd, &info) != 0) {
    status = ErrnoStatus(errno, "cannot stat " + path);
  } else if (!S_ISREG(info.st_mode)) {
    status = FailedPreconditionError(path + " is not a regular file");
  } else if ((info.st_mode & 0777) != 0600 && ::fchmod(fd, 0600) != 0) {
    status = ErrnoStatus(errno, "cannot make " + path + " private (mode 0600)");
  }
  ::close(fd);
  return status;
}

StatusOr<int64_t> ReadUserVersion(sqlite3* db) {
  ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db, "PRAGMA user_version"));
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return InternalError("PRAGMA user_version returned no row");
  return stmt.Int(0);
}

// Applies the migrations the database lacks, all in one transaction, so that two processes opening
// a fresh file at once migrate it once.
Status Migrate(sqlite3* db) {
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db));
  ASSIGN_OR_RETURN(const int64_t version, ReadUserVersion(db));
  const std::span<const std::string_view> migrations = Migrations();
  const auto known = static_cast<int64_t>(migrations.size());
  if (version > known) {
    return FailedPreconditionError("its schema version is " + std::to_string(version) +
                                   " but this llmctld knows versions up to " +
                                   std::to_string(known) +
                                   ": a newer llmctld wrote it; run that version or use another "
                                   "data directory");
  }
  if (version < 0) {
    return DataLossError("its schema version is negative (" + std::to_string(version) + ")");
  }
  for (int64_t next = version; next < known; ++next) {
    const std::string label = "schema migration " + std::to_string(next + 1);
    RETURN_IF_ERROR(sqlite::Exec(db, migrations[static_cast<size_t>(next)]).WithContext(label));
    RETURN_IF_ERROR(
        sqlite::Exec(db, "PRAGMA user_version = " + std::to_string(next + 1)).WithContext(label));
  }
  return txn.Commit();
}

Status Configure(sqlite3* db) {
  sqlite3_extended_result_codes(db, 1);
  const int rc = sqlite3_busy_timeout(db, kBusyTimeoutMs);
  if (rc != SQLITE_OK) return sqlite::Error(db, rc, "setting the busy timeout");
  RETURN_IF_ERROR(sqlite::Exec(db, "PRAGMA foreign_keys = ON"));
  // The first statement that reads the file: a file that is no database fails here.
  ASSIGN_OR_RETURN(Statement journal, Statement::Prepare(db, "PRAGMA journal_mode = WAL"));
  ASSIGN_OR_RETURN(const bool has_row, journal.Step());
  const std::string mode = has_row ? journal.Text(0) : "";
  if (mode != "wal") {
    return FailedPreconditionError("cannot switch to write-ahead logging (journal mode is " +
                                   Quoted(mode) + "); is the file on a network file system?");
  }
  // With a write-ahead log, NORMAL syncs at checkpoints rather than at every commit: a killed
  // process loses nothing and the file never corrupts; a power cut may lose the last commits,
  // which ingestion recovers from anyway (streams resume from LastSeq). FULL cost about 5 ms per
  // transaction here.
  return sqlite::Exec(db, "PRAGMA synchronous = NORMAL");
}

StatusOr<ExperimentState> ParseExperimentState(std::string_view name) {
  if (name == "active") return ExperimentState::kActive;
  if (name == "done") return ExperimentState::kDone;
  return DataLossError("stored experiment state " + Quoted(name) + " is unknown");
}

enum class AttemptState { kRunning, kEnded, kLost };

StatusOr<AttemptState> ParseAttemptState(std::string_view name) {
  if (name == "running") return AttemptState::kRunning;
  if (name == "ended") return AttemptState::kEnded;
  if (name == "lost") return AttemptState::kLost;
  return DataLossError("stored attempt state " + Quoted(name) + " is unknown");
}

}  // namespace

StatusOr<TrialState> internal::StoredTrialState(std::string_view name) {
  StatusOr<TrialState> state = ParseTrialState(name);
  if (!state.ok()) return DataLossError("stored " + state.status().message());
  return state;
}

StatusOr<json> internal::ParseStoredJson(const std::string& text, std::string_view what) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return DataLossError("stored " + std::string(what) + " is not JSON");
  return value;
}

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

namespace {

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

StatusOr<ExperimentRecord> internal::LoadExperiment(sqlite3* db, int64_t experiment_id) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db, "SELECT " + std::string(kExperimentColumns) +
                                              " FROM experiments WHERE id = ?"));
  stmt.Bind(1, experiment_id);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return NotFoundError("no experiment " + std::to_string(experiment_id));
  return ReadExperiment(stmt);
}

namespace {

StatusOr<TrialRecord> LoadTrial(sqlite3* db, int64_t trial_id) {
  ASSIGN_OR_RETURN(std::vector<TrialRecord> trials, QueryTrials(db, "WHERE id = ?", trial_id));
  if (trials.empty()) return NotFoundError("no " + TrialLabel(trial_id));
  return std::move(trials.front());
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
    return FailedPreconditionError("attempt " + std::to_string(attempt) + " of " +
                                   TrialLabel(trial_id) + " was never started" + current);
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

Status RefreshExperimentState(sqlite3* db, int64_t experiment_id) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "UPDATE experiments SET state = CASE WHEN EXISTS ("
                                      "SELECT 1 FROM trials WHERE experiment_id = ?1 AND state IN "
                                      "('queued', 'running')) THEN 'active' ELSE 'done' END "
                                      "WHERE id = ?1"));
  stmt.Bind(1, experiment_id);
  return stmt.Run();
}

}  // namespace

Status internal::LoseAttempt(sqlite3* db, int64_t trial_id, int64_t attempt, Time now) {
  StatusOr<CurrentAttempt> current = LoadCurrentAttempt(db, trial_id, attempt);
  if (!current.ok()) {
    // Declaring the same attempt lost twice is not an error.
    ASSIGN_OR_RETURN(const std::optional<AttemptRow> row, LoadAttempt(db, trial_id, attempt));
    if (row && row->state == AttemptState::kLost) return Status::Ok();
    return current.status();
  }
  if (current->attempt.state == AttemptState::kEnded) {
    return FailedPreconditionError("attempt " + std::to_string(attempt) + " of " +
                                   TrialLabel(trial_id) + " has ended as " +
                                   current->attempt.outcome.value_or("?") + "; it cannot be lost");
  }
  ASSIGN_OR_RETURN(Statement lose,
                   Statement::Prepare(db,
                                      "UPDATE attempts SET state = 'lost', ended_at = ? "
                                      "WHERE trial_id = ? AND attempt = ?"));
  lose.Bind(1, ToMillis(now)).Bind(2, trial_id).Bind(3, attempt);
  RETURN_IF_ERROR(lose.Run());
  ASSIGN_OR_RETURN(Statement requeue,
                   Statement::Prepare(db,
                                      "UPDATE trials SET state = CASE WHEN cancel_requested "
                                      "THEN 'cancelled' ELSE 'queued' END WHERE id = ?"));
  requeue.Bind(1, trial_id);
  RETURN_IF_ERROR(requeue.Run());
  return RefreshExperimentState(db, current->trial.experiment_id);
}

StatusOr<std::optional<Time>> internal::LoadNodeRemovedAt(sqlite3* db, std::string_view node) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db, "SELECT removed_at FROM nodes WHERE name = ?"));
  stmt.Bind(1, node);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return NotFoundError("no node " + Quoted(node));
  if (stmt.IsNull(0)) return std::optional<Time>();
  return std::optional<Time>(FromMillis(stmt.Int(0)));
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
  if (!json::parse(trial.config_json, nullptr, false).is_object()) {
    return InvalidArgumentError(where + "config is not a JSON object");
  }
  if (trial.prediction_json && !json::parse(*trial.prediction_json, nullptr, false).is_object()) {
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

Status ValidateEvent(const Event& event, int64_t trial_id, int64_t attempt) {
  const std::string where = "event " + std::to_string(event.seq) + " of attempt " +
                            std::to_string(attempt) + " of " + TrialLabel(trial_id);
  if (event.seq < 1) return InvalidArgumentError(where + ": sequence numbers start at 1");
  if (event.rank < 0) {
    return InvalidArgumentError(where + ": rank " + std::to_string(event.rank) + " is negative");
  }
  if (event.type.empty()) return InvalidArgumentError(where + ": the type is empty");
  // The rule the agent and the dispatcher apply (they store a refused line's replacement instead).
  const std::string refusal =
      event_line::Refusal(event.json, static_cast<int64_t>(event.json.size()));
  if (!refusal.empty()) return InvalidArgumentError(where + ": the line is refused: " + refusal);
  const json line = json::parse(event.json, nullptr, false);
  const auto type = line.find("type");
  if (type->get_ref<const std::string&>() != event.type) {
    return InvalidArgumentError(where + ": the line's \"type\" is " + type->dump() + ", not " +
                                Quoted(event.type));
  }
  return Status::Ok();
}

}  // namespace

StatusOr<json> internal::LatestEventOfType(sqlite3* db, int64_t trial_id, int64_t attempt,
                                           std::string_view type) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "SELECT json FROM events WHERE trial_id = ? AND attempt = ? "
                                      "AND type = ? ORDER BY seq DESC LIMIT 1"));
  stmt.Bind(1, trial_id).Bind(2, attempt).Bind(3, type);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return json(nullptr);
  return ParseStoredJson(stmt.Text(0), "event");
}

Status internal::CheckCurrentAttempt(sqlite3* db, int64_t trial_id, int64_t attempt) {
  return LoadCurrentAttempt(db, trial_id, attempt).status();
}

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

StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  if (path.empty()) return InvalidArgumentError("the store's database path is empty");
  const std::string context = "store " + path;
  RETURN_IF_ERROR(CreateParentDirectories(path).WithContext(context));
  RETURN_IF_ERROR(CreatePrivateFile(path).WithContext(context));
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
  // Owned from here on, so that every error path closes the connection.
  std::unique_ptr<Store> store(new Store(db));
  if (rc != SQLITE_OK) return sqlite::Error(db, rc, "opening the database").WithContext(context);
  Status status = Configure(db);
  if (status.ok()) status = Migrate(db);
  if (status.code() == StatusCode::kDataLoss) {
    return DataLossError(context + ": not an SQLite database, or a damaged one (" +
                         status.message() + ")");
  }
  RETURN_IF_ERROR(status.WithContext(context));
  return store;
}

StatusOr<std::unique_ptr<Store>> Store::OpenReadOnly(const std::string& path) {
  const std::string context = "store " + path;
  if (::access(path.c_str(), F_OK) != 0) return NotFoundError(context + ": no such file");
  sqlite3* db = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, nullptr);
  std::unique_ptr<Store> store(new Store(db));
  if (rc != SQLITE_OK) return sqlite::Error(db, rc, "opening the database").WithContext(context);
  sqlite3_busy_timeout(db, kBusyTimeoutMs);
  StatusOr<int64_t> version = ReadUserVersion(db);
  if (!version.ok()) {
    return DataLossError(context + ": not an SQLite database, or a damaged one (" +
                         version.status().message() + ")");
  }
  const auto known = static_cast<int64_t>(Migrations().size());
  if (*version != known) {
    return FailedPreconditionError(context + ": its schema version is " + std::to_string(*version) +
                                   ", this build's " + std::to_string(known));
  }
  return store;
}

Store::~Store() { sqlite3_close_v2(db_); }

StatusOr<int64_t> Store::SchemaVersion() {
  MutexLock lock(mutex_);
  return ReadUserVersion(db_);
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

StatusOr<std::vector<RunningAttempt>> Store::ListRunningAttempts() {
  MutexLock lock(mutex_);
  return QueryRunningAttempts(db_, "", std::nullopt);
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

StatusOr<int64_t> Store::AppendEvents(int64_t trial_id, int64_t attempt,
                                      std::span<const Event> events) {
  for (const Event& event : events) RETURN_IF_ERROR(ValidateEvent(event, trial_id, attempt));
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  RETURN_IF_ERROR(LoadCurrentAttempt(db_, trial_id, attempt).status());
  ASSIGN_OR_RETURN(Statement insert,
                   Statement::Prepare(db_,
                                      "INSERT OR IGNORE INTO events (trial_id, attempt, seq, type, "
                                      "json) VALUES (?, ?, ?, ?, ?)"));
  ASSIGN_OR_RETURN(Statement insert_ranked,
                   Statement::Prepare(db_,
                                      "INSERT OR IGNORE INTO rank_events (trial_id, attempt, rank, "
                                      "seq, type, json) VALUES (?, ?, ?, ?, ?, ?)"));
  int64_t added = 0;
  for (const Event& event : events) {
    if (event.rank == 0) {
      insert.Reset();
      insert.Bind(1, trial_id)
          .Bind(2, attempt)
          .Bind(3, event.seq)
          .Bind(4, event.type)
          .Bind(5, event.json);
      RETURN_IF_ERROR(insert.Run());
    } else {
      insert_ranked.Reset();
      insert_ranked.Bind(1, trial_id)
          .Bind(2, attempt)
          .Bind(3, static_cast<int64_t>(event.rank))
          .Bind(4, event.seq)
          .Bind(5, event.type)
          .Bind(6, event.json);
      RETURN_IF_ERROR(insert_ranked.Run());
    }
    added += sqlite3_changes(db_);
  }
  RETURN_IF_ERROR(txn.Commit());
  return added;
}

StatusOr<int64_t> Store::LastSeq(int64_t trial_id, int64_t attempt) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db_,
                                                      "SELECT COALESCE(MAX(seq), 0) FROM events "
                                                      "WHERE trial_id = ? AND attempt = ?"));
  stmt.Bind(1, trial_id).Bind(2, attempt);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return InternalError("MAX(seq) returned no row");
  return stmt.Int(0);
}

StatusOr<std::map<int32_t, int64_t>> Store::LastRankSeqs(int64_t trial_id, int64_t attempt) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_,
                                      "SELECT rank, MAX(seq) FROM rank_events "
                                      "WHERE trial_id = ? AND attempt = ? GROUP BY rank"));
  stmt.Bind(1, trial_id).Bind(2, attempt);
  std::map<int32_t, int64_t> seqs;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    seqs[static_cast<int32_t>(stmt.Int(0))] = stmt.Int(1);
  }
  return seqs;
}

Status internal::EndAttempt(sqlite3* db, int64_t trial_id, int64_t attempt, TrialState outcome,
                            std::optional<int64_t> exit_code, std::string_view error, Time now) {
  if (!IsOutcome(outcome)) {
    return InvalidArgumentError("finishing attempt " + std::to_string(attempt) + " of " +
                                TrialLabel(trial_id) + ": " + std::string(TrialStateName(outcome)) +
                                " is not an outcome");
  }
  const std::string outcome_name(TrialStateName(outcome));
  ASSIGN_OR_RETURN(const CurrentAttempt current, LoadCurrentAttempt(db, trial_id, attempt));
  if (current.attempt.state == AttemptState::kEnded) {
    if (current.attempt.outcome == outcome_name && current.attempt.exit_code == exit_code &&
        current.attempt.error == error) {
      return Status::Ok();
    }
    return FailedPreconditionError("attempt " + std::to_string(attempt) + " of " +
                                   TrialLabel(trial_id) + " already ended as " +
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
      .Bind(4, error)
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

StatusOr<TrialResume> Store::ResumeTrial(int64_t trial_id) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  ASSIGN_OR_RETURN(const TrialRecord trial, LoadTrial(db_, trial_id));
  const std::string label = "trial '" + trial.name + "'";
  const std::string state(TrialStateName(trial.state));
  if (!IsOutcome(trial.state)) {
    return FailedPreconditionError(label + " is " + state +
                                   "; only a trial that has ended can be resumed");
  }
  if (trial.state == TrialState::kOk) {
    return FailedPreconditionError(label + " ended ok: there is nothing left to run");
  }
  const int64_t final_attempt = trial.current_attempt;
  const std::string which = label + "'s final attempt " + std::to_string(final_attempt);
  ASSIGN_OR_RETURN(const std::optional<AttemptRow> row, LoadAttempt(db_, trial_id, final_attempt));
  if (!row) {
    return FailedPreconditionError(label + " is " + state + " and never ran: it has no checkpoint");
  }
  if (row->state != AttemptState::kEnded) {
    return FailedPreconditionError(which +
                                   " was lost with its node: its end and any checkpoint "
                                   "are unknown");
  }
  ASSIGN_OR_RETURN(const json result, LatestEventOfType(db_, trial_id, final_attempt,
                                                        std::string(result_event::kType)));
  TrialResume resume;
  if (const std::optional<result_event::Checkpoint> checkpoint =
          result_event::CheckpointOf(result)) {
    // The event counts steps from 0; the checkpoint holds the steps up to and including it.
    ASSIGN_OR_RETURN(Statement tree,
                     Statement::Prepare(db_,
                                        "SELECT checkpoint_tree FROM attempts WHERE trial_id = ? "
                                        "AND attempt = ?"));
    tree.Bind(1, trial_id).Bind(2, final_attempt);
    ASSIGN_OR_RETURN(const bool has_row, tree.Step());
    resume = TrialResume{.attempt = final_attempt,
                         .node = row->node,
                         .checkpoint = checkpoint->path,
                         .step = checkpoint->step + 1,
                         .tree = has_row && !tree.IsNull(0) ? tree.Text(0) : ""};
  } else if (trial.resume) {
    // The final attempt continued this checkpoint and ended before it wrote or named one (say, the
    // agent no longer had it, or the trainer refused its config): the checkpoint is still the
    // run's latest.
    resume = *trial.resume;
  } else {
    std::string why = row->error;
    if (why.empty() && result.is_object() && result.value("error", json()).is_string()) {
      why = result["error"].get<std::string>();
    }
    return FailedPreconditionError(which + " ended " + state + " without a checkpoint" +
                                   (why.empty() ? "" : " (" + why + ")") +
                                   "; a running trial stopped with llmctl cancel --checkpoint "
                                   "keeps one");
  }
  // With the controller's copy any node can continue it; without, only the checkpoint's node.
  if (resume.tree.empty()) {
    StatusOr<std::optional<Time>> removed = LoadNodeRemovedAt(db_, resume.node);
    if (removed.ok() && removed->has_value()) {
      return FailedPreconditionError(label + "'s checkpoint is on node " + Quoted(resume.node) +
                                     ", which has been removed, and the controller has no copy "
                                     "of it");
    }
    if (!removed.ok() && removed.status().code() != StatusCode::kNotFound) {
      return removed.status();
    }
  }
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
