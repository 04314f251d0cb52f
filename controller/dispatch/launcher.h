// Starting one placed trial on its node: the hub model first when it needs one
// (hub_preparation.h), then the blobs of its inputs (and of the controller's copy of the
// checkpoint it resumes from) that the agent lacks (blob_delivery.h), then RunTrial, then
// StartAttempt. In that order
// a crash in between is harmless: the trial is still queued, is placed again, and RunTrial is
// idempotent on its key (same trial, same attempt number). StartAttempt records the device indices
// the attempt holds, so a restarted controller places around them. Where a trial goes is
// placement.h's business (and the scheduler's), not this file's.
//
// A multi-node trial (the trial key `nodes` > 1) is prepared the same way on each of its nodes,
// recorded (StartMultiNodeAttempt), then started node rank 0 first: its agent answers with the
// port its ranks serve the rendezvous on, and every other node is started with that port and node
// rank 0's host (RendezvousHost). If a node cannot start it, the runs already started are stopped
// and the attempt ends: failed when the agent refused the trial, else lost (queued again). When
// node rank 0 turns it away without starting anything, nothing ran: the attempt is withdrawn.
#ifndef LLMCTL_CONTROLLER_DISPATCH_LAUNCHER_H_
#define LLMCTL_CONTROLLER_DISPATCH_LAUNCHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/digest/digest.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/blob_delivery.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/dispatch/hub_preparation.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::controller::dispatch {

// The tree as agent.proto carries it.
v1::InputTree ToProto(const digest::InputTree& tree);

// The host in an agent's gRPC address ("10.0.0.5:7443" → "10.0.0.5", "[fe80::1]:7443" →
// "fe80::1"), where the other nodes of a multi-node trial reach node rank 0's rendezvous; an agent
// on a Unix socket is on this host: 127.0.0.1.
std::string RendezvousHost(const std::string& agent_address);

class Launcher {
 public:
  Launcher(DispatcherCore& core, HubPreparations& hub_models, BlobDeliveries& deliveries)
      : core_(core), hub_models_(hub_models), deliveries_(deliveries) {}

  // Starts `trial`'s next attempt on `link`'s node with `devices`. OK also when the trial stays
  // queued (its hub model is being prepared, or its inputs sent in the background: `waiting` says
  // which) or was failed for good (the agent refused it, or its model cannot be prepared); an
  // error when it should be placed again.
  Status Launch(const store::TrialRecord& trial, AgentLinks::Link& link,
                const std::vector<int64_t>& devices, store::Time now, std::string& waiting);
  // Starts a multi-node trial's next attempt on `links` (node rank i at index i) with `devices`
  // (per node), as the file comment says. OK as Launch is; an error when it should be placed again.
  Status LaunchMultiNode(const store::TrialRecord& trial,
                         const std::vector<AgentLinks::Link*>& links,
                         const std::vector<std::vector<int64_t>>& devices, store::Time now,
                         std::string& waiting);

 private:
  enum class Readiness {
    kReady,    // `request` is complete but for the devices and the node group
    kWaiting,  // its hub model or its inputs are on their way there: the trial stays queued
    kFailed,   // it cannot run anywhere (`failure` says why)
  };
  // Readies `link`'s node for the trial: its hub model, the blobs of its inputs and of the
  // checkpoint it resumes from (blob_delivery.h); fills `request`. `failure` says why for
  // kFailed, `waiting` for what for kWaiting.
  StatusOr<Readiness> Prepare(const store::TrialRecord& trial, const TrialConfig& config,
                              AgentLinks::Link& link, const std::shared_ptr<v1::Agent::Stub>& stub,
                              v1::RunTrialRequest& request, std::string& failure,
                              std::string& waiting);
  // A multi-node attempt on its way: each node's stub and RunTrial request (node rank i at index
  // i), its nodes as the store records them, its number once recorded, and the node ranks whose
  // run has started.
  struct MultiNodeStart {
    const store::TrialRecord& trial;
    TrialConfig config;
    const std::vector<AgentLinks::Link*>& links;
    store::Time now;
    std::vector<std::shared_ptr<v1::Agent::Stub>> stubs = {};
    std::vector<v1::RunTrialRequest> requests = {};
    std::vector<store::AttemptNode> nodes = {};
    int64_t attempt = 0;
    std::vector<int> started = {};
  };
  // Readies every node, with its `devices`, before any wait; kFailed once it has recorded the
  // trial failed, naming the node.
  StatusOr<Readiness> PrepareNodes(MultiNodeStart& start,
                                   const std::vector<std::vector<int64_t>>& devices,
                                   std::string& waiting);
  // RunTrial on node rank 0, then on the others with its host and rendezvous port.
  Status StartNodes(MultiNodeStart& start);
  // After node `rank` did not start its run (`ran`; `what` for the message): stops the runs
  // already started and ends the attempt as the file comment says.
  Status Abandon(const MultiNodeStart& start, int rank, const grpc::Status& ran,
                 const std::string& what);
  std::shared_ptr<v1::Agent::Stub> StubOf(AgentLinks::Link& link);
  // Whether RunTrial's error means the trial cannot run (rather than should be placed again).
  static bool Refused(const store::TrialRecord& trial, const grpc::Status& ran);
  // After RunTrial's NOT_FOUND for a hub model: the agent lost its copy, to be prepared again.
  void ForgetLostHubModel(const TrialConfig& config, AgentLinks::Link& link,
                          const grpc::Status& ran);

  DispatcherCore& core_;
  HubPreparations& hub_models_;
  BlobDeliveries& deliveries_;
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_LAUNCHER_H_
