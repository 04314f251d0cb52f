#include "controller/dispatch/dispatcher_core.h"

#include <algorithm>

namespace llmctl::controller::dispatch {

std::string AttemptName(int64_t trial_id, int64_t attempt) {
  return "trial " + std::to_string(trial_id) + " attempt " + std::to_string(attempt);
}

std::string AttemptName(const store::RunningAttempt& attempt) {
  return AttemptName(attempt.trial_id, attempt.attempt);
}

std::chrono::milliseconds NextBackoff(std::chrono::milliseconds backoff,
                                      std::chrono::milliseconds initial,
                                      std::chrono::milliseconds max) {
  return backoff.count() == 0 ? initial : std::min(backoff * 2, max);
}

void DispatcherCore::Wake() {
  {
    MutexLock lock(mutex);
    wake_requested = true;
  }
  wake.NotifyAll();
}

bool DispatcherCore::Stopping() {
  MutexLock lock(mutex);
  return stopping;
}

std::unique_ptr<grpc::ClientContext> DispatcherCore::CallContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + options.call_deadline);
  return context;
}

}  // namespace llmctl::controller::dispatch
