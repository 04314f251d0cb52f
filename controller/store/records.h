// The store's records: the plain values that Store (store.h) takes and gives back (experiments,
// trials, attempts, events, nodes, the report's rows, device samples) and the time they are dated
// by. No SQLite and no Store here: code that only passes these values on needs nothing more.
#ifndef LLMCTL_CONTROLLER_STORE_RECORDS_H_
#define LLMCTL_CONTROLLER_STORE_RECORDS_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace llmctl::store {

// Stored with millisecond resolution.
using Time = std::chrono::system_clock::time_point;

// The last second a Time holds with room (the end of the year 2261): it counts nanoseconds in an
// int64, which wrap past about 9.22e9 seconds (April 2262). A time another process sends is
// checked against it. (The end of the year 9999, as it was, wrapped.)
inline constexpr int64_t kMaxUnixSeconds = 9'214'646'399;
inline constexpr int64_t kMaxUnixMillis = kMaxUnixSeconds * 1000;

// Whole seconds since the Unix epoch: what the API's and the secrets' times carry.
inline int64_t UnixSeconds(Time time) {
  return std::chrono::duration_cast<std::chrono::seconds>(time.time_since_epoch()).count();
}

enum class TrialState { kQueued, kRunning, kOk, kOom, kDiverged, kFailed, kCancelled };
// "queued", "running", "ok", "oom", "diverged", "failed", "cancelled".
std::string_view TrialStateName(TrialState state);
// InvalidArgument naming the allowed values for anything else.
StatusOr<TrialState> ParseTrialState(std::string_view name);
// True for the outcomes: every state but queued and running.
bool IsOutcome(TrialState state);

struct NewTrial {
  std::string name;  // unique within the experiment
  std::string description;
  std::string config_json;            // TrialConfig::ToJson
  std::optional<std::string> expect;  // "ok" or "oom" when the file states what should happen
  std::string device_type;            // "cpu" or "cuda"
  int64_t device_count = 1;           // >= 1
  // The estimate's prediction (a JSON object, schema.cc's kTrialPredictions); nullopt when none.
  std::optional<std::string> prediction_json;
};

struct NewExperiment {
  std::string name;
  std::string filename;  // as the user gave it, for messages and the report
  std::string yaml_text;
  std::string description;
  std::map<std::string, std::string> target;
  std::vector<NewTrial> trials;  // in file order; at least one
  // Inputs uploaded with the experiment: the path as the file writes it → content digest.
  std::map<std::string, std::string> inputs;
};

enum class ExperimentState { kActive, kDone };                // done: every trial has an outcome
std::string_view ExperimentStateName(ExperimentState state);  // "active", "done"

struct ExperimentRecord {
  int64_t id = 0;
  std::string name;
  std::string filename;
  std::string yaml_text;
  std::string description;
  std::map<std::string, std::string> target;
  Time created_at;
  ExperimentState state = ExperimentState::kActive;
};

// Where a resumed trial's attempts start: the checkpoint an earlier attempt left (ResumeTrial).
struct TrialResume {
  int64_t attempt = 0;     // the attempt whose checkpoint it is
  std::string node;        // where that attempt ran: the checkpoint is on its disk
  std::string checkpoint;  // the checkpoint's directory there
  int64_t step = 0;        // the steps it holds: the first step (from 0) the next attempt runs
  // The controller's copy of the checkpoint (an input tree's digest in its blob store, recorded
  // with SetCheckpointTree), so any node may continue it; empty while there is none, and then only
  // `node` can.
  std::string tree;

  bool operator==(const TrialResume&) const = default;
};

struct TrialRecord {
  int64_t id = 0;
  int64_t experiment_id = 0;
  int64_t ordinal = 0;  // position in the experiment file, from 0
  std::string name;
  std::string description;
  std::string config_json;
  std::optional<std::string> expect;
  std::string device_type;
  int64_t device_count = 1;
  TrialState state = TrialState::kQueued;
  int64_t current_attempt = 0;  // 0 before the first attempt
  bool cancel_requested = false;
  // Set once the trial was resumed: its next attempts continue from this checkpoint.
  std::optional<TrialResume> resume;
  std::optional<std::string> prediction_json;  // as submitted (NewTrial)
};

// One node of a multi-node attempt (the trial key `nodes` > 1).
struct AttemptNode {
  int64_t node_rank = 0;  // 0 .. nodes - 1; node rank 0 hosts the ranks' rendezvous
  std::string node;
  std::vector<int64_t> device_indices;  // ascending
  bool ended = false;                   // its run has ended (FinishAttemptNode)
};

// An attempt that is running on a node (or was, before the controller restarted).
struct RunningAttempt {
  int64_t trial_id = 0;
  int64_t experiment_id = 0;
  int64_t attempt = 0;
  std::string node;
  Time started_at;
  // The device indices it holds on `node`, ascending; empty when unknown (started by a controller
  // that did not record them).
  std::vector<int64_t> device_indices;
  // A multi-node attempt's every node in node-rank order (nodes[0] is `node` with the same
  // devices); empty for an attempt on one node.
  std::vector<AttemptNode> nodes;

  // Its runs, node rank 0's first: every node of a multi-node attempt, else its one node (node
  // rank 0 with `device_indices`).
  std::vector<AttemptNode> Runs() const {
    if (!nodes.empty()) return nodes;
    return {{.node_rank = 0, .node = node, .device_indices = device_indices, .ended = false}};
  }
  // Whether any of its runs is on `name`.
  bool RunsOn(std::string_view name) const {
    if (node == name) return true;
    for (const AttemptNode& other : nodes) {
      if (other.node == name) return true;
    }
    return false;
  }
};

// A run of an attempt declared lost that may still go on on its node, holding its devices there
// until the controller confirms it stopped (Store::ListLostRuns).
struct LostRun {
  // The attempt on this one node: its `node` and the `device_indices` it holds there (empty when
  // unknown, as RunningAttempt's); no `nodes`.
  RunningAttempt attempt;
  std::string trial_name;  // for the run's key on its agent
};

// One line of a worker's event file.
struct Event {
  int64_t seq = 0;   // 1-based line number in its rank's event file
  std::string type;  // the line's "type": start, snapshot, step, log, checkpoint, result
  std::string json;  // the whole line, a JSON object
  // The rank that wrote it: 0 for a one-process trial and rank 0 (the `events` table), r >= 1 for
  // rank r of a multi-rank trial (`rank_events`).
  int32_t rank = 0;
};

// The cloud lease a node runs on.
struct NodeLease {
  std::string name;
  std::string site;
  std::string flavor;  // or the bare-metal node type
  Time ends;

  bool operator==(const NodeLease&) const = default;
};

struct NodeRecord {
  std::string name;
  std::string address;  // empty: not yet known, not dialled
  std::string devices_json;
  Time last_seen;
  std::string state;               // the controller's word for it, e.g. "connected"
  std::optional<NodeLease> lease;  // read only: UpsertNode keeps it, SetNodeLease sets it
};

// What RemoveNode did.
struct NodeRemoval {
  enum class Result {
    kRemoved,         // the node was registered and is removed now
    kAlreadyRemoved,  // an earlier RemoveNode removed it (at removed_at)
    kUnknown,         // no node of that name was ever registered
  };
  Result result = Result::kUnknown;
  std::optional<Time> removed_at;  // kRemoved: now; kAlreadyRemoved: then
  // The attempts that were running on the node, now declared lost exactly as MarkAttemptLost
  // does: each trial is queued again (or cancelled when a cancel was requested while it ran).
  std::vector<RunningAttempt> lost;
};

// One attempt of a trial's run on the memory-over-time axis (the `trial_memory_timeline` view).
struct AttemptMemory {
  int64_t attempt = 0;
  // From the attempt's latest `start` event: the wall clock of the trainer's start (the zero of
  // its snapshots' elapsed_ms) and its device limit; nullopt without one.
  std::optional<int64_t> started_unix_ms;
  std::optional<int64_t> device_limit_bytes;
  std::vector<nlohmann::json> snapshots;  // its `snapshot` events, in order
  // When the trainer ended, on the snapshots' clock: its latest `result` event's elapsed_ms.
  std::optional<double> ended_elapsed_ms;
  // A multi-node attempt's node rank k > 0 -> when rank 0's trainer started, read on node k's
  // clock, which its device samples are dated by: its first rank's latest `start` event's
  // started_unix_ms + ranks_met_elapsed_ms (when the ranks met, on node k's clock) less rank 0's
  // ranks_met_elapsed_ms. Not node k's own start, which comes after rank 0's by node k's later
  // launch. No entry for a node whose start event, or when rank 0's, does not say when they met.
  std::map<int64_t, int64_t> node_started_unix_ms;
};

// One rank's memory over a multi-rank trial's run.
struct RankMemory {
  int32_t rank = 0;
  std::optional<int64_t> peak_bytes;       // the highest of its snapshots' and results' peak
  std::optional<int64_t> allocated_bytes;  // the most allocated bytes of one of its snapshots
  // (phase, the most allocated bytes of the phase's snapshots), in the step anatomy's order.
  std::vector<std::pair<std::string, int64_t>> phase_allocated;
};

// A fused op that ran ATen's composition instead of its kernel (a kernel_fallback event).
struct KernelFallback {
  std::string op;
  std::string reason;
  int64_t step = 0;
  int rank = 0;
};

// One trial's row of the report: its row of the `trial_results` view and its rows of
// `trial_phase_peaks` (controller/store/schema.cc states their rules: figures from the trial's
// run, "at peak" = the snapshot with the most allocated bytes, ...), and the final attempt's
// latest `start` and `step` events for a trial's progress while it runs. Event objects are the
// trainer's JSON lines as stored (README, "llm-train", --events); null when there is none.
struct TrialReport {
  int64_t trial_id = 0;
  std::string name;
  std::optional<std::string> expect;
  TrialState state = TrialState::kQueued;
  int64_t attempt = 0;  // the final attempt; 0 when the trial never started
  // The attempts whose events make up the figures: the final one, preceded by those it resumed
  // from; empty before the first attempt.
  std::vector<int64_t> run_attempts;
  std::string node;  // its current attempt's (a multi-node attempt's node rank 0)
  // A multi-node attempt's every node in node-rank order; empty for an attempt on one node.
  std::vector<std::string> nodes;
  std::optional<int64_t> exit_code;
  // Recorded when the attempt ended, else its result's; "" when none. One line of at most
  // kMaxErrorBytes.
  std::string error;
  // nullopt when the attempt has no `result` (or `start`) event with the figure.
  std::optional<double> train_seconds;
  std::optional<double> tokens_per_second;
  std::optional<double> final_loss;
  std::optional<int64_t> peak_bytes;  // the higher of the result's and the at-peak snapshot's
  std::optional<int64_t> load_peak_bytes;
  nlohmann::json start;          // the `start` event (total_steps, parameter counts, ...)
  nlohmann::json last_step;      // the `step` event with the highest seq (step, loss, ...)
  nlohmann::json peak_snapshot;  // the `snapshot` event at peak
  // (phase, that phase's snapshot at peak), in the step anatomy's order, "oom" last.
  std::vector<std::pair<std::string, nlohmann::json>> phase_peaks;
  // Every rank's memory (trial_rank_peaks, trial_rank_phase_peaks), rank 0 first, when the run has
  // events of a rank above 0 (a multi-rank trial); empty otherwise. The figures above are rank 0's.
  std::vector<RankMemory> ranks;
  // The run's attempts in order (run_attempts), each with its snapshots.
  std::vector<AttemptMemory> memory_timeline;
  // Event lines of the trial's attempts, every rank's, that broke the event-line rule and were
  // stored as their refused_line replacement (common/event_line.h).
  int64_t refused_event_lines = 0;
  // The current attempt's kernel_fallback events, every rank's (common/kernel_fallback_event.h).
  std::vector<KernelFallback> kernel_fallbacks;
};

// Where a trial's current attempt runs, as the CLI shows it: its node, or a multi-node attempt's
// nodes in node-rank order, "n1+n2".
std::string AttemptNodesText(const TrialReport& trial);

struct ExperimentReport {
  ExperimentRecord experiment;
  std::vector<TrialReport> trials;  // in file order
};

// A trial that ended ok, submitted with a prediction, and its timed steps: what a time
// calibration rests on (the prediction holds the step's work and the device it was predicted on).
struct TimedRun {
  std::string prediction_json;
  // The median step's seconds per token (all ranks' tokens; the upper of the two middle steps for
  // an even count), over the steps from the second on: the first creates the optimizer's state,
  // and a step slowed by something else on the machine does not move the median.
  double seconds_per_token = 0;
  int64_t steps = 0;  // how many steps that is the median of (at least 1; the quiet ones)
  // The median of those steps' pace canary seconds (the upper of the two middle ones), those that
  // are a finite positive number: the machine's pace while the run ran, as the trainer wrote it
  // (the reader checks its range); 0 where none had one.
  double pace_seconds = 0;
};

// One optimizer step of a trial's run (the `trial_steps` view).
struct TrialStep {
  int64_t trial_id = 0;
  int64_t attempt = 0;
  int64_t step = 0;  // from 0
  std::optional<double> loss;
  std::optional<int64_t> tokens;
  std::optional<double> seconds;
  // The share of the trainer's CPUs' time other processes took during the step, as the trainer
  // wrote it (a one-process trial's, since 12-03); the reader checks its range.
  std::optional<double> others_cpu_share;
  // The seconds of the trainer's pace canary after the step (a one-process CPU trial's, since
  // 12-07), as the trainer wrote it; the reader checks its range.
  std::optional<double> pace_seconds;
};

// One device's reading during an attempt of a trial, as the node's agent took it once a second
// (agent/device_sampler.h), or, for the part of a run older than the full-resolution window, the
// readings of one bucket merged into one row (Store::AppendDeviceSamples says which window and
// bucket): the mean utilisation and power, the highest memory and temperature.
struct DeviceSample {
  int64_t attempt = 0;
  // The node of the attempt that read it: 0 for a single-node attempt's, else the node rank of a
  // multi-node attempt's node.
  int64_t node_rank = 0;
  // "cuda:N" (N: the node's device index), or "cpu": the trial's processes on a CPU node.
  std::string device;
  Time time;          // when it was read; for a merged row the start of its bucket
  int64_t count = 1;  // readings in this row: 1, or more for a merged row
  // GPU: NVML's utilisation, 0-100. CPU: the trial's processes' CPU time over wall time in
  // percent of one core (180 = 1.8 cores busy). nullopt when not read (a CPU's first reading).
  std::optional<double> utilization_percent;
  // GPU: memory in use on the device (by any process). CPU: the trial's processes' resident set.
  int64_t memory_used_bytes = 0;
  int64_t memory_total_bytes = 0;             // the device's memory; on CPU the host's MemTotal
  std::optional<double> power_watts;          // GPU only
  std::optional<double> temperature_celsius;  // GPU only

  bool operator==(const DeviceSample&) const = default;
};

// A reading as the agent sent it: `seq` is its line in the run's samples file (1-based), which
// makes ingestion idempotent (AppendDeviceSamples).
struct NewDeviceSample {
  int64_t seq = 0;
  DeviceSample sample;  // its `attempt` and `count` are not read
};

}  // namespace llmctl::store

#endif  // LLMCTL_CONTROLLER_STORE_RECORDS_H_
