// Stopping and continuing trials at the user's word: Cancel (queued trials at once, running ones
// through CancelRun on their agents, optionally with a checkpoint first) and Resume (Store's
// ResumeTrial; placement then sends the trial to where its checkpoint is). CancelRun, the call
// itself, is shared with lease_watch.h's lease stops and with LostRuns, which stops the runs of
// attempts declared lost and keeps their devices from placement until they are confirmed stopped.
#ifndef LLMCTL_CONTROLLER_DISPATCH_CANCELLATION_H_
#define LLMCTL_CONTROLLER_DISPATCH_CANCELLATION_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/checkpoint_copy.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/store/records.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::controller::dispatch {

// How many CancelRuns are under way at once: a cancel's (CancelRuns, Cancellation::Cancel) and the
// lost runs' (LostRuns::Ask), each. Each is a thread and a call (a TLS handshake on a new link), as
// a health check is (kHealthChecksPerBatch): the bound keeps a cancel of an experiment running on
// hundreds of nodes, or the lost runs a store hands back after an upgrade, from starting hundreds
// of threads at once, while an answering agent replies within a round trip. A chosen bound, not a
// measured one.
inline constexpr size_t kCancelsAtOnce = 32;

// Asks `node`'s agent (`stub`) to stop the attempt's run there; a failure is logged. With
// `checkpoint_grace`, the worker first checkpoints its last complete step and gets that long before
// it is killed. True when the answer says the run holds no device any more: it has ended, or the
// agent has no such run (NOT_FOUND). `context`: the call's, for a caller that may cancel it (with
// the call deadline, DispatcherCore::CallContext); null: one made here.
bool CancelRun(const DispatcherCore& core, const store::RunningAttempt& attempt,
               const std::string& node, const std::string& trial_name, v1::Agent::Stub& stub,
               std::optional<std::chrono::milliseconds> checkpoint_grace,
               grpc::ClientContext* context = nullptr);

// CancelRun on every node the attempt runs on whose agent is connected (one not connected is
// skipped: the attempt is declared lost and ends with it), except node rank `except_node_rank` and
// the nodes of a multi-node attempt whose run has already ended; the nodes' calls side by side, so
// that the slowest node's answer is what it waits for. Returns once every node has answered.
void CancelRuns(const DispatcherCore& core, AgentLinks& links, const store::RunningAttempt& attempt,
                const std::string& trial_name,
                std::optional<std::chrono::milliseconds> checkpoint_grace,
                std::optional<int64_t> except_node_rank = std::nullopt);

// An attempt CancelRunsOfEach stops, with its worker's grace to checkpoint first (none: a plain
// stop).
struct AttemptToStop {
  const store::RunningAttempt* attempt;  // not owned; outlives the call
  std::string trial_name;
  std::optional<std::chrono::milliseconds> checkpoint_grace;
};

// CancelRuns for every attempt of `attempts`, each with its own grace: every attempt's every node
// side by side, so that a node slow to answer delays no other attempt's either.
void CancelRunsOfEach(const DispatcherCore& core, AgentLinks& links,
                      const std::vector<AttemptToStop>& attempts);

// The runs of attempts declared lost that may still go on on their nodes (an agent that refused
// the attempt's stream but still answers, one silent for a while, a multi-node attempt's other
// nodes): the store no longer has them as running, so without this placement would put the next
// attempt on the devices they hold (two trainings on one GPU). Each is asked to stop with CancelRun
// (keyed by its attempt number, so the next attempt's run is never touched) and its devices count
// as busy until the answer confirms it holds none: asked again each round while its node is
// connected, so an agent back from a silence stops it too. Each CancelRun runs on a thread of its
// own, not the round's (at most kCancelsAtOnce at once, the rest at later rounds): an agent
// answers once the run has ended or its cancel_grace and 5 s have passed, and a run slow to stop
// would otherwise hold up every round (health checks, lease stops, placement) that long. The store
// keeps them too, written in the transaction that declares the attempt lost and released once a run
// is confirmed stopped (Store::ListLostRuns): a restarted controller, killed -9 included, reads
// them back at its first round, asks their agents again, and places no trial until it has read
// them.
class LostRuns {
 public:
  LostRuns(DispatcherCore& core, AgentLinks& links) : core_(core), links_(links) {}

  // Keeps each of the lost attempt's runs that has not ended, for the round's Ask and for
  // HoldingDevices.
  void Keep(const store::RunningAttempt& attempt, const std::string& trial_name);
  // On the round thread: at the first round (and each round after until it could), reads back
  // the runs the store keeps from before this controller started; drops the kept runs confirmed
  // stopped (or forgotten) since, and starts a CancelRun for each other one whose node is
  // connected and that has none under way. One that confirms its run stopped releases it in the
  // store and wakes the round.
  void Ask();
  // `running` with each kept run not confirmed stopped added as an attempt on its node holding its
  // devices, for placement. The store's error while the runs it keeps could not be read yet: then
  // nothing may be placed.
  StatusOr<std::vector<store::RunningAttempt>> HoldingDevices(
      std::vector<store::RunningAttempt> running) const;
  // A removed node: its runs are no longer waited for (a CancelRun under way is cancelled).
  void ForgetNode(const std::string& node);
  // How many CancelRuns are under way (for tests).
  int InFlight();
  // Cancels the CancelRuns under way and waits for their threads (Dispatcher::Stop, after the
  // round thread has ended).
  void Stop();

 private:
  struct Kept {
    store::RunningAttempt run;  // one node's run: `node` and its `device_indices`, no `nodes`
    std::string trial_name;
    // Its CancelRun's; started and joined by the round thread only (and by Stop after it).
    std::thread thread;
    // Guarded by the core's mutex (reached only through kept_, which clang checks):
    bool asking = false;                     // a CancelRun under way on `thread`
    bool stopped = false;                    // an answer confirmed the run holds no device
    bool forgotten = false;                  // ForgetNode
    grpc::ClientContext* context = nullptr;  // the CancelRun in flight, for Stop and ForgetNode
  };
  // `thread`'s work: CancelRun on `stub`, and what it confirmed recorded.
  void AskOne(Kept& kept, const std::shared_ptr<v1::Agent::Stub>& stub);
  // Ask's reading of the store's runs, until it has succeeded once.
  void ReadKeptByTheStore();

  DispatcherCore& core_;
  AgentLinks& links_;
  // Erased only by Ask (on the round thread) and only when no CancelRun is under way: a running
  // thread, and Stop (after the round thread has ended), hold Kept* safely.
  std::vector<std::unique_ptr<Kept>> kept_ LLMCTL_GUARDED_BY(core_.mutex);
  // OK once the store's runs have been read (by the round thread); until then why not.
  Status read_ LLMCTL_GUARDED_BY(core_.mutex) =
      UnavailableError("the lost attempts' runs the store keeps are not read yet");
};

class Cancellation {
 public:
  Cancellation(DispatcherCore& core, AgentLinks& links, CheckpointCopies& checkpoints)
      : core_(core), links_(links), checkpoints_(checkpoints) {}

  // Dispatcher::Cancel and Dispatcher::Resume.
  StatusOr<std::vector<std::string>> Cancel(int64_t experiment_id, std::string_view trial,
                                            bool checkpoint);
  StatusOr<store::TrialResume> Resume(int64_t experiment_id, std::string_view trial);

 private:
  DispatcherCore& core_;
  AgentLinks& links_;
  CheckpointCopies& checkpoints_;
};

}  // namespace llmctl::controller::dispatch

#endif  // LLMCTL_CONTROLLER_DISPATCH_CANCELLATION_H_
