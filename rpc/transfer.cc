#include "rpc/transfer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "rpc/grpc_status.h"

namespace llmctl::rpc {

std::chrono::milliseconds TransferDeadline(std::chrono::milliseconds base, int64_t bytes,
                                           int64_t min_bytes_per_second) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t rate = std::max<int64_t>(min_bytes_per_second, 1);
  const int64_t sent = std::max<int64_t>(bytes, 0);
  // ceil(sent * 1000 / rate) without computing sent * 1000, which can overflow: whole seconds,
  // then the remainder's milliseconds (at most 1000, exact enough in a double).
  const int64_t whole_seconds = sent / rate;
  const auto rest_ms = static_cast<int64_t>(
      std::ceil(static_cast<double>(sent % rate) * 1000.0 / static_cast<double>(rate)));
  if (whole_seconds > (kMax - rest_ms) / 1000) return std::chrono::milliseconds::max();
  const int64_t transfer_ms = whole_seconds * 1000 + rest_ms;
  if (base.count() > kMax - transfer_ms) return std::chrono::milliseconds::max();
  return base + std::chrono::milliseconds(transfer_ms);
}

IdleCanceller::IdleCanceller(grpc::ClientContext& context, std::chrono::milliseconds idle)
    : context_(context),
      idle_(idle),
      last_progress_(std::chrono::steady_clock::now()),
      watcher_([this] { Watch(); }) {}

IdleCanceller::~IdleCanceller() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  changed_.NotifyAll();
  watcher_.join();
}

void IdleCanceller::Progress() {
  MutexLock lock(mutex_);
  last_progress_ = std::chrono::steady_clock::now();
}

void IdleCanceller::Watch() {
  MutexLock lock(mutex_);
  while (!stopping_) {
    const auto due = last_progress_ + idle_;
    if (std::chrono::steady_clock::now() >= due) {
      fired_ = true;
      context_.TryCancel();
      return;
    }
    changed_.WaitUntil(mutex_, due);
  }
}

Status IdleCanceller::Explain(const grpc::Status& finished, std::string_view what) const {
  MutexLock lock(mutex_);
  if (fired_ && finished.error_code() == grpc::StatusCode::CANCELLED) {
    return Status(StatusCode::kDeadlineExceeded, std::string(what) + ": nothing arrived for " +
                                                     std::to_string(idle_.count()) +
                                                     " ms; the transfer was abandoned");
  }
  return FromGrpcStatus(finished);
}

}  // namespace llmctl::rpc
