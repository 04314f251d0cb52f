// The controller's seam to time: timeouts, backoff and requeueing read it, so tests move time by
// hand instead of sleeping.
#ifndef LLMCTL_CONTROLLER_CLOCK_H_
#define LLMCTL_CONTROLLER_CLOCK_H_

#include "common/mutex.h"
#include "controller/store/store.h"

namespace llmctl::controller {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual store::Time Now() const = 0;
};

class SystemClock : public Clock {
 public:
  store::Time Now() const override { return std::chrono::system_clock::now(); }
};

// Time that moves only when told to. Thread-safe.
class ManualClock : public Clock {
 public:
  explicit ManualClock(store::Time start) : now_(start) {}
  store::Time Now() const override LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return now_;
  }
  void Advance(std::chrono::milliseconds by) LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    now_ += by;
  }

 private:
  mutable Mutex mutex_;
  store::Time now_ LLMCTL_GUARDED_BY(mutex_);
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_CLOCK_H_
