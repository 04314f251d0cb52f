// What store.cc shares with the store's other source files (device_samples.cc). Internal to
// controller/store/: not part of the store's API.
#ifndef LLMCTL_CONTROLLER_STORE_STORE_INTERNAL_H_
#define LLMCTL_CONTROLLER_STORE_STORE_INTERNAL_H_

#include <sqlite3.h>

#include <chrono>
#include <cstdint>

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

}  // namespace llmctl::store::internal

#endif  // LLMCTL_CONTROLLER_STORE_STORE_INTERNAL_H_
