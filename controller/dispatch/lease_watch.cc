#include "controller/dispatch/lease_watch.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "common/utc_time.h"
#include "controller/dispatch/cancellation.h"

namespace llmctl::controller::dispatch {

namespace {

// "2023-11-14 22:13 UTC": how lease notices give a time.
constexpr char kNoticeTime[] = "%Y-%m-%d %H:%M UTC";

}  // namespace

void LeaseWatch::Watch(const std::vector<store::NodeRecord>& nodes,
                       const std::vector<store::RunningAttempt>& running, store::Time now) {
  const DispatcherOptions& options = core_.options;
  std::map<std::string, std::string> notices;
  std::vector<AttemptToStop> stops;
  for (const store::NodeRecord& node : nodes) {
    if (!node.lease.has_value() || now < node.lease->ends - options.lease_warning) continue;
    const std::string ends = "node " + node.name + "'s lease " + node.lease->name + " ends at " +
                             FormatUtc(node.lease->ends, kNoticeTime);
    const std::string notice =
        ends + "; its trials are stopped at " +
        FormatUtc(node.lease->ends - options.lease_stop_margin, kNoticeTime) +
        " (llmctl lease extend " + node.lease->name + " gives it more time)";
    notices[node.name] = notice;
    {
      MutexLock lock(core_.mutex);
      if (!notices_.contains(node.name)) spdlog::warn("{}", notice);
    }
    if (now < node.lease->ends - options.lease_stop_margin) continue;
    for (const store::RunningAttempt& attempt : running) {
      if (!attempt.RunsOn(node.name)) continue;
      if (!checkpoints_.MarkStopped({attempt.trial_id, attempt.attempt},
                                    ends + ": stopped before it does")) {
        continue;  // stopped already
      }
      auto trial = core_.store.GetTrial(attempt.trial_id);
      if (!trial.ok()) continue;
      spdlog::warn("{} on node {}: {}: checkpointing and stopping it", AttemptName(attempt),
                   node.name, ends);
      // What is left of the lease but the reserve; 0 (the agent's own cancel grace) when nothing
      // is left.
      const auto grace = std::max(std::chrono::milliseconds(0),
                                  std::chrono::duration_cast<std::chrono::milliseconds>(
                                      node.lease->ends - now - options.lease_stop_reserve));
      // Every node of a multi-node attempt, whose other nodes' leases may last: its ranks stop
      // together. Unreachable: the attempt is declared lost and requeued like any other.
      stops.push_back({&attempt, trial->name, grace});
    }
  }
  // Every stopped attempt's every node side by side: one after the other, each node slow to
  // answer (a checkpoint being written; a silent agent: the call deadline) held up the round, and
  // the stops after it, that long.
  CancelRunsOfEach(core_, links_, stops);
  MutexLock lock(core_.mutex);
  notices_ = std::move(notices);
}

std::string LeaseWatch::Notice(const std::string& node) {
  MutexLock lock(core_.mutex);
  auto notice = notices_.find(node);
  return notice == notices_.end() ? "" : notice->second;
}

void LeaseWatch::ForgetNode(const std::string& node) {
  MutexLock lock(core_.mutex);
  notices_.erase(node);
}

}  // namespace llmctl::controller::dispatch
