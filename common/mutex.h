// A mutex clang's -Wthread-safety can follow (common/thread_annotations.h): std::mutex under a
// capability, a scoped lock, and a condition variable whose waits keep the lock held as far as
// the analysis sees, so a wait's condition is checked in the caller's own code:
//
//   MutexLock lock(mutex_);
//   while (!done_) changed_.Wait(mutex_);  // done_ is LLMCTL_GUARDED_BY(mutex_)
#ifndef LLMCTL_COMMON_MUTEX_H_
#define LLMCTL_COMMON_MUTEX_H_

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace llmctl {

class LLMCTL_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() LLMCTL_ACQUIRE() { mutex_.lock(); }
  void unlock() LLMCTL_RELEASE() { mutex_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mutex_;
};

// Holds `mutex` from construction to destruction, or to Unlock.
class LLMCTL_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) LLMCTL_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() LLMCTL_RELEASE() {
    if (held_) mutex_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Lets go early, for work that must not hold the lock after the guarded part.
  void Unlock() LLMCTL_RELEASE() {
    mutex_.unlock();
    held_ = false;
  }

 private:
  Mutex& mutex_;
  bool held_ = true;
};

// std::condition_variable on a Mutex. Each wait releases the mutex while it sleeps and
// holds it again on return, and may return without a notification: callers loop on their
// condition.
class CondVar {
 public:
  void NotifyOne() { changed_.notify_one(); }
  void NotifyAll() { changed_.notify_all(); }

  void Wait(Mutex& mutex) LLMCTL_REQUIRES(mutex) {
    std::unique_lock<std::mutex> lock(mutex.mutex_, std::adopt_lock);
    changed_.wait(lock);
    lock.release();  // still held: the caller's MutexLock unlocks it
  }

  // False once `deadline` has passed.
  template <typename Clock, typename Duration>
  bool WaitUntil(Mutex& mutex, const std::chrono::time_point<Clock, Duration>& deadline)
      LLMCTL_REQUIRES(mutex) {
    std::unique_lock<std::mutex> lock(mutex.mutex_, std::adopt_lock);
    const std::cv_status status = changed_.wait_until(lock, deadline);
    lock.release();
    return status == std::cv_status::no_timeout;
  }

 private:
  std::condition_variable changed_;
};

}  // namespace llmctl

#endif  // LLMCTL_COMMON_MUTEX_H_
