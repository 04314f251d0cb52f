// Hugging Face hub models (model: hf:ORG/NAME@REV) prepared on a node before a trial that needs
// them runs there: PrepareHubModel once per node and model, on a thread of its own with
// prepare_deadline, while the trial stays queued and other placements go on. Codes retrying can
// help (UNAVAILABLE, DEADLINE_EXCEEDED, ...) prepare it again after a doubling backoff; the
// permanent ones (IsPermanentPrepareFailure) fail the trials that waited for it, and a later
// experiment tries again. What is kept of a preparation (the node has the model, its failure, its
// backoff) goes once its node is forgotten and its thread has ended, or after 10 minutes in which
// no launch asked for it; a later launch then asks the agent afresh.
#ifndef LLMCTL_CONTROLLER_DISPATCH_HUB_PREPARATION_H_
#define LLMCTL_CONTROLLER_DISPATCH_HUB_PREPARATION_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "common/model_config.h"
#include "common/status.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/dispatcher_core.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::controller::dispatch {

// Codes with which PrepareHubModel cannot succeed however often it is retried.
bool IsPermanentPrepareFailure(grpc::StatusCode code);

class HubPreparations {
 public:
  explicit HubPreparations(DispatcherCore& core) : core_(core) {}

  // True when the link's node has `model` ("hf:ORG/NAME@REV"); false while it is being prepared
  // (started here if need be); the agent's error when preparing it cannot succeed.
  StatusOr<bool> Ensure(AgentLinks::Link& link, const std::string& model, int64_t experiment_id,
                        MonotonicTime now);
  // The node's agent said it has no such model (a wiped cache): prepare it again next time, unless
  // it is being prepared now.
  void Forget(const std::string& node, const std::string& model);
  // RemoveNode: cancels the node's downloads; a node registered again under this name starts with
  // an empty cache.
  void ForgetNode(const std::string& node);
  // The nodes that have `model` or are downloading it now, as far as the preparations kept say:
  // placement prefers them, so that the model is not downloaded again elsewhere. Empty for a model
  // that is no hub model.
  std::set<std::string> NodesWith(const std::string& model);
  // How many are in flight now (for tests).
  int InFlight();
  // How many it keeps: in flight, ready, failed or waiting for a retry (for tests).
  int Held();
  // Cancels every download and waits for their threads (Dispatcher::Stop, after `stopping`).
  void Stop();

 private:
  struct Preparation {
    std::string node;
    std::string model;  // "hf:ORG/NAME@REV"
    std::thread thread;
    // Guarded by the core's mutex (reached only through preparations_, which clang checks):
    enum class State { kIdle, kRunning, kReady, kFailed } state = State::kIdle;
    Status failure;                 // kFailed: why preparing cannot succeed
    std::set<int64_t> experiments;  // whose trials waited for this preparation
    MonotonicTime retry_at;         // kIdle after a failure that retrying may cure
    std::chrono::milliseconds backoff{0};
    grpc::ClientContext* context = nullptr;  // while PrepareHubModel is in flight
    bool forgotten = false;                  // ForgetNode: erased once its thread has ended
    MonotonicTime asked_at;                  // the last Ensure for it
  };
  using Key = std::pair<std::string, std::string>;  // (node, "hf:ORG/NAME@REV")

  void Prepare(Preparation& preparation, std::shared_ptr<v1::Agent::Stub> stub, HubModelRef ref);

  DispatcherCore& core_;
  // Erased only by Ensure (on the round thread) and only when not running: a running
  // preparation's thread, and Stop (after the round thread has ended), hold Preparation* safely.
  std::map<Key, std::unique_ptr<Preparation>> preparations_ LLMCTL_GUARDED_BY(core_.mutex);
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_HUB_PREPARATION_H_
