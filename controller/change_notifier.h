// A version number that goes up on every change the controller makes to an experiment (ingested
// events, started or finished attempts, cancels), and a way to wait for the next one: what Watch
// streams follow.
#ifndef LLMCTL_CONTROLLER_CHANGE_NOTIFIER_H_
#define LLMCTL_CONTROLLER_CHANGE_NOTIFIER_H_

#include <chrono>
#include <cstdint>
#include <thread>

#include "common/mutex.h"

namespace llmctl::controller {

// Thread-safe.
class ChangeNotifier {
 public:
  uint64_t version() const LLMCTL_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return version_;
  }
  void Notify() LLMCTL_EXCLUDES(mutex_) {
    {
      MutexLock lock(mutex_);
      ++version_;
    }
    changed_.NotifyAll();
  }
  // Returns the version once it differs from `seen`, or after `at_most` (real time: it bounds how
  // long a waiter goes without checking whether its caller is still there).
  uint64_t WaitForChange(uint64_t seen, std::chrono::milliseconds at_most) const
      LLMCTL_EXCLUDES(mutex_) {
    const auto deadline = std::chrono::steady_clock::now() + at_most;
    MutexLock lock(mutex_);
    while (version_ == seen && changed_.WaitUntil(mutex_, deadline)) {
    }
    return version_;
  }
  // WaitForChange, then no return before `not_before`: a follower that rebuilds its whole view on
  // each change and paces itself so takes the changes of that interval at once.
  uint64_t WaitForChangeNotBefore(uint64_t seen, std::chrono::milliseconds at_most,
                                  std::chrono::steady_clock::time_point not_before) const
      LLMCTL_EXCLUDES(mutex_) {
    WaitForChange(seen, at_most);
    std::this_thread::sleep_until(not_before);
    return version();
  }

 private:
  mutable Mutex mutex_;
  mutable CondVar changed_;
  uint64_t version_ LLMCTL_GUARDED_BY(mutex_) = 0;
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_CHANGE_NOTIFIER_H_
