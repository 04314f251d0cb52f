// Deadlines for streaming transfers (blob uploads, artifact downloads), shared by the CLI and the
// controller so that both ends of a hop give a large transfer the same time.
//
// A fixed call deadline cannot fit both a 1 KiB tokenizer and a 26 GB 13B model directory. An
// upload whose size is known gets base + bytes / min_rate: it fails only when the link is slower
// than min_rate. A download whose size is not known up front (artifacts, listed by the agent as
// they are sent) gets no call deadline but an idle limit: it is cancelled when no message arrives
// for that long, however long the whole transfer takes.
#ifndef LLMCTL_RPC_TRANSFER_H_
#define LLMCTL_RPC_TRANSFER_H_

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <chrono>
#include <cstdint>
#include <string_view>
#include <thread>

#include "common/mutex.h"
#include "common/status.h"

namespace llmctl::rpc {

// The slowest link a transfer is expected to survive: 10 MiB/s uploads a 26 GB model directory in
// about 41 minutes. Slower links set it lower (llmctld: min_transfer_rate).
inline constexpr int64_t kDefaultMinTransferBytesPerSecond = int64_t{10} << 20;

// How long a streaming call carrying `bytes` may take: `base` (the fixed per-call allowance, for
// connection setup and the receiver's final checks) plus the time `bytes` take at
// `min_bytes_per_second`, rounded up to the millisecond. Negative `bytes` count as 0; a
// `min_bytes_per_second` below 1 counts as 1. Saturates instead of overflowing.
std::chrono::milliseconds TransferDeadline(std::chrono::milliseconds base, int64_t bytes,
                                           int64_t min_bytes_per_second);

// Cancels `context`'s call when Progress() has not been called for `idle` (the first window starts
// at construction). For streams whose total size is unknown. Destroy it before `context`.
// Thread-safe.
class IdleCanceller {
 public:
  IdleCanceller(grpc::ClientContext& context, std::chrono::milliseconds idle);
  ~IdleCanceller();
  IdleCanceller(const IdleCanceller&) = delete;
  IdleCanceller& operator=(const IdleCanceller&) = delete;

  // A message arrived: the idle window starts again.
  void Progress();

  // The call's final status, with CANCELLED replaced by DeadlineExceeded naming `what` and the
  // idle limit when this canceller ended the call.
  Status Explain(const grpc::Status& finished, std::string_view what) const;

 private:
  void Watch();

  grpc::ClientContext& context_;
  const std::chrono::milliseconds idle_;
  mutable Mutex mutex_;
  CondVar changed_;
  std::chrono::steady_clock::time_point last_progress_ LLMCTL_GUARDED_BY(mutex_);
  bool stopping_ LLMCTL_GUARDED_BY(mutex_) = false;
  bool fired_ LLMCTL_GUARDED_BY(mutex_) = false;
  std::thread watcher_;  // last: starts after the state above
};

}  // namespace llmctl::rpc

#endif  // LLMCTL_RPC_TRANSFER_H_
