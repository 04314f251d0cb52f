// What every part of the dispatcher shares: the store, blobs, clock and change notifier it was
// given, its options, and one lock. The parts (agent_links.h, placement.h, launcher.h,
// hub_preparation.h, lease_watch.h, event_streams.h, cancellation.h, checkpoint_copy.h,
// artifacts.h) each own their own state but guard it with this one mutex, as the dispatcher did
// before it was split: a round looks at several parts at once (placement reads the links and the
// lease notices together), and Dispatcher::Stop's `stopping` flag ends the parts' threads.
#ifndef LLMCTL_CONTROLLER_DISPATCH_DISPATCHER_CORE_H_
#define LLMCTL_CONTROLLER_DISPATCH_DISPATCHER_CORE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/mutex.h"
#include "common/status.h"
#include "controller/blob_store.h"
#include "controller/change_notifier.h"
#include "controller/clock.h"
#include "controller/store/store.h"
#include "controller/store/stored_config.h"
#include "rpc/transfer.h"

namespace llmctl::controller {

class NodeCertificates;

struct DispatcherOptions {
  std::chrono::milliseconds requeue_after = std::chrono::minutes(10);
  // Deadline of each unary call; a blob upload gets it plus its size at
  // min_transfer_bytes_per_second (rpc::TransferDeadline), and an artifact download is abandoned
  // when no chunk arrives for this long.
  std::chrono::milliseconds call_deadline = std::chrono::seconds(30);
  int64_t min_transfer_bytes_per_second = rpc::kDefaultMinTransferBytesPerSecond;
  std::chrono::milliseconds health_interval = std::chrono::seconds(5);
  // How long a round waits for the health check of a node whose last check failed before it goes
  // on without it: an agent that never answers, or a node that went down, would hold every round
  // (and placement on the live nodes) for call_deadline. The check goes on, on its own thread, to
  // its deadline, and wakes the round when the node answers.
  std::chrono::milliseconds failing_check_wait = std::chrono::seconds(2);
  std::chrono::milliseconds backoff_initial = std::chrono::seconds(1);
  std::chrono::milliseconds backoff_max = std::chrono::seconds(30);
  int64_t upload_chunk_bytes = 1 << 20;
  // A launch whose node lacks at most this many bytes of its inputs sends them during the round;
  // more are sent on a thread of their own while the trial waits (dispatch/blob_delivery.h).
  int64_t inline_upload_bytes = int64_t{64} << 20;
  // A model download can take hours for a 13B model on a slow link.
  std::chrono::milliseconds prepare_deadline = std::chrono::hours(6);
  std::chrono::milliseconds lease_warning = std::chrono::minutes(30);
  std::chrono::milliseconds lease_stop_margin = std::chrono::minutes(10);
  // Of the time left when a trial is stopped for its lease, what is kept back from the checkpoint's
  // grace: for killing a worker that overran it and reporting its end while the node is still up.
  std::chrono::milliseconds lease_stop_reserve = std::chrono::minutes(2);
  // How long a worker cancelled with a checkpoint (Cancel with `checkpoint`) may take to write it
  // before it is killed: a large model's checkpoint takes minutes.
  std::chrono::milliseconds cancel_checkpoint_grace = std::chrono::minutes(10);
  // Renews the nodes' certificates at their health checks and keeps nodes whose certificate
  // expired from being dialled (controller/node_certificates.h). Not owned; null: neither (tests
  // whose agents serve fixed credentials).
  NodeCertificates* certificates = nullptr;
};

namespace dispatch {

using AttemptKey = std::pair<int64_t, int64_t>;  // (trial id, attempt)

// "trial T attempt A", as the logs name an attempt.
std::string AttemptName(int64_t trial_id, int64_t attempt);
std::string AttemptName(const store::RunningAttempt& attempt);

// The parts read a trial's config with store::StoredConfig (stored_config.h), the reading by which
// the store bounds an attempt's event ranks.

// The next backoff after a failure: `initial` first, then doubling up to `max`.
std::chrono::milliseconds NextBackoff(std::chrono::milliseconds backoff,
                                      std::chrono::milliseconds initial,
                                      std::chrono::milliseconds max);

struct DispatcherCore {
  DispatcherCore(store::Store& store, const BlobStore& blobs, const Clock& clock,
                 ChangeNotifier& changes, DispatcherOptions options)
      : store(store), blobs(blobs), clock(clock), changes(changes), options(options) {}

  // Asks the round thread for a round now.
  void Wake() LLMCTL_EXCLUDES(mutex);
  // Whether Dispatcher::Stop has begun.
  bool Stopping() LLMCTL_EXCLUDES(mutex);
  // A unary call's context with the call deadline.
  std::unique_ptr<grpc::ClientContext> CallContext() const;

  store::Store& store;
  const BlobStore& blobs;
  const Clock& clock;
  ChangeNotifier& changes;
  const DispatcherOptions options;

  // Guards every part's state (each says which of its fields), and the two flags below.
  Mutex mutex;
  CondVar wake;
  bool wake_requested LLMCTL_GUARDED_BY(mutex) = false;
  bool stopping LLMCTL_GUARDED_BY(mutex) = false;
};

}  // namespace dispatch
}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_DISPATCH_DISPATCHER_CORE_H_
