// What the store's source files share (store.cc, experiments.cc, attempts.cc, events.cc,
// attempt_nodes.cc, device_samples.cc, node_registry.cc, report_queries.cc). Internal to
// controller/store/: not part of the store's API.
#ifndef LLMCTL_CONTROLLER_STORE_STORE_INTERNAL_H_
#define LLMCTL_CONTROLLER_STORE_STORE_INTERNAL_H_

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/store/records.h"

namespace llmctl::store::internal {

// Times are stored as Unix milliseconds.
inline int64_t ToMillis(Time time) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
}
inline Time FromMillis(int64_t millis) { return Time(std::chrono::milliseconds(millis)); }

// `text` in single quotes, as the store's messages name things.
inline std::string Quoted(std::string_view text) {
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) about "'" + std::string(text).
  std::string quoted = "'";
  quoted.append(text);
  quoted.push_back('\'');
  return quoted;
}

// "trial 7", as the store's messages name a trial.
inline std::string TrialLabel(int64_t trial_id) { return "trial " + std::to_string(trial_id); }
// "attempt 2 of trial 7".
inline std::string AttemptLabel(int64_t trial_id, int64_t attempt) {
  return "attempt " + std::to_string(attempt) + " of " + TrialLabel(trial_id);
}

// A stored JSON text, parsed; DataLoss naming `what` when it is not JSON.
inline StatusOr<nlohmann::json> ParseStoredJson(const std::string& text, std::string_view what) {
  nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return DataLossError("stored " + std::string(what) + " is not JSON");
  return value;
}

// A stored trial state; DataLoss when it is not one.
StatusOr<TrialState> StoredTrialState(std::string_view name);

// The experiment's row; NotFound for an unknown experiment.
StatusOr<ExperimentRecord> LoadExperiment(sqlite3* db, int64_t experiment_id);

// The trial's row; NotFound for an unknown trial.
StatusOr<TrialRecord> LoadTrial(sqlite3* db, int64_t trial_id);

// Sets the experiment done when none of its trials is queued or running, else active.
Status RefreshExperimentState(sqlite3* db, int64_t experiment_id);

// The latest event of `type` in one attempt, parsed; null when it has none.
StatusOr<nlohmann::json> LatestEventOfType(sqlite3* db, int64_t trial_id, int64_t attempt,
                                           std::string_view type);

// OK when `attempt` is the trial's current attempt and was not declared lost: the fence that keeps
// a stale attempt from writing. FailedPrecondition naming why otherwise; NotFound for an unknown
// trial.
Status CheckCurrentAttempt(sqlite3* db, int64_t trial_id, int64_t attempt);

// The bodies of Store::StartAttempt and Store::FinishAttempt, inside the caller's transaction.
StatusOr<int64_t> InsertAttempt(sqlite3* db, int64_t trial_id, std::string_view node, Time now,
                                const std::vector<int64_t>& device_indices);
Status EndAttempt(sqlite3* db, int64_t trial_id, int64_t attempt, TrialState outcome,
                  std::optional<int64_t> exit_code, std::string_view error, Time now);

// Declares the trial's current, running attempt lost, inside the caller's transaction: the one
// rule behind MarkAttemptLost (a silent agent, an agent that lost its run) and RemoveNode. The
// trial is queued again, or cancelled when a cancel was requested while it ran.
Status LoseAttempt(sqlite3* db, int64_t trial_id, int64_t attempt, Time now);

// The running attempts, in trial order, of the trials that `trial_filter` ("AND t.id = ?", its
// parameter `bound`; empty for all) selects.
StatusOr<std::vector<RunningAttempt>> QueryRunningAttempts(sqlite3* db,
                                                           const std::string& trial_filter,
                                                           std::optional<int64_t> bound);

// FailedPrecondition when `node` has been removed (a placement that raced with RemoveNode).
Status CheckNodeNotRemoved(sqlite3* db, int64_t trial_id, std::string_view node);

// The node's removal time: nullopt while it is registered, NotFound when no row has its name.
StatusOr<std::optional<Time>> LoadNodeRemovedAt(sqlite3* db, std::string_view node);

// A stored device_indices_json: a JSON array of distinct non-negative integers; DataLoss otherwise.
StatusOr<std::vector<int64_t>> ParseStoredDeviceIndices(const std::string& text, int64_t trial_id,
                                                        int64_t attempt);

// A multi-node attempt's nodes in node-rank order (attempt_nodes.cc); empty for a single-node one.
StatusOr<std::vector<AttemptNode>> LoadAttemptNodes(sqlite3* db, int64_t trial_id, int64_t attempt);

}  // namespace llmctl::store::internal

#endif  // LLMCTL_CONTROLLER_STORE_STORE_INTERNAL_H_
