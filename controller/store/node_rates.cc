// Each node's own rates (the node_rates table, schema.cc): the probe its agent measured
// (llm-train --probe's JSON), stored as the controller received it, one per node.
#include <sqlite3.h>

#include <nlohmann/json.hpp>

#include "common/foreign_json.h"
#include "controller/store/sqlite.h"
#include "controller/store/store.h"
#include "controller/store/store_internal.h"

namespace llmctl::store {

using sqlite::Statement;

StatusOr<bool> Store::PutNodeRates(std::string_view node, std::string_view probe_json, Time now) {
  if (node.empty()) return InvalidArgumentError("node rates need a node name");
  if (!ParseForeignJson(probe_json).is_object()) {
    return InvalidArgumentError("node " + internal::Quoted(node) +
                                ": its rates are not a JSON object");
  }
  MutexLock lock(mutex_);
  // The same text again changes nothing: the agent reports its probe with every health check.
  ASSIGN_OR_RETURN(
      Statement stmt,
      Statement::Prepare(db_,
                         "INSERT INTO node_rates (node, probe_json, stored_at) "
                         "VALUES (?, ?, ?) ON CONFLICT (node) DO UPDATE SET "
                         "probe_json = excluded.probe_json, stored_at = "
                         "excluded.stored_at WHERE probe_json != excluded.probe_json"));
  stmt.Bind(1, node).Bind(2, probe_json).Bind(3, internal::ToMillis(now));
  RETURN_IF_ERROR(stmt.Run());
  return sqlite3_changes(db_) > 0;
}

StatusOr<std::map<std::string, std::string>> Store::NodeRates() {
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db_,
                                      "SELECT r.node, r.probe_json FROM node_rates r JOIN nodes n "
                                      "ON n.name = r.node WHERE n.removed_at IS NULL"));
  std::map<std::string, std::string> rates;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    rates.emplace(stmt.Text(0), stmt.Text(1));
  }
  return rates;
}

}  // namespace llmctl::store
