// What store.cc shares with the store's other source files (device_samples.cc). Internal to
// controller/store/: not part of the store's API.
#ifndef LLMCTL_CONTROLLER_STORE_STORE_INTERNAL_H_
#define LLMCTL_CONTROLLER_STORE_STORE_INTERNAL_H_

#include <sqlite3.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/store/store.h"

namespace llmctl::store::internal {

// Times are stored as Unix milliseconds.
inline int64_t ToMillis(Time time) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
}
inline Time FromMillis(int64_t millis) { return Time(std::chrono::milliseconds(millis)); }

// OK when `attempt` is the trial's current attempt and was not declared lost: the fence that keeps
// a stale attempt from writing. FailedPrecondition naming why otherwise; NotFound for an unknown
// trial.
Status CheckCurrentAttempt(sqlite3* db, int64_t trial_id, int64_t attempt);

// The bodies of Store::StartAttempt and Store::FinishAttempt, inside the caller's transaction.
StatusOr<int64_t> InsertAttempt(sqlite3* db, int64_t trial_id, std::string_view node, Time now,
                                const std::vector<int64_t>& device_indices);
Status EndAttempt(sqlite3* db, int64_t trial_id, int64_t attempt, TrialState outcome,
                  std::optional<int64_t> exit_code, std::string_view error, Time now);

// FailedPrecondition when `node` has been removed (a placement that raced with RemoveNode).
Status CheckNodeNotRemoved(sqlite3* db, int64_t trial_id, std::string_view node);

// A stored device_indices_json: a JSON array of distinct non-negative integers; DataLoss otherwise.
StatusOr<std::vector<int64_t>> ParseStoredDeviceIndices(const std::string& text, int64_t trial_id,
                                                        int64_t attempt);

// A multi-node attempt's nodes in node-rank order (attempt_nodes.cc); empty for a single-node one.
StatusOr<std::vector<AttemptNode>> LoadAttemptNodes(sqlite3* db, int64_t trial_id, int64_t attempt);

}  // namespace llmctl::store::internal

#endif  // LLMCTL_CONTROLLER_STORE_STORE_INTERNAL_H_
