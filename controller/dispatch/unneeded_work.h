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

#include "controller/store/store.h"

namespace llmctl::controller::dispatch {

// Work that is not running and that no launch has asked for in this long (its trial was
// cancelled, or placed elsewhere) is forgotten: a later launch asks the agent afresh.
inline constexpr std::chrono::minutes kForgetUnaskedAfter{10};

// Takes out of `kept` the work not running whose node was forgotten or that no launch asked for
// in kForgetUnaskedAfter, to be joined by JoinTakenWork. `Work` has `state` (running when
// Work::State::kRunning), `forgotten`, `asked_at` and `thread`. Called under the mutex that
// guards `kept`.
template <typename Key, typename Work>
std::vector<std::unique_ptr<Work>> TakeUnneededWork(std::map<Key, std::unique_ptr<Work>>& kept,
                                                    store::Time now) {
  std::vector<std::unique_ptr<Work>> taken;
  for (auto entry = kept.begin(); entry != kept.end();) {
    const Work& work = *entry->second;
    if (work.state != Work::State::kRunning &&
        (work.forgotten || now - work.asked_at >= kForgetUnaskedAfter)) {
      taken.push_back(std::move(entry->second));
      entry = kept.erase(entry);
    } else {
      ++entry;
    }
  }
  return taken;
}

// Joins the threads of work taken out of what is kept, and frees it. Called without the core's
// mutex: a thread that has finished its work may still be waking the round (Wake takes it).
template <typename Work>
void JoinTakenWork(std::vector<std::unique_ptr<Work>> taken) {
  for (const std::unique_ptr<Work>& work : taken) {
    if (work->thread.joinable()) work->thread.join();
  }
}

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_UNNEEDED_WORK_H_
