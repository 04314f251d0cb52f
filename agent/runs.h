// The runs on this node: each trial attempt in its own directory, started through a supervisor
// (agent/supervisor.h) so that it survives an agent restart, and re-adopted when the agent starts.
//
//   DATA/runs/<experiment_id>/<trial, percent-encoded>/<attempt>/
//     trial.yaml        the one-trial experiment file llm-train runs
//     devices.json      the trial's device type, the node's device indices it holds, its ranks on
//                       this node and, for a multi-node trial, the node's place (nodes, node_rank)
//     events.jsonl      llm-train --events (line number = sequence number); events.rank<r>.jsonl
//                       for global rank r of a multi-rank run (a node rank K > 0 has no rank 0)
//     ranks.json        a multi-rank run's launcher record (llm-train --ranks-file)
//     samples.jsonl     the agent's device samples while it runs (agent/sample_recorder.h)
//     stdout.log, stderr.log
//     supervisor.json   the supervisor's pid and start time, the host's OOM kill count before it
//                       (written by the agent)
//     worker.json       the worker's pid, process group and start time (written by the supervisor)
//     exit.json         how the worker ended (written by the supervisor)
//     cancel_requested  present once a cancel was asked for
//     ended.json        the run's outcome (written by the agent): the run is over
//     output/           the trial's output_dir, or holds it (a relative output_dir, TrialFile)
#ifndef LLMCTL_AGENT_RUNS_H_
#define LLMCTL_AGENT_RUNS_H_

#include <sys/types.h>

#include <chrono>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/input_cache.h"
#include "agent/outcome.h"
#include "agent/process.h"
#include "common/mutex.h"
#include "common/status.h"

namespace llmctl::agent {

struct WorkerLaunch;  // agent/run_launch.h

struct RunKey {
  int64_t experiment_id = 0;
  std::string trial;
  int32_t attempt = 0;
  friend auto operator<=>(const RunKey&, const RunKey&) = default;
};

std::string DescribeRunKey(const RunKey& key);  // "experiment 3, trial 'base', attempt 1"

// The most ranks a run may have (a node's devices).
inline constexpr int kMaxRanks = 1024;

// A rank's event file in its run directory: events.jsonl for rank 0, events.rank<r>.jsonl for
// rank r (llm-train's naming).
std::string RankEventsFile(int rank);

struct RunState {
  RunKey key;
  bool ended = false;
  int64_t last_seq = 0;  // complete lines in events.jsonl (rank 0's) so far
  RunEnd end;            // when ended
  // Node rank 0 of a multi-node run: the rendezvous port its launcher bound (ranks.json); else 0,
  // or not known yet.
  int master_port = 0;
};

// Where a run sits in a multi-node trial (agent.proto's NodeGroup). nodes 1: a trial on one node.
struct NodeGroup {
  int node_rank = 0;
  int nodes = 1;
  std::string master_addr;  // node rank 0's host, for node ranks > 0
  int master_port = 0;      // 0 for node rank 0 (its launcher binds a free port), else node 0's
};

// A run's ranks on this node: global ranks first .. first + count - 1.
struct RunRanks {
  int first = 0;
  int count = 1;
};

struct RunRequest {
  RunKey key;
  std::string config_json;                          // TrialConfig::ToJson
  std::map<std::string, digest::InputTree> inputs;  // trial key -> uploaded tree
  // Trial key -> a path already on this node that replaces its value (a prepared hub model).
  std::map<std::string, std::string> local_paths;
  std::vector<int> device_indices;
  // Continue from this checkpoint directory, which `resume_run` (a run on this node) wrote or
  // resumed from, instead of starting at step 0 (llm-train --resume). Empty: from step 0.
  std::string resume_checkpoint;
  RunKey resume_run;
  // Continue from this uploaded tree instead (the controller's copy of a checkpoint another node
  // wrote): it is materialised from the cache, and resume_checkpoint and resume_run are not used.
  std::optional<digest::InputTree> resume_tree;
  NodeGroup node_group;
  // When the caller stops waiting for the answer (its call's deadline, less a margin): node rank
  // 0's wait for its rendezvous port ends by then at the latest. The epoch: after kMasterPortWait.
  std::chrono::steady_clock::time_point answer_by;
};

// A run whose worker may be running, as the device sampler needs it.
struct RunningRun {
  RunKey key;
  std::string dir;
  std::string device_type;  // "cpu" or "cuda"
  std::vector<int> device_indices;
};

// How long RunManager::Start waits for node rank 0's launcher to report its rendezvous port: the
// controller calls again when it was not known by then.
inline constexpr std::chrono::seconds kMasterPortWait{30};

// The longest grace a checkpointing cancel can give: it travels in milliseconds as a signal's int.
inline constexpr std::chrono::milliseconds kMaxCheckpointGrace{INT32_MAX};

struct RunManagerOptions {
  std::string data_dir;
  std::string llm_train;           // the worker program
  std::string supervisor_program;  // the llm-agent binary, re-executed with --supervise
  std::chrono::milliseconds cancel_grace{10000};  // SIGTERM, then SIGKILL after this
  // How often running runs are checked besides the wake-up when a supervisor exits: the check
  // that finds a supervisor whose exit the kernel cannot report (no pidfd_open).
  std::chrono::milliseconds poll_interval{100};
};

// Thread-safe.
class RunManager {
 public:
  // Scans DATA/runs: runs with ended.json are over; the others are re-adopted when their supervisor
  // still runs, finished from exit.json when it exists, and marked failed ("worker vanished")
  // otherwise. Then watches the running ones on a background thread, which wakes as soon as a
  // supervisor exits.
  static StatusOr<std::unique_ptr<RunManager>> Open(RunManagerOptions options, InputCache* cache);
  // Stops watching; workers keep running (a later Open re-adopts them).
  ~RunManager();
  RunManager(const RunManager&) = delete;
  RunManager& operator=(const RunManager&) = delete;

  // Starts the run, or returns the state of the run with that key if there is one. InvalidArgument
  // for a bad key, config, inputs or node group, and for a resume checkpoint outside the trial's
  // runs (CheckResumeCheckpoint); FailedPrecondition when an input tree's blobs (or
  // those of the resume tree) are missing, or when the run to resume from is not on this node or
  // its checkpoint is gone. For node rank 0 of a multi-node run it returns once the run's
  // master_port is known, the run ended, or kMasterPortWait or the request's answer_by passed
  // (master_port 0 then).
  StatusOr<RunState> Start(const RunRequest& request);
  // NotFound for an unknown key.
  StatusOr<RunState> Get(const RunKey& key);
  // How the run ended, waiting up to `wait` for it to end; nullopt while it runs. Cheaper than
  // Get (no look at the event file). NotFound for an unknown key.
  StatusOr<std::optional<RunEnd>> Ended(
      const RunKey& key, std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  std::vector<RunState> List();
  // The runs that have not ended, except those started before devices.json existed (their devices
  // are unknown).
  std::vector<RunningRun> Running();
  // Asks the supervisor to stop the worker (SIGTERM, SIGKILL after the grace period) and waits up
  // to the grace period plus a margin for the run to end; returns its state then. An ended run is
  // left as it is.
  StatusOr<RunState> Cancel(const RunKey& key);
  // Asks the supervisor to have the worker checkpoint its last complete step and stop (SIGUSR1;
  // SIGKILL after `grace`, or after the cancel grace when it is 0) and returns the run's state at
  // once: writing a large checkpoint takes minutes, and WaitForEnd says when it is over. An ended
  // run is left as it is. InvalidArgument for a negative `grace` or one longer than a signal can
  // carry (kMaxCheckpointGrace).
  StatusOr<RunState> CancelWithCheckpoint(const RunKey& key, std::chrono::milliseconds grace);
  // Waits up to `timeout` for the run to end; returns its state then. NotFound for an unknown key.
  StatusOr<RunState> WaitForEnd(const RunKey& key, std::chrono::milliseconds timeout);
  // The run's directory. NotFound for an unknown key.
  StatusOr<std::string> RunDir(const RunKey& key) const;
  // The run's ranks on this node (worker processes with their own event file): one, rank 0 of 1,
  // unless it is a multi-rank ddp or fsdp trial. NotFound for an unknown key.
  StatusOr<RunRanks> Ranks(const RunKey& key) const;

 private:
  struct Run {
    std::string dir;
    std::string device_type;  // "" when unknown
    std::vector<int> device_indices;
    int ranks = 1;  // on this node
    int node_rank = 0;
    int nodes = 1;
    int master_port = 0;       // node rank 0 of a multi-node run, once read from ranks.json
    pid_t supervisor_pid = 0;  // 0: unknown (the agent died before recording it)
    uint64_t supervisor_start_time = 0;
    // The host's count of the kernel's out-of-memory kills before the run started (outcome.h
    // ReadOomKillCount); nullopt when unknown.
    std::optional<uint64_t> oom_kills_at_start;
    bool is_child = false;  // started by this process: reaped here
    // Readable once the supervisor has exited (it writes exit.json first); invalid when ended or
    // when it could not be opened. Opened and closed only where the watcher cannot be polling it:
    // before the watcher starts, in Start, and by the watcher itself.
    UniqueFd supervisor_exit;
    std::optional<RunEnd> end;
    int64_t final_seq = -1;  // the event file's lines once ended (it no longer grows), -1 unknown
    // The event file counted so far (StateOf): its bytes and their complete lines.
    int64_t counted_bytes = 0;
    int64_t counted_lines = 0;
  };

  RunManager(RunManagerOptions options, InputCache* cache);
  // Start without the wait for the master port.
  StatusOr<RunState> StartRun(const RunRequest& request);
  // Trial key -> path on this node: the request's local paths and its input trees, materialised
  // from the cache.
  StatusOr<std::map<std::string, std::string>> InputPaths(const RunRequest& request) const;
  // The checkpoint the run resumes from, checked: the resume tree materialised, or the resume
  // checkpoint of a run on this node; empty when it starts at step 0.
  StatusOr<std::string> ResumeCheckpoint(const RunRequest& request) const;
  // Spawns the run's supervisor in its created directory, with `environment` (WorkerEnvironment's,
  // made before the lock); a run already ended "failed" when it cannot start.
  Run LaunchSupervisor(const WorkerLaunch& launch, const std::vector<std::string>& environment)
      LLMCTL_REQUIRES(mutex_);
  // llm-train runs as root and reads whatever --resume names, so `checkpoint` must be one the
  // trial can have: inside the output/ of one of its runs on this node (`resume_run`, run `key`'s
  // earlier attempt, wrote it, or resumed from an earlier attempt's) or a checkpoint copy in the
  // input cache that such a run resumed from. InvalidArgument otherwise, and when `resume_run` is
  // another trial's.
  Status CheckResumeCheckpoint(const RunKey& key, const RunKey& resume_run,
                               const std::string& checkpoint) const;
  Status Recover();
  void WatchLoop();
  void WakeWatcher();
  // Checks one running run and ends it when its worker is gone.
  void CheckRun(Run& run) LLMCTL_REQUIRES(mutex_);
  // Reaps the run's supervisor if this process started it and it has exited (then an ended run's
  // exit watch closes).
  void ReapSupervisor(Run& run) LLMCTL_REQUIRES(mutex_);
  void EndRun(Run& run, const RunEnd& end) LLMCTL_REQUIRES(mutex_);
  // Marks the run cancel-requested and signals its supervisor: SIGTERM, or SIGUSR1 carrying
  // `checkpoint_grace` when given.
  Status RequestCancel(Run& run, std::optional<std::chrono::milliseconds> checkpoint_grace)
      LLMCTL_REQUIRES(mutex_);
  RunState StateOf(const RunKey& key, Run& run) const LLMCTL_REQUIRES(mutex_);
  std::string RunDirFor(const RunKey& key) const;

  const RunManagerOptions options_;
  InputCache* const cache_;  // not owned

  mutable Mutex mutex_;
  CondVar ended_;  // notified when a run ends or the manager stops
  std::map<RunKey, Run> runs_ LLMCTL_GUARDED_BY(mutex_);
  bool stopping_ LLMCTL_GUARDED_BY(mutex_) = false;
  // An eventfd that wakes the watcher from poll(): a run started (a new descriptor to watch) or
  // the manager stops.
  UniqueFd wake_watcher_;
  std::thread watcher_;
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_RUNS_H_
