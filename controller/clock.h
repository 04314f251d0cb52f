// The controller's seam to time: timeouts, backoff and requeueing read it, so tests move time by
// hand instead of sleeping.
#ifndef LLMCTL_CONTROLLER_CLOCK_H_
#define LLMCTL_CONTROLLER_CLOCK_H_

#include <chrono>

#include "common/mutex.h"
#include "controller/store/records.h"

namespace llmctl::controller {

// A reading of the monotonic clock. Timers, backoffs and silences are reckoned on it: chrony or
// NTP stepping the wall clock (minutes on a node that booted with a wrong one) moves none of them.
// It does not count a suspend, when the controller hears nothing either.
using MonotonicTime = std::chrono::steady_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  // The wall clock: for what is stored or shown to people (records, lease ends, certificates).
  virtual store::Time Now() const = 0;
  // For how long something waited or stayed silent.
  virtual MonotonicTime Monotonic() const = 0;
};

class SystemClock : public Clock {
 public:
  store::Time Now() const override { return std::chrono::system_clock::now(); }
  MonotonicTime Monotonic() const override { return std::chrono::steady_clock::now(); }
};

// Time that moves only when told to. Thread-safe.
class ManualClock : public Clock {
 public:
  explicit ManualClock(store::Time start) : now_(start) {}
  store::Time Now() const override LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return now_;
  }
  MonotonicTime Monotonic() const override LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return monotonic_;
  }
  // Time passing: both clocks move.
  void Advance(std::chrono::milliseconds by) LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    now_ += by;
    monotonic_ += by;
  }
  // The wall clock stepped (NTP), forward or back: the monotonic clock stays.
  void StepWallClock(std::chrono::milliseconds by) LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    now_ += by;
  }

 private:
  mutable Mutex mutex_;
  store::Time now_ LLMCTL_GUARDED_BY(mutex_);
  MonotonicTime monotonic_ LLMCTL_GUARDED_BY(mutex_);
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_CLOCK_H_
