// The node's own rates (issue 39): `llm-train --probe` (the trainer the agent launches trials
// with; the agent links no LibTorch), run on a thread of its own once no trial runs, kept in
// DATA/rates.json with the fingerprint of what it measured (NodeRatesFingerprint), and reported in
// NodeInfo. A kept probe whose fingerprint still matches is reported at once (unless llmctl's
// probe of this machine differs from it: NodeRatesOptions::adoptable_probe); a changed node (its
// devices, NVIDIA driver, CPU, llm-train or LibTorch, or the threads and vector kernels its
// LibTorch takes here) measures again, and so does any node when the controller asks
// (MeasureAgain: `llmctl nodes --measure NODE`). While a probe runs no trial
// starts (StartingTrial waits for it), and a probe never starts while a trial runs: either would
// distort the other's time. A probe that found the machine busy (llm-train exits 1: its rates
// disagree, as when other work holds the cores) is measured again after
// NodeRatesOptions::retry_after's waits, each time once the node is idle; other failures would
// fail the same way again and are reported as they are.
#ifndef LLMCTL_AGENT_NODE_RATES_H_
#define LLMCTL_AGENT_NODE_RATES_H_

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "agent/node_info.h"
#include "common/mutex.h"
#include "common/status.h"

namespace llmctl::agent {

// What a probe's rates depend on, as one line: each device's type and name, the host's CPU model,
// the NVIDIA driver, llm-train's version line (which names its LibTorch and CUDA) and how its
// LibTorch computes on this CPU (its threads and kernels, which the agent's environment sets).
std::string NodeRatesFingerprint(const NodeFacts& facts);

struct NodeRatesOptions {
  std::string data_dir;   // rates.json is kept here
  std::string llm_train;  // the trainer, run with --probe
  // False: never measured (LLMCTL_RATE_PROBE=off, and tests that do not test the probe).
  bool measure = true;
  // A probe another process measured on this machine (llmctl's LLMCTL_HOME/probe.json beside its
  // embedded agent, measured again when a user deletes it): taken instead of measuring, and over
  // a kept probe that differs from it, when the node has no GPU and the file is a current probe of
  // this CPU by this llm-train, computing as it does now (its threads and kernels). "": none.
  std::string adoptable_probe;
  // How often a node with a running trial is looked at again.
  std::chrono::milliseconds idle_check{1000};
  // A probe takes about 12 s on a 2-core CPU and under 30 s on a GPU; one that runs this long is
  // killed and reported as not measured.
  std::chrono::milliseconds timeout{std::chrono::seconds(180)};
  // After a probe that found the machine busy, the wait before each further attempt (3 attempts
  // in all by default): other work on the machine, such as a build, takes minutes, and a node
  // left without rates is estimated at its data sheet's until the agent's next start.
  std::vector<std::chrono::milliseconds> retry_after{std::chrono::minutes(5),
                                                     std::chrono::minutes(30)};
};

// Thread-safe.
class NodeRates {
 public:
  // `trial_running`: whether a trial runs on the node now (RunManager::Running).
  NodeRates(NodeRatesOptions options, std::function<bool()> trial_running);
  // Stop(), then waits for the probe's thread (about 50 ms once its process group is killed).
  ~NodeRates();
  NodeRates(const NodeRates&) = delete;
  NodeRates& operator=(const NodeRates&) = delete;

  // Once the node's facts are known: the kept probe when its fingerprint is `facts`', else a
  // measurement on a thread of its own once the node is idle. Called once.
  void Start(const NodeFacts& facts);

  struct Report {
    std::string probe_json;  // llm-train --probe's JSON; "" while none is measured
    // Why there is none: "measuring", "waiting for ...", "not measured: ..." (for a busy machine
    // with "; measuring again in 5 min (attempt 2 of 3)", then "; that was attempt 3 of 3,
    // measuring again at the agent's next start").
    std::string pending;
    // A probe is measured or waited for (the node to be idle, or a busy machine's next attempt):
    // `pending` will change unasked. False once the rates are current or the last attempt failed.
    // Current() fills it in.
    bool underway = false;
  };
  Report Current() const;

  // At each health check (GetNodeInfo): takes llmctl's probe of this machine
  // (NodeRatesOptions::adoptable_probe) when the file changed since this agent last looked, it
  // would be taken at a start, and it differs from the rates reported, keeping it as Start would:
  // a user who deleted probe.json to measure again (llmctl measures it then) sees the new rates in
  // `llmctl nodes` without restarting the daemons. Nothing before Start, while a probe is
  // measured, waited for or failed, or without such a file.
  void TakeChangedLocalProbe();

  // Agent.MeasureRates: measures again once the node is idle, as at a changed node's start, with
  // the attempts a busy machine gets; the rates reported until now serve meanwhile, and on when the
  // probe fails (kept in DATA/rates.json for the next start). While a probe is measured or waited
  // for, it is that one; one waiting to retry a busy machine's probe is measured once the node is
  // idle. Returns what Current() then says is pending. FailedPrecondition when nothing is measured
  // here (LLMCTL_RATE_PROBE=off) or the rates are llmctl's probe.json (adoptable_probe: llmctl
  // measures that file again); Unavailable before Start.
  StatusOr<std::string> MeasureAgain();

  // The agent is stopping: a probe in progress is killed (its process group), a wait to measure
  // again ends, and none starts. A probe used to run to its end, up to the 3-minute timeout, with
  // the agent waiting on it after SIGTERM.
  void Stop();

  // Held by RunTrial while it starts a run: waits until a probe in progress ends, or until
  // `wait_until` (the caller's deadline: a run started after it would be one the controller never
  // learns of; the epoch: no limit but the probe's timeout); once free, keeps a probe from starting
  // until the guard goes (by then the run is listed as running).
  class StartingTrial {
   public:
    StartingTrial(NodeRates& rates, std::chrono::steady_clock::time_point wait_until);
    ~StartingTrial();
    StartingTrial(const StartingTrial&) = delete;
    StartingTrial& operator=(const StartingTrial&) = delete;

    // False when a probe still ran at `wait_until`: no trial may start now.
    bool free() const { return free_; }

   private:
    NodeRates& rates_;
    bool free_ = false;
  };

 private:
  // The probe's thread: measures on `device` once idle, again while it finds the machine busy
  // and attempts are left. Rates reported before (MeasureAgain's) serve until then, and on if it
  // fails.
  void Measure(const std::string& fingerprint, const std::string& device);
  // Starts Measure's thread (joining the last one, which has ended). Under thread_mutex_, with
  // measuring_ already set (since construction, or by MeasureAgain with its note).
  void StartMeasuring(const NodeFacts& facts) LLMCTL_REQUIRES(thread_mutex_);
  // Waits until no trial runs or starts and marks the probe as running; false when stopping.
  bool AwaitIdle();
  // After `failure`, waits options_.retry_after's wait before attempt `next_attempt` (2, 3, ...),
  // while trials may start; false when stopping.
  bool AwaitRetry(const Status& failure, int next_attempt);
  // report_ as Current() gives it: a retry's note is written with the time left now.
  std::string Pending() const LLMCTL_REQUIRES(mutex_);
  // llm-train --probe, its JSON checked with the one parser (common/estimate/rate_probe.h);
  // Unavailable when it found the machine busy (its exit 1), where measuring again may help.
  StatusOr<std::string> RunProbe(const std::string& device) const;
  // Keeps and reports a probe (measured or taken), or reports why there is none, then `then`.
  void Finish(StatusOr<std::string> probe_json, const std::string& fingerprint,
              std::string_view then = "");
  // Writes DATA/rates.json: `probe_json` under `fingerprint`, for the next start to report.
  void Keep(const std::string& probe_json, const std::string& fingerprint) const;

  const NodeRatesOptions options_;
  const std::function<bool()> trial_running_;
  mutable Mutex mutex_;
  CondVar changed_;
  Report report_ LLMCTL_GUARDED_BY(mutex_);
  // While a busy machine's probe waits to be measured again (report_.pending says why it failed):
  // which attempt comes next, and when (unset: once the running trial ends).
  struct Retry {
    int attempt = 0;
    std::optional<std::chrono::steady_clock::time_point> at;
  };
  std::optional<Retry> retry_ LLMCTL_GUARDED_BY(mutex_);
  bool probing_ LLMCTL_GUARDED_BY(mutex_) = false;
  // Measure's thread has not finished its work: it waits for the node to be idle, measures, or
  // waits to retry; and before Start, on a node that measures. Cleared by Finish, and by Start
  // when it takes the kept rates.
  bool measuring_ LLMCTL_GUARDED_BY(mutex_) = false;
  int starting_ LLMCTL_GUARDED_BY(mutex_) = 0;
  bool stopping_ LLMCTL_GUARDED_BY(mutex_) = false;
  // Start's, for TakeChangedLocalProbe; none before it.
  std::optional<NodeFacts> facts_ LLMCTL_GUARDED_BY(mutex_);
  // The adoptable file's modification time when TakeChangedLocalProbe last looked (Start's first).
  std::optional<std::filesystem::file_time_type> local_probe_seen_ LLMCTL_GUARDED_BY(mutex_);
  std::stop_source stop_;  // requested by Stop(): ends RunProbe's command
  // Held while thread_ is started or joined: Start and MeasureAgain may race.
  Mutex thread_mutex_;
  std::thread thread_ LLMCTL_GUARDED_BY(thread_mutex_);
};

}  // namespace llmctl::agent

#endif  // LLMCTL_AGENT_NODE_RATES_H_
