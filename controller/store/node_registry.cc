// Store's node registry: the agents the controller knows (the nodes table), their leases, their
// removal (which loses the attempts still running on them), and references to secrets.
#include <sqlite3.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/foreign_json.h"
#include "controller/store/sqlite.h"
#include "controller/store/store.h"
#include "controller/store/store_internal.h"

namespace llmctl::store {
namespace {

using internal::FromMillis;
using internal::LoadNodeRemovedAt;
using internal::LoseAttempt;
using internal::QueryRunningAttempts;
using internal::Quoted;
using internal::ToMillis;
using json = nlohmann::json;
using sqlite::Statement;
using sqlite::Transaction;

Status ValidateNode(const NodeRecord& node) {
  if (node.name.empty()) return InvalidArgumentError("a node needs a name");
  if (!ParseForeignJson(node.devices_json).is_array()) {
    return InvalidArgumentError("node " + Quoted(node.name) + ": devices are not a JSON array");
  }
  return Status::Ok();
}

// Binds name, address, devices_json, last_seen and state as parameters 1 to 5.
void BindNode(Statement& stmt, const NodeRecord& node) {
  stmt.Bind(1, node.name)
      .Bind(2, node.address)
      .Bind(3, node.devices_json)
      .Bind(4, ToMillis(node.last_seen))
      .Bind(5, node.state);
}

// Runs `sql`, a statement over a node's row with BindNode's parameters, for `node`.
Status WriteNode(sqlite3* db, std::string_view sql, const NodeRecord& node) {
  ASSIGN_OR_RETURN(Statement stmt, Statement::Prepare(db, sql));
  BindNode(stmt, node);
  return stmt.Run();
}

}  // namespace

StatusOr<std::optional<Time>> internal::LoadNodeRemovedAt(sqlite3* db, std::string_view node) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db, "SELECT removed_at FROM nodes WHERE name = ?"));
  stmt.Bind(1, node);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return NotFoundError("no node " + Quoted(node));
  if (stmt.IsNull(0)) return std::optional<Time>();
  return std::optional<Time>(FromMillis(stmt.Int(0)));
}

Status Store::UpsertNode(const NodeRecord& node) {
  RETURN_IF_ERROR(ValidateNode(node));
  MutexLock lock(mutex_);
  return WriteNode(
      db_,
      "INSERT INTO nodes (name, address, devices_json, last_seen, state) VALUES (?, ?, "
      "?, ?, ?) ON CONFLICT (name) DO UPDATE SET address = excluded.address, "
      "devices_json = excluded.devices_json, last_seen = excluded.last_seen, state = "
      "excluded.state WHERE removed_at IS NULL",
      node);
}

Status Store::RecordNodeHealth(const NodeRecord& node) {
  RETURN_IF_ERROR(ValidateNode(node));
  MutexLock lock(mutex_);
  return WriteNode(db_,
                   "UPDATE nodes SET devices_json = ?3, last_seen = ?4, state = ?5 WHERE name = ?1 "
                   "AND address = ?2 AND removed_at IS NULL",
                   node);
}

Status Store::RegisterNode(const NodeRecord& node) {
  RETURN_IF_ERROR(ValidateNode(node));
  MutexLock lock(mutex_);
  // A removed node's lease belonged to the server that `node down` deleted.
  return WriteNode(
      db_,
      "INSERT INTO nodes (name, address, devices_json, last_seen, state) VALUES (?, ?, "
      "?, ?, ?) ON CONFLICT (name) DO UPDATE SET address = excluded.address, "
      "devices_json = excluded.devices_json, last_seen = excluded.last_seen, state = "
      "excluded.state, "
      "lease = CASE WHEN removed_at IS NULL THEN lease ELSE '' END, "
      "lease_site = CASE WHEN removed_at IS NULL THEN lease_site ELSE '' END, "
      "lease_flavor = CASE WHEN removed_at IS NULL THEN lease_flavor ELSE '' END, "
      "lease_ends = CASE WHEN removed_at IS NULL THEN lease_ends ELSE NULL END, "
      "removed_at = NULL",
      node);
}

StatusOr<std::vector<NodeRecord>> Store::ListNodes() {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_,
                                      "SELECT name, address, devices_json, last_seen, state, "
                                      "lease, lease_site, lease_flavor, lease_ends "
                                      "FROM nodes WHERE removed_at IS NULL ORDER BY name"));
  std::vector<NodeRecord> nodes;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    NodeRecord& node = nodes.emplace_back(NodeRecord{.name = stmt.Text(0),
                                                     .address = stmt.Text(1),
                                                     .devices_json = stmt.Text(2),
                                                     .last_seen = FromMillis(stmt.Int(3)),
                                                     .state = stmt.Text(4),
                                                     .lease = std::nullopt});
    if (!stmt.IsNull(8)) {
      node.lease = NodeLease{.name = stmt.Text(5),
                             .site = stmt.Text(6),
                             .flavor = stmt.Text(7),
                             .ends = FromMillis(stmt.Int(8))};
    }
  }
  return nodes;
}

Status Store::SetNodeLease(std::string_view node, const NodeLease& lease) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_,
                                      "UPDATE nodes SET lease = ?, lease_site = ?, lease_flavor = "
                                      "?, lease_ends = ? WHERE name = ? AND removed_at IS NULL"));
  stmt.Bind(1, lease.name)
      .Bind(2, lease.site)
      .Bind(3, lease.flavor)
      .Bind(4, ToMillis(lease.ends))
      .Bind(5, node);
  RETURN_IF_ERROR(stmt.Run());
  if (sqlite3_changes(db_) == 0) return NotFoundError("no node " + Quoted(node));
  return Status::Ok();
}

StatusOr<NodeRemoval> Store::RemoveNode(std::string_view node, Time now) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  NodeRemoval removal;
  StatusOr<std::optional<Time>> removed_at = LoadNodeRemovedAt(db_, node);
  if (removed_at.ok() && removed_at->has_value()) {
    removal.result = NodeRemoval::Result::kAlreadyRemoved;
    removal.removed_at = **removed_at;
  } else if (removed_at.ok()) {
    removal.result = NodeRemoval::Result::kRemoved;
    removal.removed_at = now;
    ASSIGN_OR_RETURN(Statement remove,
                     Statement::Prepare(db_,
                                        "UPDATE nodes SET removed_at = ?, state = 'removed', "
                                        "address = '' WHERE name = ?"));
    remove.Bind(1, ToMillis(now)).Bind(2, node);
    RETURN_IF_ERROR(remove.Run());
  } else if (removed_at.status().code() == StatusCode::kNotFound) {
    removal.result = NodeRemoval::Result::kUnknown;
  } else {
    return removed_at.status();
  }
  ASSIGN_OR_RETURN(Statement forget_secret,
                   Statement::Prepare(db_, "DELETE FROM secrets_ref WHERE name = ?"));
  forget_secret.Bind(1, node);
  RETURN_IF_ERROR(forget_secret.Run());
  // Attempts on a node that never had a row (or started before its removal): lost all the same,
  // so that nothing is left running on a node the controller no longer knows.
  ASSIGN_OR_RETURN(std::vector<RunningAttempt> running,
                   QueryRunningAttempts(db_, "", std::nullopt));
  for (RunningAttempt& attempt : running) {
    if (!attempt.RunsOn(node)) continue;
    RETURN_IF_ERROR(LoseAttempt(db_, attempt.trial_id, attempt.attempt, now));
    removal.lost.push_back(std::move(attempt));
  }
  // Its lost runs, of these attempts and earlier ones, are waited for no more: the node is gone.
  ASSIGN_OR_RETURN(Statement release,
                   Statement::Prepare(db_, "DELETE FROM lost_runs WHERE node = ?"));
  release.Bind(1, node);
  RETURN_IF_ERROR(release.Run());
  RETURN_IF_ERROR(txn.Commit());
  return removal;
}

Status Store::PutSecretRef(std::string_view name, std::string_view reference) {
  if (name.empty() || reference.empty()) {
    return InvalidArgumentError("a secret reference needs a name and a reference");
  }
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_,
                                      "INSERT OR REPLACE INTO secrets_ref (name, reference) "
                                      "VALUES (?, ?)"));
  stmt.Bind(1, name).Bind(2, reference);
  return stmt.Run();
}

StatusOr<std::string> Store::GetSecretRef(std::string_view name) {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_, "SELECT reference FROM secrets_ref WHERE name = ?"));
  stmt.Bind(1, name);
  ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
  if (!has_row) return NotFoundError("no secret reference named " + Quoted(name));
  return stmt.Text(0);
}

}  // namespace llmctl::store
