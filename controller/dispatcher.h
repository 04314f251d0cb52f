// The dispatcher: puts queued trials on agents and follows what runs there.
//
// Each round (Tick) it
//   1. keeps one link per node in the store and asks each agent for its node info every
//      health_interval (with a deadline), recording the node as connected or unreachable; after a
//      failed check the next comes after backoff_initial, doubling up to health_interval. A node
//      whose NVIDIA driver supports an older CUDA than its llm-train's LibTorch was built for
//      (CheckDriverRunsLibTorch, common/cuda_version.h) is recorded as unusable, logged once with
//      what to change, shown with that reason (NodeUnusable) and given no trial;
//   2. after a link (re)connects, asks the agent which runs it has (ListRuns): an attempt the store
//      has as running there that the agent does not know is lost at once;
//   3. follows every running attempt whose agent is connected with a StreamEvents reader that
//      starts at the store's LastSeq + 1, stores what arrives (idempotent on trial, attempt, seq)
//      and finishes the attempt on `ended`; a broken stream is reopened after a backoff that
//      doubles up to backoff_max, from the last stored seq;
//   4. declares lost the attempts whose agent has been silent for requeue_after (the scheduler's
//      policy): the trial is queued again as attempt + 1, and anything the old attempt still sends
//      is refused by the store (fencing);
//   5. places queued trials on connected agents (the scheduler's policy) and, for each, sends the
//      agent the blobs of its inputs that it lacks, calls RunTrial, then StartAttempt. In that
//      order a crash in between is harmless: the trial is still queued, is placed again, and
//      RunTrial is idempotent on its key (same trial, same attempt number). StartAttempt records
//      the device indices the attempt holds, so a restarted controller places around them.
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
// Thread-safe. Start() runs rounds on a thread of its own; the stream readers have a thread each.
#ifndef LLMCTL_CONTROLLER_DISPATCHER_H_
#define LLMCTL_CONTROLLER_DISPATCHER_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/digest/digest.h"
#include "common/model_config.h"
#include "common/status.h"
#include "controller/blob_store.h"
#include "controller/change_notifier.h"
#include "controller/clock.h"
#include "controller/secrets.h"
#include "controller/store/store.h"
#include "llmctl/v1/agent.grpc.pb.h"
#include "rpc/tls.h"
#include "rpc/transfer.h"

namespace llmctl::controller {

// Opens the channel to a node's agent.
using AgentConnector =
    std::function<StatusOr<std::shared_ptr<grpc::Channel>>(const store::NodeRecord& node)>;

// Mutual TLS with the controller's identity, checking the agent's certificate name
// (agent-<node>.llmctl), with the node's token from `secrets` on every call.
AgentConnector TlsAgentConnector(rpc::TlsIdentity identity, const SecretsFile& secrets);

struct DispatcherOptions {
  std::chrono::milliseconds requeue_after = std::chrono::minutes(10);
  // Deadline of each unary call; a blob upload gets it plus its size at
  // min_transfer_bytes_per_second (rpc::TransferDeadline), and an artifact download is abandoned
  // when no chunk arrives for this long.
  std::chrono::milliseconds call_deadline = std::chrono::seconds(30);
  int64_t min_transfer_bytes_per_second = rpc::kDefaultMinTransferBytesPerSecond;
  std::chrono::milliseconds health_interval = std::chrono::seconds(5);
  std::chrono::milliseconds backoff_initial = std::chrono::seconds(1);
  std::chrono::milliseconds backoff_max = std::chrono::seconds(30);
  int64_t upload_chunk_bytes = 1 << 20;
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
};

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
  // How many checkpoint copies to the controller are in flight now (for tests).
  int CheckpointCopiesInFlight();

  // A warning about `node` for the trials running there ("" when none): its lease ends soon.
  std::string NodeNotice(const std::string& node);
  // Why the connected `node` takes no trial ("" when it may): its NVIDIA driver supports an older
  // CUDA than its llm-train's LibTorch was built for (CheckDriverRunsLibTorch).
  std::string NodeUnusable(const std::string& node);
  // Why a queued trial is not placed when no connected node has the devices it needs (""
  // otherwise).
  std::string QueuedNotice(int64_t trial_id);

 private:
  struct Link;
  struct Stream;
  struct HubPreparation;
  using AttemptKey = std::pair<int64_t, int64_t>;      // (trial id, attempt)
  using HubKey = std::pair<std::string, std::string>;  // (node, "hf:ORG/NAME@REV")

  // How long the round thread may sleep before the next round. Requires mutex_.
  std::chrono::milliseconds UntilNextRound() const;
  Link* EnsureLink(const store::NodeRecord& node, store::Time now);
  void CheckHealth(Link& link, store::Time now);
  void ReconcileRuns(Link& link, const std::vector<store::RunningAttempt>& running,
                     store::Time now);
  void FollowRunning(const std::vector<store::RunningAttempt>& running, store::Time now);
  void RequeueLost(const std::vector<store::RunningAttempt>& running, store::Time now);
  void PlaceQueued(const std::vector<store::RunningAttempt>& running, store::Time now);
  Status Launch(const store::TrialRecord& trial, Link& link, const std::vector<int64_t>& devices,
                store::Time now);
  Status EnsureBlobs(v1::Agent::Stub& stub, const digest::InputTree& tree);
  // True when the link's node has the model; false while it is being prepared (started here if
  // need be); the agent's error when preparing it cannot succeed.
  StatusOr<bool> EnsureHubModel(Link& link, const std::string& model, int64_t experiment_id,
                                store::Time now);
  void PrepareHubModel(HubPreparation& preparation, std::shared_ptr<v1::Agent::Stub> stub,
                       HubModelRef ref);
  void WatchLeases(const std::vector<store::NodeRecord>& nodes,
                   const std::vector<store::RunningAttempt>& running, store::Time now);
  // With `checkpoint_grace`, the worker first checkpoints its last complete step and gets that
  // long before it is killed.
  void CancelRun(const store::RunningAttempt& attempt, const std::string& trial_name,
                 v1::Agent::Stub& stub, std::optional<std::chrono::milliseconds> checkpoint_grace);
  void ReadStream(Stream& stream, v1::Agent::Stub& stub);
  // Starts copying the checkpoint that `result_json` (the attempt's result event) names into the
  // blob store, when it names one.
  void StartCheckpointCopy(const store::RunningAttempt& attempt, const std::string& trial_name,
                           const std::string& result_json);
  // The copy itself: the tree's digest, recorded with the attempt.
  StatusOr<std::string> CopyCheckpoint(const store::RunningAttempt& attempt,
                                       const std::string& trial_name, const std::string& checkpoint,
                                       int64_t step);
  void StopStream(const AttemptKey& key);
  std::unique_ptr<grpc::ClientContext> CallContext() const;

  store::Store& store_;
  const BlobStore& blobs_;
  const AgentConnector connect_;
  const Clock& clock_;
  ChangeNotifier& changes_;
  const DispatcherOptions options_;

  std::mutex tick_mutex_;  // one round at a time

  std::mutex mutex_;
  std::condition_variable wake_;
  bool wake_requested_ = false;  // guarded by mutex_
  bool stopping_ = false;        // guarded by mutex_
  // By node; guarded by mutex_. Erased only by Tick (under tick_mutex_, which every user of a
  // Link* holds) once the node is no longer listed.
  std::map<std::string, std::unique_ptr<Link>> links_;
  std::map<AttemptKey, std::unique_ptr<Stream>> streams_;         // guarded by mutex_
  std::map<HubKey, std::unique_ptr<HubPreparation>> hub_models_;  // guarded by mutex_, never erased
  // Nodes whose lease ends soon → the warning; guarded by mutex_.
  std::map<std::string, std::string> node_notices_;
  // Queued trials no connected node could run, as of the last placement round → why; guarded by
  // mutex_.
  std::map<int64_t, std::string> queued_notices_;
  // Attempts stopped with a checkpoint (their node's lease ends, or Cancel with `checkpoint`) →
  // why; guarded by mutex_.
  std::map<AttemptKey, std::string> checkpoint_stops_;
  // Checkpoint copies (StartCheckpointCopy) → their thread and whether it is done; guarded by
  // mutex_, joined by Stop.
  std::map<AttemptKey, std::pair<std::thread, bool>> checkpoint_copies_;
  std::thread thread_;
};

}  // namespace llmctl::controller

#endif  // LLMCTL_CONTROLLER_DISPATCHER_H_
