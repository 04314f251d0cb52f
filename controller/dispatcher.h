// The dispatcher: puts queued trials on agents and follows what runs there. It is the thin
// coordinator of the parts in controller/dispatch/, each owning one concern: agent_links (steps 1,
// 2 and 4 but the declaring lost, which is the coordinator's), event_streams (3), placement and
// launcher (5), hub_preparation (5's hub models), checkpoint_copy and artifacts (5's checkpoint
// copies), lease_watch (6), cancellation (Cancel, Resume); RemoveNode spans several parts and
// stays here. Each round (Tick) it
//   1. keeps one link per node in the store and asks each agent for its node info every
//      health_interval (with a deadline), recording the node as connected or unreachable; after a
//      failed check the next comes after backoff_initial, doubling up to health_interval. The
//      round waits at most failing_check_wait (2 s) for the check of a node whose last one failed
//      (an agent that never answers would hold it for the call deadline); that check goes on,
//      on its own thread, and wakes the round when the node answers. A node
//      whose NVIDIA driver supports an older CUDA than its llm-train's LibTorch was built for
//      (CheckDriverRunsLibTorch, common/cuda_version.h) is recorded as unusable, logged once with
//      what to change, shown with that reason (NodeUnusable) and given no trial;
//   2. after a link (re)connects, asks the agent which runs it has (ListRuns): an attempt the store
//      has as running there that the agent does not know is lost at once;
//   3. follows every running attempt whose agent is connected with a StreamEvents reader that
//      starts at the store's LastSeq + 1, stores what arrives (idempotent on trial, attempt, seq)
//      and finishes the attempt on `ended`; a broken stream, or one the agent refused, is reopened
//      after a backoff that doubles up to backoff_max, from the last stored seq; only the store's
//      fence ends one for good;
//   4. declares lost the attempts whose agent has been silent for requeue_after (the scheduler's
//      policy), or has refused their stream that long (event_streams.h): the trial is queued again
//      as attempt + 1, and anything the old attempt still sends is refused by the store (fencing).
//      Its runs are asked to stop (CancelRun, each on a thread of its own: an agent answers once
//      the run has ended, up to its cancel_grace and 5 s, which the round does not wait for), and
//      the devices of each count as busy until its agent confirms it ended or has no such run;
//      one not confirmed is asked again each round, so an agent back from a silence stops it too;
//      the store keeps them, so a restarted controller asks again and places nothing on their
//      devices before (dispatch/cancellation.h LostRuns);
//   5. places queued trials on connected agents (the scheduler's policy) and, for each, sends the
//      agent the blobs of its inputs that it lacks, calls RunTrial, then StartAttempt. In that
//      order a crash in between is harmless: the trial is still queued, is placed again, and
//      RunTrial is idempotent on its key (same trial, same attempt number). StartAttempt records
//      the device indices the attempt holds, so a restarted controller places around them.
//      Blobs of more than inline_upload_bytes (a model's weights) are sent on a thread of their
//      own, once per node and tree, while the trial stays queued (dispatch/blob_delivery.h).
//      A trial whose model is on the Hugging Face hub (hf:ORG/NAME@REV) first needs the agent to
//      download it: PrepareHubModel runs on a thread of its own (once per node and model, with
//      prepare_deadline), the trial stays queued meanwhile and other placements go on. UNAVAILABLE
//      or DEADLINE_EXCEEDED (and other codes retrying can help) → prepared again after a backoff;
//      NOT_FOUND, PERMISSION_DENIED, UNAUTHENTICATED, FAILED_PRECONDITION, DATA_LOSS and
//      INVALID_ARGUMENT → the trial fails with the agent's message.
//      A resumed trial (Resume) goes only to the node holding its checkpoint, and RunTrial names
//      the checkpoint in resume_from; the agent's FAILED_PRECONDITION (that run or its checkpoint
//      is gone from the node) fails the trial, as retrying cannot bring it back. While the node is
//      not connected the trial waits, and QueuedNotice says for what;
//      A trial stopped with a checkpoint (below, and Cancel with `checkpoint`) has that
//      checkpoint copied at once, on a thread of its own, from its agent into the blob store as
//      an input tree (FetchArtifacts of the checkpoint's directory, every file checked against
//      its sha256), recorded with Store::SetCheckpointTree: a resumed trial whose checkpoint the
//      controller holds may run on any node that satisfies it, which gets the tree like any other
//      input and resumes from it (resume_from.tree). A failed copy is logged, and the node
//      holding the checkpoint stays the only one that can continue it;
//   6. watches the end of each node's cloud lease: from lease_warning before it, a warning (logged
//      once, and NodeNotice for the status the CLI shows) and no new trial on that node; from
//      lease_stop_margin before it, CancelRun with checkpoint for each trial running there
//      (llm-train writes a checkpoint of its last complete step into its output_dir, when it fits
//      on the disk, and stops), with what is left of the lease less lease_stop_reserve as the
//      grace before the worker is killed; the trial then ends cancelled with "node N's lease L
//      ends at ...: stopped before it does; checkpoint after step S in PATH ..." (or why there is
//      none).
// A node removed with RemoveNode (`llmctl node down`) is no longer dialled: its stream readers stop
// at once, its attempts are requeued at once (not after requeue_after), and the next round drops
// its link.
// Time comes from the injected Clock, so tests drive rounds and timeouts by hand.
//
// Thread-safe. Start() runs rounds on a thread of its own; the stream readers, hub model downloads,
// large input deliveries and checkpoint copies have a thread each. The parts share one mutex
// (dispatch/dispatcher_core.h).
#ifndef LLMCTL_CONTROLLER_DISPATCHER_H_
#define LLMCTL_CONTROLLER_DISPATCHER_H_

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "controller/blob_store.h"
#include "controller/change_notifier.h"
#include "controller/clock.h"
#include "controller/dispatch/agent_links.h"
#include "controller/dispatch/artifacts.h"
#include "controller/dispatch/blob_delivery.h"
#include "controller/dispatch/cancellation.h"
#include "controller/dispatch/checkpoint_copy.h"
#include "controller/dispatch/dispatcher_core.h"
#include "controller/dispatch/event_streams.h"
#include "controller/dispatch/hub_preparation.h"
#include "controller/dispatch/launcher.h"
#include "controller/dispatch/lease_watch.h"
#include "controller/dispatch/placement.h"
#include "controller/store/store.h"
#include "llmctl/v1/agent.grpc.pb.h"

namespace llmctl::controller {

class Dispatcher {
 public:
  // The references must outlive the dispatcher.
  Dispatcher(store::Store& store, const BlobStore& blobs, AgentConnector connect,
             const Clock& clock, ChangeNotifier& changes, DispatcherOptions options);
  ~Dispatcher();  // Stop()
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Runs Tick on a background thread: again after health_interval or when a retry (a health check
  // after a failed one, a broken stream) is due, whichever comes first, or at once after Wake().
  void Start();
  // Ends the background thread and every stream reader.
  void Stop();
  void Wake();
  // One round (see the file comment).
  void Tick();

  // Cancels one trial (or, with an empty name, every trial) of the experiment: queued ones at once,
  // running ones through CancelRun on their agents (they then finish as cancelled; an unreachable
  // agent's trial ends cancelled when its attempt is declared lost). With `checkpoint`, running
  // workers first checkpoint their last complete step (within cancel_checkpoint_grace), and the
  // trial's error says where the checkpoint is, for Resume. Returns the trials that were queued or
  // running. NotFound for an unknown experiment or trial.
  StatusOr<std::vector<std::string>> Cancel(int64_t experiment_id, std::string_view trial,
                                            bool checkpoint = false);

  // Queues the trial again to continue from its final attempt's checkpoint (Store::ResumeTrial's
  // rules); it then runs only on the node holding the checkpoint, with RunTrial's resume_from.
  // NotFound for an unknown experiment or trial; FailedPrecondition saying why it cannot resume.
  StatusOr<store::TrialResume> Resume(int64_t experiment_id, std::string_view trial);

  // Removes the node (Store::RemoveNode: its running attempts are declared lost and their trials
  // queued again, in one transaction), then stops the stream readers of those attempts and the
  // node's hub model downloads, and drops its link before returning, so no call goes to the node
  // from now on. An unknown or already removed node is OK (the result says which).
  StatusOr<store::NodeRemoval> RemoveNode(const std::string& node);
  // The node was registered again (RegisterNode, with new credentials or for enrollment) or
  // enrolled: its link, stream readers, background deliveries and model downloads, whose channels
  // carry the old token and accept the old certificate's name, end before this returns; the next
  // round dials the node with the credentials then current (none while an enrollment is pending),
  // and its running attempts' streams are reopened over that link.
  void NodeCredentialsChanged(const std::string& node);

  // Streams a run's artifacts from `node`'s agent into `sink` (only those under `path`, a
  // directory in the run's output, when given; FetchArtifactsRequest says how); a false from
  // `sink` stops it (Cancelled). Unavailable when the node has no link; DeadlineExceeded when no
  // chunk arrives for call_deadline.
  Status FetchArtifacts(const std::string& node, const v1::RunKey& key,
                        const std::function<bool(const v1::ArtifactChunk&)>& sink,
                        const std::string& path = "");

  // How many stream readers are running now (for tests and the node list).
  int ActiveStreams();

  // How many hub model downloads are in flight now (for tests).
  int HubPreparationsInFlight();
  // How many hub model preparations it keeps: in flight, ready, failed or waiting for a retry (for
  // tests).
  int HubPreparationsHeld();
  // How many input deliveries run in the background now (for tests).
  int BlobDeliveriesInFlight();
  // How many input deliveries it keeps: in flight, waiting for a retry or for their launch (for
  // tests).
  int BlobDeliveriesHeld();
  // How many checkpoint copies to the controller are in flight now (for tests).
  int CheckpointCopiesInFlight();
  // How many checkpoint copies' threads it holds, finished or not (for tests).
  int CheckpointCopiesHeld();
  // How many CancelRuns of lost attempts' runs are in flight now (for tests).
  int LostRunCancelsInFlight();

  // A warning about `node` for the trials running there ("" when none): its lease ends soon.
  std::string NodeNotice(const std::string& node);
  // Why the connected `node` takes no trial ("" when it may): its NVIDIA driver supports an older
  // CUDA than its llm-train's LibTorch was built for (CheckDriverRunsLibTorch).
  std::string NodeUnusable(const std::string& node);
  // What the connected `node`'s agent last said of its rates ("" when they are current or it is
  // not connected): "measuring", "not measured again: ..." (NodeInfo.rate_probe_pending), and
  // whether it measures or waits to measure them.
  dispatch::RatesNote NodeRatesPending(const std::string& node);
  // Asks `node`'s agent to measure its rates again (Agent.MeasureRates); its answer's note.
  // FailedPrecondition when the node has no link or its agent does not answer (or is not ready);
  // the agent's other refusals, with the node named.
  StatusOr<std::string> MeasureNodeRates(const std::string& node);
  // Why a queued trial is not placed when no connected node has the devices it needs (""
  // otherwise).
  std::string QueuedNotice(int64_t trial_id);

 private:
  // How long the round thread may sleep before the next round.
  std::chrono::milliseconds UntilNextRound() const LLMCTL_REQUIRES(core_.mutex);
  // Stops the attempt's stream readers and marks it lost (its trial is queued again), then stops
  // its runs (StopRuns): an agent that still answers may still run it (it refused the stream, or
  // a multi-node attempt's other nodes, whose ranks cannot go on).
  void DeclareLost(const dispatch::AttemptKey& attempt,
                   const std::vector<store::RunningAttempt>& running, store::Time now);
  // Has a lost attempt's runs stopped (LostRuns::Keep, asked at the round): its devices take no
  // trial until each run is confirmed stopped.
  void StopRuns(const store::RunningAttempt& attempt);

  dispatch::DispatcherCore core_;
  // The parts, each using those declared before it.
  dispatch::AgentLinks links_;
  dispatch::LostRuns lost_runs_;
  dispatch::ArtifactFetcher artifacts_;
  dispatch::CheckpointCopies checkpoints_;
  dispatch::EventStreams streams_;
  dispatch::HubPreparations hub_models_;
  dispatch::BlobDeliveries deliveries_;
  dispatch::Launcher launcher_;
  dispatch::LeaseWatch leases_;
  dispatch::Placement placement_;
  dispatch::Cancellation cancellation_;

  Mutex tick_mutex_;  // one round at a time
  std::thread thread_;
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_DISPATCHER_H_
