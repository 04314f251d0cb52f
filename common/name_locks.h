// Locks by name: holders of different names run side by side, holders of one name one at a time.
// For a check-then-change on one named thing that may take long (the controller's registration
// and enrollment of a node, whose enrollment dials the node for up to 20 s), where one Mutex
// would make every other name wait behind the slowest.
//
//   const NameLocks::Held held = locks_.Lock(node);  // until `held` goes
//
// Clang's thread-safety analysis cannot follow a lock per name: what it guards says so in a
// comment.
#ifndef LLMCTL_COMMON_NAME_LOCKS_H_
#define LLMCTL_COMMON_NAME_LOCKS_H_

#include <set>
#include <string>

#include "common/mutex.h"

namespace llmctl {

class NameLocks {
 public:
  // `name`'s lock, from Lock to its destruction. Move-only.
  class [[nodiscard]] Held {
   public:
    Held(Held&& other) noexcept : locks_(other.locks_), name_(std::move(other.name_)) {
      other.locks_ = nullptr;
    }
    Held& operator=(Held&&) = delete;
    Held(const Held&) = delete;
    ~Held() {
      if (locks_ != nullptr) locks_->Release(name_);
    }

   private:
    friend class NameLocks;
    Held(NameLocks* locks, std::string name) : locks_(locks), name_(std::move(name)) {}

    NameLocks* locks_;
    std::string name_;
  };

  NameLocks() = default;
  NameLocks(const NameLocks&) = delete;
  NameLocks& operator=(const NameLocks&) = delete;

  // Waits until no one holds `name`, then holds it.
  Held Lock(const std::string& name) {
    MutexLock lock(mutex_);
    while (held_.contains(name)) released_.Wait(mutex_);
    held_.insert(name);
    return Held(this, name);
  }

 private:
  void Release(const std::string& name) {
    MutexLock lock(mutex_);
    held_.erase(name);
    released_.NotifyAll();
  }

  Mutex mutex_;
  CondVar released_;
  std::set<std::string> held_ LLMCTL_GUARDED_BY(mutex_);
};

}  // namespace llmctl

#endif  // LLMCTL_COMMON_NAME_LOCKS_H_
