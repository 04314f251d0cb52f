// The controller's SQLite store: experiments, their trials, each trial's attempts and the events
// its workers wrote, agents' nodes, the digests of uploaded inputs and references to secrets. Its
// records, the values it takes and gives back, are in records.h.
//
// Plain values in, plain values out: no protobuf, no gRPC. Every operation returns Status or
// StatusOr; a Store is safe to use from several threads, and several Stores (in one or several
// processes) may open the same file: writes wait up to 5 s for each other (busy timeout), then
// fail with Unavailable.
//
// Trial life cycle:
//   queued --StartAttempt--> running --FinishAttempt--> ok | oom | diverged | failed | cancelled
//   running --MarkAttemptLost--> queued (the next StartAttempt makes attempt + 1), or cancelled
//            when the user cancelled the trial while it ran
//   running --WithdrawAttempt--> queued (nothing of it ran; the next StartAttempt reuses its
//            number), or cancelled as above
//   queued --CancelTrial/CancelExperiment--> cancelled
//   an outcome but ok --ResumeTrial--> queued (the next attempt continues from the final
//            attempt's checkpoint)
// Only a trial's current attempt may add events or finish; anything from an older attempt, or
// from the current one once it has been declared lost, is refused with FailedPrecondition (the
// fencing of stale attempts; IsFence). A database file that cannot be opened, read or written is
// Internal and a full disk ResourceExhausted, never FailedPrecondition: the same write can succeed
// once the file is fixed.
#ifndef LLMCTL_CONTROLLER_STORE_STORE_H_
#define LLMCTL_CONTROLLER_STORE_STORE_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/text.h"
#include "controller/store/records.h"

struct sqlite3;

namespace llmctl::store {

// The last sequence number an event or a device sample may have: 2^53, a line a microsecond for
// 285 years, and exact in a double, so that the next one (seq + 1, which the controller asks an
// agent to resume from) never overflows.
inline constexpr int64_t kMaxSeq = int64_t{1} << 53;

// The most bytes of an attempt's error the store keeps and a report carries, on one line
// (OnOneLine, common/text.h): an agent's error quotes its trainer's line, cut to kQuotedLineBytes,
// in a few words of its own ("rank 1 of 2: llm-train exited with code 7: ...", agent/outcome.cc),
// and a multi-node attempt's names the node before it; a hostile or older agent's, or a result
// event's, may be any length and hold escape sequences.
inline constexpr size_t kMaxErrorBytes = 2 * kQuotedLineBytes;

// Whether `status`, from a call that writes what an attempt did (AppendEvents,
// AppendDeviceSamples, FinishAttempt, FinishAttemptNode), is the fence: the attempt is stale,
// lost or ended, so nothing more of it will ever be stored. A storage failure (Internal, a full
// disk's ResourceExhausted) or a busy database (Unavailable) is not: retrying can store it.
inline bool IsFence(const Status& status) {
  return status.code() == StatusCode::kFailedPrecondition;
}

// How much of a TrialReport Store::Report fills.
enum class ReportDetail {
  kFull,
  // What a status line shows: everything but phase_peaks, memory_timeline, refused_event_lines
  // and kernel_fallbacks, which read back every snapshot of the run. A watcher rebuilds its status
  // five times a second on the node whose trial it measures.
  kStatus,
};

// The most timed runs Store::TimedRuns reads, the newest: a calibration's median moves little past
// a few hundred, and each run's prediction is a few kilobytes (at most kMaxPredictionBytes,
// controller/submission.h), so the controller's TimedRuns answer stays far under a client's 64 MiB.
inline constexpr size_t kMaxTimedRuns = 2000;

// How device samples are kept: each node's readings of the last kDeviceSampleWindow (before its
// latest reading) one by one; older ones merged per device into kDeviceSampleBucket rows.
inline constexpr std::chrono::minutes kDeviceSampleWindow{10};
inline constexpr std::chrono::seconds kDeviceSampleBucket{10};
// The highest utilisation and power a reading may give, past any device's (a CPU node's utilisation
// is 100 for each busy core): a bucket's merged row is their mean, and the sum of a few finite
// figures near a double's limit would be infinite.
inline constexpr double kMaxDeviceSampleFigure = 1e9;

// What the tables that agents fill (events, device samples) may not take of the database's
// filesystem: below it they are refused, and what else the store records (a trial's end, a
// cancel, a submission) can still be written. Less than the blobs keep (kBlobsKeepFreeBytes), so
// that a refused upload leaves the store room.
inline constexpr int64_t kStoreKeepFreeBytes = int64_t{256} << 20;
// What a row costs beyond its text, in the room check: SQLite's record header and its keys'
// index entries (an estimate; the check is a margin, not an account).
inline constexpr int64_t kRowOverheadBytes = 64;

class Store {
 public:
  // Opens or creates the database at `path`. Its directory is made 0700 when missing; one that is
  // there must be this user's and not writable by others (EnsureOwnDirectory, OthersMay::kRead:
  // never narrowed), else FailedPrecondition. The file is created with mode 0600 and narrowed to
  // 0600 if it was wider. Applies the schema migrations this build knows; FailedPrecondition when
  // the file was written by a newer llmctld (its schema version is higher), DataLoss when it is no
  // SQLite database. Events and device samples that would leave less than `keep_free_bytes`
  // available on its filesystem are refused (ResourceExhausted), as AppendEvents says.
  static StatusOr<std::unique_ptr<Store>> Open(const std::string& path,
                                               int64_t keep_free_bytes = kStoreKeepFreeBytes);
  // Opens the existing database at `path` for reading only, as a command that only looks does
  // (llmctl estimate's calibration): nothing is created or migrated. NotFound when there is no
  // file; FailedPrecondition when its schema version is not this build's (an older one is migrated
  // when llmctld next opens it).
  static StatusOr<std::unique_ptr<Store>> OpenReadOnly(const std::string& path);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // The schema version of the open database (PRAGMA user_version).
  StatusOr<int64_t> SchemaVersion();

  // Stores the experiment, its trials (all queued) and its inputs in one transaction: on any error
  // nothing is stored. InvalidArgument for a bad field (naming the trial), AlreadyExists when two
  // trials share a name. Returns the new experiment's id.
  StatusOr<int64_t> CreateExperiment(const NewExperiment& experiment, Time now);

  StatusOr<std::vector<ExperimentRecord>> ListExperiments();        // by id
  StatusOr<ExperimentRecord> GetExperiment(int64_t experiment_id);  // NotFound
  // NotFound when no experiment is stored yet.
  StatusOr<int64_t> LatestExperimentId();
  StatusOr<std::map<std::string, std::string>> GetInputs(int64_t experiment_id);

  StatusOr<std::vector<TrialRecord>> ListTrials(int64_t experiment_id);  // file order; NotFound
  StatusOr<TrialRecord> GetTrial(int64_t trial_id);                      // NotFound
  // Queued trials of all experiments, by (experiment id, file order): the scheduler's input.
  StatusOr<std::vector<TrialRecord>> NextQueuedTrials();
  // Attempts in state running, by (trial id): what a restarted controller resumes streaming.
  StatusOr<std::vector<RunningAttempt>> ListRunningAttempts();

  // Starts the next attempt of a queued trial on `node`, holding `device_indices` there (none for
  // an attempt that ends before it runs); the trial becomes running. A resumed trial's attempt
  // records that it starts at the checkpoint's step. Returns the attempt number
  // (current_attempt + 1). FailedPrecondition when the trial is not queued, or when `node` has been
  // removed (a placement that raced with RemoveNode); InvalidArgument for a negative or repeated
  // device index.
  StatusOr<int64_t> StartAttempt(int64_t trial_id, std::string_view node, Time now,
                                 const std::vector<int64_t>& device_indices = {});

  // Starts the next attempt of a queued multi-node trial on every node of `nodes` at once (node
  // rank i at index i, at least 2, distinct nodes), each holding its devices; as StartAttempt
  // otherwise, the attempt's own node being node rank 0's. InvalidArgument for nodes out of order,
  // repeated or without a name.
  StatusOr<int64_t> StartMultiNodeAttempt(int64_t trial_id, const std::vector<AttemptNode>& nodes,
                                          Time now);

  // Records how a multi-node attempt's run on node `node_rank` ended. Once every node's run has
  // ended, the attempt ends (as FinishAttempt) with the outcome that explains it best, and that
  // outcome is returned (nullopt before):
  //   - an own failure (oom, diverged), the first recorded: the other nodes' ranks only lost their
  //     peers, which they report as failed, or were stopped by the controller (cancelled);
  //   - else cancelled when the user cancelled the trial;
  //   - else the first failed node's end; else cancelled if a node's run was; else ok.
  // Its error names the node and node rank; the errors are kept as FinishAttempt keeps its error.
  // Repeating a node's end is OK; ending it differently is FailedPrecondition, as is a stale or
  // lost attempt; NotFound for a node rank it does not have.
  StatusOr<std::optional<TrialState>> FinishAttemptNode(int64_t trial_id, int64_t attempt,
                                                        int64_t node_rank, TrialState outcome,
                                                        std::optional<int64_t> exit_code,
                                                        std::string_view error, Time now);

  // Declares the trial's current, running attempt lost (its node stopped answering): the trial is
  // queued again, or cancelled when a cancel was requested while it ran; its runs that had not
  // ended are kept as lost runs (ListLostRuns). Repeating it is OK. FailedPrecondition for a stale
  // attempt or one that has ended.
  Status MarkAttemptLost(int64_t trial_id, int64_t attempt, Time now);

  // The runs of attempts declared lost (MarkAttemptLost, RemoveNode's other nodes) not yet
  // released: each run of a lost attempt that had not ended is recorded in the transaction that
  // declares the attempt lost, so a controller killed at any point after still keeps the run's
  // devices from placement once restarted. A removed node's are dropped with it. By trial,
  // attempt and node.
  StatusOr<std::vector<LostRun>> ListLostRuns();
  // The lost attempt's run on `node` holds its devices no more: its agent said it has ended or has
  // no such run. Releasing one that is not listed (again, or never lost) is OK.
  Status ReleaseLostRun(int64_t trial_id, int64_t attempt, std::string_view node);

  // Takes back the trial's current attempt when none of its runs started (a multi-node attempt's
  // node rank 0 answered RunTrial with an error before starting anything): its rows go, and the
  // trial is queued again with its attempt count as before (the next attempt gets the same
  // number), or cancelled when a cancel was requested meanwhile. FailedPrecondition when it is not
  // the trial's current, running attempt, or when anything of it was stored (an event, a device
  // sample, a node's end).
  Status WithdrawAttempt(int64_t trial_id, int64_t attempt);

  // Stores events of the trial's current attempt, in one transaction. Idempotent on
  // (trial, attempt, rank, seq): events already stored are skipped, so a stream may resume from
  // any point. Returns how many were new. FailedPrecondition "stale attempt N of trial X; current
  // is M" for any other attempt, or for the current one once declared lost; InvalidArgument for
  // seq < 1, rank < 0, a rank outside the attempt's ranks (RanksPerNode of the trial's config x
  // the attempt's nodes), an empty type or a line that is not a JSON object; DataLoss when a rank
  // above 0 is to be checked and the trial's stored config is damaged.
  // ResourceExhausted, storing nothing, when the lines would leave less than the store keeps free
  // on its filesystem (Open's keep_free_bytes): an agent that sends without end cannot fill the
  // controller's disk, and its stream, read again later, loses nothing (the agent keeps its files).
  StatusOr<int64_t> AppendEvents(int64_t trial_id, int64_t attempt, std::span<const Event> events);

  // The highest stored seq of the attempt (rank 0's), 0 when none: a stream resumes from LastSeq
  // + 1.
  StatusOr<int64_t> LastSeq(int64_t trial_id, int64_t attempt);
  // A multi-rank attempt's highest stored seq per rank above 0 (ranks without events are absent):
  // a stream resumes rank r from LastRankSeqs[r] + 1 (StreamEventsRequest.from_rank_seq).
  StatusOr<std::map<int32_t, int64_t>> LastRankSeqs(int64_t trial_id, int64_t attempt);

  // Ends the trial's current attempt with `outcome` (ok, oom, diverged, failed or cancelled),
  // which becomes the trial's state; `error`, an agent's words, is kept on one line of at most
  // kMaxErrorBytes. Repeating it with the same outcome, exit code and error is OK; a different
  // outcome for an attempt that already ended, a stale or lost attempt, or a trial that is not
  // running → FailedPrecondition.
  Status FinishAttempt(int64_t trial_id, int64_t attempt, TrialState outcome,
                       std::optional<int64_t> exit_code, std::string_view error, Time now);

  // Queues a trial that ended other than ok again, to continue from its final attempt's checkpoint
  // (the `checkpoint` of its latest `result` event; when that attempt itself continued a checkpoint
  // and wrote none, the same checkpoint again), and clears its cancel request. Its next attempts
  // then start at the checkpoint's step on the checkpoint's node. FailedPrecondition saying why
  // when it cannot: the trial has not ended or ended ok, its final attempt was lost or left no
  // checkpoint, or the checkpoint's node has been removed and the controller holds no copy of
  // it. NotFound for an unknown trial.
  StatusOr<TrialResume> ResumeTrial(int64_t trial_id);

  // Records that the controller holds the checkpoint the attempt's result names as input tree
  // `tree_digest` (stored in its blob store), whether the trial was resumed yet or is later: its
  // resume then names the tree. NotFound for an unknown attempt.
  Status SetCheckpointTree(int64_t trial_id, int64_t attempt, std::string_view tree_digest);

  // Queued trials become cancelled at once; running ones are marked cancel-requested and returned,
  // for the caller to cancel on their nodes (each then finishes as cancelled). Trials with an
  // outcome are left alone. NotFound for an unknown id.
  StatusOr<std::vector<RunningAttempt>> CancelTrial(int64_t trial_id);
  StatusOr<std::vector<RunningAttempt>> CancelExperiment(int64_t experiment_id);

  // Inserts the node with this name, or replaces all but its lease. A removed node stays removed
  // and unchanged: a health check that raced with RemoveNode does not bring it back.
  Status UpsertNode(const NodeRecord& node);
  // As UpsertNode, except that a removed node of this name comes back as a new one (without the
  // old node's lease): `llmctl node up` after `node down`.
  Status RegisterNode(const NodeRecord& node);
  // A health check's findings (devices, last seen, state) for the node of this name, when it is
  // still at the address that was checked and not removed; nothing otherwise (an UpdateNode or a
  // registration moved it while the check waited on the old address, and the next check dials
  // the new one).
  Status RecordNodeHealth(const NodeRecord& node);
  // NotFound for an unknown or removed node.
  Status SetNodeLease(std::string_view node, const NodeLease& lease);
  StatusOr<std::vector<NodeRecord>> ListNodes();  // registered (not removed) nodes, by name
  // Stores the node's own rates (llm-train --probe's JSON, which the caller has parsed), replacing
  // those it had: true when they changed, false when the same text was stored already.
  // InvalidArgument for an empty node or a text that is no JSON object.
  StatusOr<bool> PutNodeRates(std::string_view node, std::string_view probe_json, Time now);
  // The rates of each registered (not removed) node that reported some, by node name.
  StatusOr<std::map<std::string, std::string>> NodeRates();

  // Removes the node in one transaction: it is marked removed (its row stays, so attempts keep
  // naming a node the store knew; it is no longer listed), its secret reference is deleted, and
  // every attempt running on it is declared lost with MarkAttemptLost's rule (its lost runs on
  // this node, of these attempts and earlier ones, are released: ListLostRuns). Idempotent: an
  // unknown or already removed node changes nothing and says so in the result.
  StatusOr<NodeRemoval> RemoveNode(std::string_view node, Time now);

  // The name under which a secret is kept in the secrets file (never the secret itself).
  Status PutSecretRef(std::string_view name, std::string_view reference);
  StatusOr<std::string> GetSecretRef(std::string_view name);  // NotFound

  // The report rows of an experiment, from each trial's run (its final attempt and the attempts
  // it resumed from). NotFound for an unknown id.
  StatusOr<ExperimentReport> Report(int64_t experiment_id,
                                    ReportDetail detail = ReportDetail::kFull);
  // The steps of each trial's run, by trial in file order, then attempt and step: the steps of an
  // attempt that a later one resumed count up to the step the later one started at. NotFound for
  // an unknown id.
  StatusOr<std::vector<TrialStep>> RunSteps(int64_t experiment_id);
  // The newest kMaxTimedRuns trials of every experiment that ended ok with a stored prediction
  // and timed steps, oldest first. A step during which other processes took kBusyMachineShare or
  // more of the trainer's CPUs (common/machine_cpu.h) is left out, as the probe refuses such
  // rates: its time is the moment's load's, and a calibration keeps it for every later estimate.
  StatusOr<std::vector<TimedRun>> TimedRuns();

  // Stores device readings of the trial's current attempt in one transaction, then merges the
  // node's readings older than kDeviceSampleWindow before its latest one (its highest seq) into
  // kDeviceSampleBucket rows (per device and bucket: mean utilisation and power over the readings
  // that have them, highest memory and temperature). Idempotent on (trial, attempt, seq): a
  // reading whose seq is not above the attempt's highest stored one is skipped. Returns how many
  // were new. FailedPrecondition for a stale or lost attempt, as AppendEvents; InvalidArgument for
  // a bad reading (seq < 1, no device, negative memory or power, used memory above a known total, a
  // non-finite figure, a utilisation or power above kMaxDeviceSampleFigure), naming its seq;
  // nothing is stored then. The readings are those of node rank `node_rank` of the attempt (each
  // node numbers its own; InvalidArgument for a node rank the attempt does not have).
  StatusOr<int64_t> AppendDeviceSamples(int64_t trial_id, int64_t attempt,
                                        std::span<const NewDeviceSample> samples,
                                        int64_t node_rank = 0);
  // The highest stored reading's seq of the attempt's node rank `node_rank`, 0 when none: its
  // stream resumes from it + 1.
  StatusOr<int64_t> LastDeviceSampleSeq(int64_t trial_id, int64_t attempt, int64_t node_rank = 0);
  // The trial's device samples, all attempts and nodes, by time, node rank then device. NotFound
  // for an unknown experiment or trial.
  StatusOr<std::vector<DeviceSample>> DeviceSamples(int64_t experiment_id, std::string_view trial);
  // The latest row of each device of each node of the attempt (its highest seq: the last reading
  // taken, whatever its node's clock dated it), by node rank then device: what `llmctl watch`
  // draws.
  StatusOr<std::vector<DeviceSample>> LatestDeviceSamples(int64_t trial_id, int64_t attempt);

 private:
  explicit Store(sqlite3* db, std::string dir = "", int64_t keep_free_bytes = 0)
      : db_(db), dir_(std::move(dir)), keep_free_bytes_(keep_free_bytes) {}
  // ResourceExhausted, naming "<count> <rows> of trial T attempt A", when `bytes` more would leave
  // less than keep_free_bytes_ free ("" dir_: a read-only store, never).
  Status CheckRoomForRows(size_t count, std::string_view rows, int64_t trial_id, int64_t attempt,
                          int64_t bytes) const;

  Mutex mutex_;
  // One connection, used only with mutex_ held. Constant after construction.
  sqlite3* const db_ LLMCTL_GUARDED_BY(mutex_);
  const std::string dir_;  // the database file's directory
  const int64_t keep_free_bytes_;
};

}  // namespace llmctl::store

#endif  // LLMCTL_CONTROLLER_STORE_STORE_H_
