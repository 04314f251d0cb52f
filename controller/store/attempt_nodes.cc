// Multi-node attempts (the attempt_nodes table, schema.cc): starting one on all its nodes at once,
// and ending it once every node's run has ended.
#include <sqlite3.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/text.h"
#include "controller/store/sqlite.h"
#include "controller/store/store.h"
#include "controller/store/store_internal.h"

namespace llmctl::store {
namespace {

using internal::AttemptLabel;
using sqlite::Statement;
using sqlite::Transaction;

// A node's run as it ended.
struct NodeEnd {
  int64_t node_rank = 0;
  std::string node;
  // Unix ms when the controller recorded the end, never before an end of the attempt recorded
  // earlier; nullopt while it runs.
  std::optional<int64_t> ended_at;
  std::optional<std::string> outcome;
  std::optional<int64_t> exit_code;
  std::string error;
};

StatusOr<std::vector<NodeEnd>> LoadNodeEnds(sqlite3* db, int64_t trial_id, int64_t attempt) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "SELECT node_rank, node, ended_at, outcome, exit_code, error "
                                      "FROM attempt_nodes WHERE trial_id = ? AND attempt = ? "
                                      "ORDER BY node_rank"));
  stmt.Bind(1, trial_id).Bind(2, attempt);
  std::vector<NodeEnd> ends;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    ends.push_back({.node_rank = stmt.Int(0),
                    .node = stmt.Text(1),
                    .ended_at = stmt.OptionalInt(2),
                    .outcome = stmt.OptionalText(3),
                    .exit_code = stmt.OptionalInt(4),
                    .error = stmt.Text(5)});
  }
  return ends;
}

// The node end that explains the attempt's end (Store::FinishAttemptNode's rule), and the outcome.
std::pair<const NodeEnd*, TrialState> DecidingEnd(const std::vector<NodeEnd>& ends,
                                                  bool cancel_requested) {
  std::vector<const NodeEnd*> in_order;
  for (const NodeEnd& end : ends) in_order.push_back(&end);
  std::stable_sort(in_order.begin(), in_order.end(), [](const NodeEnd* a, const NodeEnd* b) {
    return a->ended_at.value_or(0) < b->ended_at.value_or(0);
  });
  const auto first = [&](std::initializer_list<std::string_view> outcomes) -> const NodeEnd* {
    for (const NodeEnd* end : in_order) {
      for (std::string_view outcome : outcomes) {
        if (end->outcome == outcome) return end;
      }
    }
    return nullptr;
  };
  if (const NodeEnd* own = first({"oom", "diverged"})) {
    return {own, *ParseTrialState(*own->outcome)};
  }
  if (cancel_requested) {
    const NodeEnd* cancelled = first({"cancelled"});
    return {cancelled != nullptr ? cancelled : in_order.front(), TrialState::kCancelled};
  }
  if (const NodeEnd* failed = first({"failed"})) return {failed, TrialState::kFailed};
  if (const NodeEnd* cancelled = first({"cancelled"})) return {cancelled, TrialState::kCancelled};
  return {&ends.front(), TrialState::kOk};  // node rank 0's
}

}  // namespace

StatusOr<std::vector<AttemptNode>> internal::LoadAttemptNodes(sqlite3* db, int64_t trial_id,
                                                              int64_t attempt) {
  ASSIGN_OR_RETURN(Statement stmt,
                   Statement::Prepare(db,
                                      "SELECT node_rank, node, device_indices_json, "
                                      "ended_at IS NOT NULL FROM attempt_nodes "
                                      "WHERE trial_id = ? AND attempt = ? ORDER BY node_rank"));
  stmt.Bind(1, trial_id).Bind(2, attempt);
  std::vector<AttemptNode> nodes;
  while (true) {
    ASSIGN_OR_RETURN(const bool has_row, stmt.Step());
    if (!has_row) break;
    AttemptNode& node = nodes.emplace_back();
    node.node_rank = stmt.Int(0);
    node.node = stmt.Text(1);
    ASSIGN_OR_RETURN(node.device_indices,
                     ParseStoredDeviceIndices(stmt.Text(2), trial_id, attempt));
    node.ended = stmt.Int(3) != 0;
  }
  return nodes;
}

StatusOr<int64_t> Store::StartMultiNodeAttempt(int64_t trial_id,
                                               const std::vector<AttemptNode>& nodes, Time now) {
  const std::string starting = "starting trial " + std::to_string(trial_id) + " on several nodes";
  if (nodes.size() < 2) {
    return InvalidArgumentError(starting + ": a multi-node attempt needs at least 2 nodes, got " +
                                std::to_string(nodes.size()));
  }
  std::set<std::string> names;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].node_rank != static_cast<int64_t>(i)) {
      return InvalidArgumentError(starting + ": node " + std::to_string(i) + " has node rank " +
                                  std::to_string(nodes[i].node_rank) + "; they go in rank order");
    }
    if (nodes[i].node.empty() || !names.insert(nodes[i].node).second) {
      return InvalidArgumentError(starting + ": node rank " + std::to_string(i) + "'s node '" +
                                  nodes[i].node + "' is empty or repeated");
    }
  }
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  ASSIGN_OR_RETURN(const int64_t attempt, internal::InsertAttempt(db_, trial_id, nodes[0].node, now,
                                                                  nodes[0].device_indices));
  ASSIGN_OR_RETURN(Statement insert,
                   Statement::Prepare(db_,
                                      "INSERT INTO attempt_nodes (trial_id, attempt, node_rank, "
                                      "node, device_indices_json) VALUES (?, ?, ?, ?, ?)"));
  for (const AttemptNode& node : nodes) {
    RETURN_IF_ERROR(internal::CheckNodeNotRemoved(db_, trial_id, node.node));
    std::vector<int64_t> sorted = node.device_indices;
    std::sort(sorted.begin(), sorted.end());
    if ((!sorted.empty() && sorted.front() < 0) ||
        std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return InvalidArgumentError(starting + ": node " + node.node + "'s device indices " +
                                  nlohmann::json(node.device_indices).dump() +
                                  " must be distinct and >= 0");
    }
    insert.Reset();
    insert.Bind(1, trial_id)
        .Bind(2, attempt)
        .Bind(3, node.node_rank)
        .Bind(4, node.node)
        .Bind(5, nlohmann::json(sorted).dump());
    RETURN_IF_ERROR(insert.Run());
  }
  RETURN_IF_ERROR(txn.Commit());
  return attempt;
}

StatusOr<std::optional<TrialState>> Store::FinishAttemptNode(int64_t trial_id, int64_t attempt,
                                                             int64_t node_rank, TrialState outcome,
                                                             std::optional<int64_t> exit_code,
                                                             std::string_view error, Time now) {
  if (!IsOutcome(outcome)) {
    return InvalidArgumentError("ending node rank " + std::to_string(node_rank) + " of " +
                                AttemptLabel(trial_id, attempt) + ": " +
                                std::string(TrialStateName(outcome)) + " is not an outcome");
  }
  const std::string outcome_name(TrialStateName(outcome));
  const std::string kept_error = OnOneLine(error, kMaxErrorBytes);
  MutexLock lock(mutex_);
  ASSIGN_OR_RETURN(Transaction txn, Transaction::Begin(db_));
  RETURN_IF_ERROR(internal::CheckCurrentAttempt(db_, trial_id, attempt));
  ASSIGN_OR_RETURN(std::vector<NodeEnd> ends, LoadNodeEnds(db_, trial_id, attempt));
  auto mine = std::find_if(ends.begin(), ends.end(),
                           [&](const NodeEnd& end) { return end.node_rank == node_rank; });
  if (mine == ends.end()) {
    return NotFoundError(AttemptLabel(trial_id, attempt) + " has no node rank " +
                         std::to_string(node_rank));
  }
  if (mine->ended_at) {
    if (mine->outcome != outcome_name || mine->exit_code != exit_code ||
        mine->error != kept_error) {
      return FailedPreconditionError("node rank " + std::to_string(node_rank) + " of " +
                                     AttemptLabel(trial_id, attempt) + " already ended as " +
                                     mine->outcome.value_or("?") +
                                     "; refusing to end it again as " + outcome_name);
    }
  } else {
    // The order of the ends, which decides the outcome, is the order they were recorded in: a
    // step of the controller's wall clock back between two ends must not put the later first.
    int64_t ended_at = internal::ToMillis(now);
    for (const NodeEnd& end : ends) {
      if (end.ended_at) ended_at = std::max(ended_at, *end.ended_at + 1);
    }
    ASSIGN_OR_RETURN(Statement end,
                     Statement::Prepare(db_,
                                        "UPDATE attempt_nodes SET ended_at = ?, outcome = ?, "
                                        "exit_code = ?, error = ? WHERE trial_id = ? AND "
                                        "attempt = ? AND node_rank = ?"));
    end.Bind(1, ended_at)
        .Bind(2, outcome_name)
        .BindOptional(3, exit_code)
        .Bind(4, kept_error)
        .Bind(5, trial_id)
        .Bind(6, attempt)
        .Bind(7, node_rank);
    RETURN_IF_ERROR(end.Run());
    mine->ended_at = ended_at;
    mine->outcome = outcome_name;
    mine->exit_code = exit_code;
    mine->error = kept_error;
  }
  if (std::any_of(ends.begin(), ends.end(), [](const NodeEnd& end) { return !end.ended_at; })) {
    RETURN_IF_ERROR(txn.Commit());
    return std::optional<TrialState>();
  }
  ASSIGN_OR_RETURN(Statement cancel,
                   Statement::Prepare(db_, "SELECT cancel_requested FROM trials WHERE id = ?"));
  cancel.Bind(1, trial_id);
  ASSIGN_OR_RETURN(const bool has_trial, cancel.Step());
  const bool cancel_requested = has_trial && cancel.Int(0) != 0;
  const auto [deciding, combined] = DecidingEnd(ends, cancel_requested);
  std::string combined_error;
  if (!deciding->error.empty()) {
    combined_error = "node " + deciding->node + " (node rank " +
                     std::to_string(deciding->node_rank) + " of " + std::to_string(ends.size()) +
                     "): " + deciding->error;
  }
  // Ending it again with the same words is OK: a repeated last node end lands here too.
  RETURN_IF_ERROR(internal::EndAttempt(db_, trial_id, attempt, combined, deciding->exit_code,
                                       combined_error, now));
  RETURN_IF_ERROR(txn.Commit());
  return std::optional<TrialState>(combined);
}

}  // namespace llmctl::store
