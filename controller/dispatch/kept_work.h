// What the dispatcher's parts that keep work by node (an input delivery, a hub model's
// preparation: unneeded_work.h's `Work`, with its `node` and `context`, the call in flight or
// null) do alike when a node goes and when the dispatcher stops. All but JoinWork are called under
// the mutex that guards `kept`, as TakeUnneededWork is.
#ifndef LLMCTL_CONTROLLER_DISPATCH_KEPT_WORK_H_
#define LLMCTL_CONTROLLER_DISPATCH_KEPT_WORK_H_

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace llmctl::controller::dispatch {

// RemoveNode: marks the node's work forgotten (TakeUnneededWork drops it once it is not running)
// and cancels its call in flight.
template <typename Key, typename Work>
void ForgetNodesWork(std::map<Key, std::unique_ptr<Work>>& kept, const std::string& node) {
  for (auto& [key, work] : kept) {
    if (work->node != node) continue;
    work->forgotten = true;
    if (work->context != nullptr) work->context->TryCancel();
  }
}

// How many of `kept` are running.
template <typename Key, typename Work>
int RunningWork(const std::map<Key, std::unique_ptr<Work>>& kept) {
  return static_cast<int>(std::count_if(kept.begin(), kept.end(), [](const auto& entry) {
    return entry.second->state == Work::State::kRunning;
  }));
}

// Stop: cancels every call in flight and returns all the work, whose threads the caller joins
// (JoinWork) once it has let the mutex go: a thread ends by taking it. The pointers stay valid:
// work is erased only on the round thread, which has ended before Stop.
template <typename Key, typename Work>
std::vector<Work*> CancelAllWork(const std::map<Key, std::unique_ptr<Work>>& kept) {
  std::vector<Work*> all;
  for (const auto& [key, work] : kept) {
    if (work->context != nullptr) work->context->TryCancel();
    all.push_back(work.get());
  }
  return all;
}

// Waits for the threads of CancelAllWork's work; called without the mutex.
template <typename Work>
void JoinWork(const std::vector<Work*>& all) {
  for (Work* work : all) {
    if (work->thread.joinable()) work->thread.join();
  }
}

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_KEPT_WORK_H_
