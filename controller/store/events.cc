// Store's events: the lines a trial's workers wrote, stored idempotently per (trial, attempt,
// rank, seq) for the current attempt only, and where each rank's stream resumes.
#include <sqlite3.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "common/checked_math.h"
#include "common/event_line.h"
#include "common/foreign_json.h"
#include "common/trial_config.h"
#include "controller/store/sqlite.h"
#include "controller/store/store.h"
#include "controller/store/store_internal.h"
#include "controller/store/stored_config.h"

namespace llmctl::store {
namespace {

using internal::ParseStoredJson;
using internal::Quoted;
using internal::TrialLabel;
using json = nlohmann::json;
using sqlite::Statement;
using sqlite::Transaction;

// "event 3 of attempt 1 of trial 7", as the store's refusals of an event name it.
std::string EventLabel(const Event& event, int64_t trial_id, int64_t attempt) {
  return "event " + std::to_string(event.seq) + " of attempt " + std::to_string(attempt) + " of " +
         TrialLabel(trial_id);
}

Status ValidateEvent(const Event& event, int64_t trial_id, int64_t attempt) {
  const std::string where = EventLabel(event, trial_id, attempt);
  if (event.seq < 1) return InvalidArgumentError(where + ": sequence numbers start at 1");
  if (event.seq > kMaxSeq) return InvalidArgumentError(where + ": past the last sequence number");
  if (event.rank < 0) {
    return InvalidArgumentError(where + ": rank " + std::to_string(event.rank) + " is negative");
  }
  if (event.type.empty()) return InvalidArgumentError(where + ": the type is empty");
  // The rule the agent and the dispatcher apply (they store a refused line's replacement instead).
  const std::string refusal =
      event_line::Refusal(event.json, static_cast<int64_t>(event.json.size()));
  if (!refusal.empty()) return InvalidArgumentError(where + ": the line is refused: " + refusal);
  const json line = ParseForeignJson(event.json);
  const auto type = line.find("type");
  if (type->get_ref<const std::string&>() != event.type) {
    return InvalidArgumentError(where + ": the line's \"type\" is " + type->dump() + ", not " +
                                Quoted(event.type));
  }
  return Status::Ok();
}

// How many ranks the attempt runs: each of its nodes (one for a single-node attempt) runs the
// trial config's RanksPerNode, as the agent starts them (agent/trial_file.cc). The dispatcher drops
// a node's lines of ranks that node does not run (controller/dispatch/event_streams.cc); the store,
// the last edge before the database, bounds the attempt as a whole.
StatusOr<int64_t> AttemptWorldSize(sqlite3* db, int64_t trial_id, int64_t attempt) {
  ASSIGN_OR_RETURN(const TrialRecord trial, internal::LoadTrial(db, trial_id));
  ASSIGN_OR_RETURN(const TrialConfig config, StoredConfig(trial));
  ASSIGN_OR_RETURN(const std::vector<AttemptNode> nodes,
                   internal::LoadAttemptNodes(db, trial_id, attempt));
  return SaturatingMul(RanksPerNode(config), std::max<int64_t>(1, std::ssize(nodes)));
}

// InvalidArgument naming the first event whose rank is not one of the attempt's ranks. Rank 0 is
// in every attempt: a batch of rank 0's lines alone (every single-rank trial's) reads no config.
Status CheckEventRanks(sqlite3* db, std::span<const Event> events, int64_t trial_id,
                       int64_t attempt) {
  const auto ranked = [](const Event& event) { return event.rank > 0; };
  if (std::none_of(events.begin(), events.end(), ranked)) return Status::Ok();
  ASSIGN_OR_RETURN(const int64_t world_size, AttemptWorldSize(db, trial_id, attempt));
  for (const Event& event : events) {
    if (event.rank < world_size) continue;
    return InvalidArgumentError(EventLabel(event, trial_id, attempt) + ": rank " +
                                std::to_string(event.rank) + " is not one of the attempt's " +
                                std::to_string(world_size) + " ranks (0 to " +
                                std::to_string(world_size - 1) + ")");
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

StatusOr<int64_t> Store::AppendEvents(int64_t trial_id, int64_t attempt,
                                      std::span<const Event> events) {
  int64_t bytes = 0;
  for (const Event& event : events) {
    RETURN_IF_ERROR(ValidateEvent(event, trial_id, attempt));
    bytes += static_cast<int64_t>(event.json.size() + event.type.size()) + kRowOverheadBytes;
  }
  RETURN_IF_ERROR(CheckRoomForRows(events.size(), "event lines", trial_id, attempt, bytes));
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  RETURN_IF_ERROR(internal::CheckCurrentAttempt(db_, trial_id, attempt));
  RETURN_IF_ERROR(CheckEventRanks(db_, events, trial_id, attempt));
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

}  // namespace llmctl::store
