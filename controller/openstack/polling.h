// The two patterns every cloud resource here shares: polling a state until it settles (on the
// injectable CloudClock), and creating a named resource at most once although a create may time
// out.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_POLLING_H_
#define LLMCTL_CONTROLLER_OPENSTACK_POLLING_H_

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"
#include "controller/openstack/cloud_clock.h"

namespace llmctl::openstack {

// Calls `probe` every `interval` until it returns a value or an error. DeadlineExceeded saying
// "<what> after <timeout>" once `timeout` has passed on `clock`'s time since boot (a step of the
// wall clock moves no deadline).
template <typename T>
StatusOr<T> PollUntil(CloudClock& clock, std::chrono::seconds interval,
                      std::chrono::seconds timeout, const std::string& what,
                      const std::function<StatusOr<std::optional<T>>()>& probe) {
  const std::chrono::milliseconds deadline = clock.SinceBoot() + timeout;
  while (true) {
    ASSIGN_OR_RETURN(std::optional<T> done, probe());
    if (done.has_value()) return *std::move(done);
    if (clock.SinceBoot() >= deadline) {
      return Status(StatusCode::kDeadlineExceeded,
                    what + " after " + std::to_string(timeout.count()) + " s");
    }
    clock.SleepFor(interval);
  }
}

// Whether a failed create may have happened anyway on the server (a timeout, a lost connection,
// a 5xx), so the resource must be looked up before anything is sent again.
inline bool CreateMayHaveHappened(const Status& status) {
  return status.code() == StatusCode::kUnavailable ||
         status.code() == StatusCode::kDeadlineExceeded;
}

struct CreateRetry {
  int attempts = 3;  // creates sent at most, each after a lookup by name found nothing
  std::chrono::milliseconds delay{std::chrono::seconds(2)};
};

// The resource `find` finds by its deterministic name, else the one `create` makes. A create
// that may have happened is never re-sent blindly: `find` runs again first.
template <typename T>
StatusOr<T> FindOrCreate(CloudClock& clock, const CreateRetry& retry,
                         const std::function<StatusOr<std::optional<T>>()>& find,
                         const std::function<StatusOr<T>()>& create) {
  Status last;
  for (int attempt = 1; attempt <= retry.attempts; ++attempt) {
    ASSIGN_OR_RETURN(std::optional<T> existing, find());
    if (existing.has_value()) return *std::move(existing);
    StatusOr<T> created = create();
    if (created.ok() || !CreateMayHaveHappened(created.status())) return created;
    last = created.status();
    clock.SleepFor(retry.delay);
  }
  // The last create may still have happened: one more look before giving up.
  ASSIGN_OR_RETURN(std::optional<T> existing, find());
  if (existing.has_value()) return *std::move(existing);
  return last;
}

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_POLLING_H_
