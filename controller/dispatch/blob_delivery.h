// The blobs of a trial's inputs (and of the controller's copy of the checkpoint it resumes from)
// sent to the node it is placed on, before RunTrial: MissingBlobs, then UploadBlob for each blob
// the agent lacks, each with rpc::TransferDeadline.
//
// Missing blobs of at most inline_upload_bytes in all (a dataset, a tokenizer) are sent during
// the round, as part of the launch. More (a model's weights: gigabytes, minutes on a slow link)
// are sent on a thread of their own, once per node and tree, while the trial stays queued and the
// round goes on: health checks, lease stops and other nodes' launches do not wait for them. A
// failed background delivery is tried again after a doubling backoff; what it sent stays on the
// agent, so the next one sends only the rest. What is kept of a delivery goes once a launch has
// taken it, once its node is forgotten and its thread has ended, or after 10 minutes in which no
// launch asked for it.
#ifndef LLMCTL_CONTROLLER_DISPATCH_BLOB_DELIVERY_H_
#define LLMCTL_CONTROLLER_DISPATCH_BLOB_DELIVERY_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/digest/digest.h"
#include "common/status.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/dispatcher_core.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::controller::dispatch {

class BlobDeliveries {
 public:
  explicit BlobDeliveries(DispatcherCore& core) : core_(core) {}

  // True when the link's node has every blob of `tree` (sent now if need be); false while they
  // are sent in the background (started here if need be) or wait for a retry. An error from a
  // delivery made during the round, or from asking which blobs are missing.
  StatusOr<bool> Ensure(AgentLinks::Link& link, const std::shared_ptr<v1::Agent::Stub>& stub,
                        const digest::InputTree& tree, MonotonicTime now);
  // What the link's node waits for, for the queued trial's notice ("" when nothing).
  std::string WaitingFor(const std::string& node, const std::string& tree_digest);
  // RemoveNode: cancels the node's background deliveries.
  void ForgetNode(const std::string& node);
  // How many are in flight now (for tests).
  int InFlight();
  // How many it keeps, in flight, waiting for a retry or for their launch (for tests).
  int Held();
  // Cancels every background delivery and waits for their threads (Dispatcher::Stop).
  void Stop();

 private:
  struct Delivery {
    std::string node;
    std::string tree_digest;
    std::thread thread;
    // Guarded by the core's mutex (reached only through deliveries_, which clang checks):
    enum class State { kIdle, kRunning, kReady } state = State::kIdle;
    int64_t bytes = 0;       // what the running delivery sends
    MonotonicTime retry_at;  // kIdle after a failure
    std::chrono::milliseconds backoff{0};
    std::string last_failure;                // kIdle after a failure: why
    grpc::ClientContext* context = nullptr;  // while an UploadBlob is in flight
    bool forgotten = false;                  // ForgetNode: send no further blob
    MonotonicTime asked_at;                  // the last Ensure for it
  };
  using Key = std::pair<std::string, std::string>;  // (node, tree digest)
  struct Blob {
    std::string sha256;
    int64_t size = 0;
  };

  // The blobs of `tree` the agent lacks.
  StatusOr<std::vector<Blob>> Missing(v1::Agent::Stub& stub, const digest::InputTree& tree);
  // Uploads `blobs`; `delivery` (null during the round) publishes each call's context so that
  // Stop and ForgetNode can cancel it.
  Status Send(v1::Agent::Stub& stub, const std::vector<Blob>& blobs, Delivery* delivery);
  Status Upload(v1::Agent::Stub& stub, const Blob& blob, grpc::ClientContext& context);
  void RunInBackground(Delivery& delivery, std::shared_ptr<v1::Agent::Stub> stub,
                       std::vector<Blob> blobs);

  DispatcherCore& core_;
  // Erased only by Ensure (on the round thread) and only when not running: a running delivery's
  // thread, and Stop (after the round thread has ended), hold Delivery* safely.
  std::map<Key, std::unique_ptr<Delivery>> deliveries_ LLMCTL_GUARDED_BY(core_.mutex);
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_BLOB_DELIVERY_H_
