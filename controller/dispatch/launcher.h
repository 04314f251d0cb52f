// Starting one placed trial on its node: the hub model first when it needs one
// (hub_preparation.h), then the blobs of its inputs (and of the controller's copy of the
// checkpoint it resumes from) that the agent lacks, then RunTrial, then StartAttempt. In that order
// a crash in between is harmless: the trial is still queued, is placed again, and RunTrial is
// idempotent on its key (same trial, same attempt number). StartAttempt records the device indices
// the attempt holds, so a restarted controller places around them. Where a trial goes is
// placement.h's business (and the scheduler's), not this file's.
#ifndef LLMCTL_CONTROLLER_DISPATCH_LAUNCHER_H_
#define LLMCTL_CONTROLLER_DISPATCH_LAUNCHER_H_

#include <cstdint>
#include <vector>

#include "common/digest/digest.h"
#include "common/status.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/hub_preparation.h"
#include "controller/dispatch/shared.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::controller::dispatch {

// The tree as agent.proto carries it.
v1::InputTree ToProto(const digest::InputTree& tree);

class Launcher {
 public:
  Launcher(Shared& shared, HubPreparations& hub_models)
      : shared_(shared), hub_models_(hub_models) {}

  // Starts `trial`'s next attempt on `link`'s node with `devices`. OK also when the trial stays
  // queued (its hub model is being prepared) or was failed for good (the agent refused it, or its
  // model cannot be prepared); an error when it should be placed again.
  Status Launch(const store::TrialRecord& trial, AgentLinks::Link& link,
                const std::vector<int64_t>& devices, store::Time now);

 private:
  // Sends the agent the tree's blobs it lacks (MissingBlobs, then UploadBlob each).
  Status EnsureBlobs(v1::Agent::Stub& stub, const digest::InputTree& tree);

  Shared& shared_;
  HubPreparations& hub_models_;
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_LAUNCHER_H_
