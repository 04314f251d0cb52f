// A version number that goes up on every change the controller makes to an experiment (ingested
// events, started or finished attempts, cancels), and a way to wait for the next one: what Watch
// streams follow.
#ifndef LLMCTL_CONTROLLER_CHANGE_NOTIFIER_H_
#define LLMCTL_CONTROLLER_CHANGE_NOTIFIER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace llmctl::controller {

// Thread-safe.
class ChangeNotifier {
 public:
  uint64_t version() const {
    std::lock_guard lock(mutex_);
    return version_;
  }
  void Notify() {
    {
      std::lock_guard lock(mutex_);
      ++version_;
    }
    changed_.notify_all();
  }
  // Returns the version once it differs from `seen`, or after `at_most` (real time: it bounds how
  // long a waiter goes without checking whether its caller is still there).
  uint64_t WaitForChange(uint64_t seen, std::chrono::milliseconds at_most) const {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, at_most, [&] { return version_ != seen; });
    return version_;
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  uint64_t version_ = 0;  // guarded by mutex_
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_CHANGE_NOTIFIER_H_
