// What the dispatcher keeps of work a launch asks for by key and that runs on a thread of its own
// (an input delivery, a hub model's preparation): its state between the rounds that ask for it,
// until it is no longer needed.
#ifndef LLMCTL_CONTROLLER_DISPATCH_UNNEEDED_WORK_H_
#define LLMCTL_CONTROLLER_DISPATCH_UNNEEDED_WORK_H_

#include <chrono>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "controller/clock.h"

namespace llmctl::controller::dispatch {

// Work that is not running and that no launch has asked for in this long (its trial was
// cancelled, or placed elsewhere) is forgotten: a later launch asks the agent afresh.
inline constexpr std::chrono::minutes kForgetUnaskedAfter{10};

// Work taken out of what is kept, freed when this is destroyed, once its thread (which has
// finished its work) is joined. Declare it before the MutexLock it is filled under: that thread
// may still be waking the round (Wake takes the core's mutex).
template <typename Work>
class UnneededWork {
 public:
  UnneededWork() = default;
  UnneededWork(const UnneededWork&) = delete;
  UnneededWork& operator=(const UnneededWork&) = delete;
  ~UnneededWork() {
    for (const std::unique_ptr<Work>& work : taken_) {
      if (work->thread.joinable()) work->thread.join();
    }
  }

  void Add(std::unique_ptr<Work> work) { taken_.push_back(std::move(work)); }

 private:
  std::vector<std::unique_ptr<Work>> taken_;
};

// Moves into `unneeded` the work of `kept` not running whose node was forgotten or that no launch
// asked for in kForgetUnaskedAfter. `Work` has `state` (running when Work::State::kRunning),
// `forgotten`, `asked_at` and `thread`. Called under the mutex that guards `kept`.
template <typename Key, typename Work>
void TakeUnneededWork(std::map<Key, std::unique_ptr<Work>>& kept, MonotonicTime now,
                      UnneededWork<Work>& unneeded) {
  for (auto entry = kept.begin(); entry != kept.end();) {
    const Work& work = *entry->second;
    if (work.state != Work::State::kRunning &&
        (work.forgotten || now - work.asked_at >= kForgetUnaskedAfter)) {
      unneeded.Add(std::move(entry->second));
      entry = kept.erase(entry);
    } else {
      ++entry;
    }
  }
}

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_UNNEEDED_WORK_H_
