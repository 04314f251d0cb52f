#include "controller/dispatcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace llmctl::controller {

Dispatcher::Dispatcher(store::Store& store, const BlobStore& blobs, AgentConnector connect,
                       const Clock& clock, ChangeNotifier& changes, DispatcherOptions options)
    : core_(store, blobs, clock, changes, options),
      links_(core_, std::move(connect)),
      lost_runs_(core_, links_),
      artifacts_(core_, links_),
      checkpoints_(core_, artifacts_),
      streams_(core_, links_, checkpoints_),
      hub_models_(core_),
      deliveries_(core_),
      launcher_(core_, hub_models_, deliveries_),
      leases_(core_, links_, checkpoints_),
      placement_(core_, links_, leases_, launcher_, hub_models_),
      cancellation_(core_, links_, checkpoints_) {}

Dispatcher::~Dispatcher() { Stop(); }

void Dispatcher::Start() {
  thread_ = std::thread([this] {
    while (true) {
      Tick();
      MutexLock lock(core_.mutex);
      const auto deadline = std::chrono::steady_clock::now() + UntilNextRound();
      while (!core_.stopping && !core_.wake_requested &&
             core_.wake.WaitUntil(core_.mutex, deadline)) {
      }
      if (core_.stopping) return;
      core_.wake_requested = false;
    }
  });
}

std::chrono::milliseconds Dispatcher::UntilNextRound() const {
  const MonotonicTime now = core_.clock.Monotonic();
  MonotonicTime next = now + core_.options.health_interval;
  std::vector<MonotonicTime> due;
  links_.CollectWakeTimesLocked(due);
  streams_.CollectWakeTimesLocked(due);
  // Only times still ahead: one already past (a node no longer listed) would make rounds spin.
  for (MonotonicTime at : due) {
    if (at > now && at < next) next = at;
  }
  return std::chrono::ceil<std::chrono::milliseconds>(next - now);
}

void Dispatcher::Stop() {
  {
    MutexLock lock(core_.mutex);
    core_.stopping = true;
  }
  core_.wake.NotifyAll();
  if (thread_.joinable()) thread_.join();
  links_.Stop();
  lost_runs_.Stop();
  hub_models_.Stop();
  deliveries_.Stop();
  // The stream readers start copies: once they have stopped no copy starts.
  streams_.StopAll();
  checkpoints_.Stop();
}

void Dispatcher::Wake() { core_.Wake(); }

void Dispatcher::Tick() {
  MutexLock tick(tick_mutex_);
  store::Store& store = core_.store;
  // The wall clock for what the store records, the monotonic one for timers and silences.
  const store::Time now = core_.clock.Now();
  const MonotonicTime monotonic_now = core_.clock.Monotonic();
  auto nodes = store.ListNodes();
  if (!nodes.ok()) {
    spdlog::error("dispatcher: cannot list nodes: {}", nodes.status().ToString());
    return;
  }
  links_.CheckNodes(*nodes, now, monotonic_now);

  auto running = store.ListRunningAttempts();
  if (!running.ok()) {
    spdlog::error("dispatcher: cannot list running attempts: {}", running.status().ToString());
    return;
  }
  for (const dispatch::AttemptKey& attempt : links_.ForgottenRuns(*running)) {
    DeclareLost(attempt, *running, now);
  }
  for (const dispatch::AttemptKey& attempt : links_.SilentRuns(*running, monotonic_now)) {
    DeclareLost(attempt, *running, now);
  }
  // After the silent ones, whose streams DeclareLost stopped: an attempt is declared lost once.
  for (const dispatch::AttemptKey& attempt : streams_.RefusedRuns(*running, monotonic_now)) {
    DeclareLost(attempt, *running, now);
  }
  // The runs of attempts lost, at this round or earlier ones, asked to stop (again) off the round
  // thread.
  lost_runs_.Ask();
  running = store.ListRunningAttempts();
  if (running.ok()) leases_.Watch(*nodes, *running, now);

  running = store.ListRunningAttempts();
  // Around the lost attempts' runs not yet confirmed stopped too: their devices may still be held.
  if (running.ok()) {
    auto holding = lost_runs_.HoldingDevices(*running);
    if (holding.ok()) {
      placement_.PlaceQueued(*holding, now);
    } else {
      spdlog::error("dispatcher: places no trial: {}", holding.status().ToString());
    }
  }
  running = store.ListRunningAttempts();
  if (running.ok()) {
    streams_.Follow(*running, monotonic_now);
    checkpoints_.Reclaim(*running);
  }
}

void Dispatcher::DeclareLost(const dispatch::AttemptKey& attempt,
                             const std::vector<store::RunningAttempt>& running, store::Time now) {
  // Named, not structured bindings: the lambda below captures them, which Debian's clang 14 (the
  // thread-safety check) cannot do with bindings.
  const int64_t trial_id = attempt.first;
  const int64_t number = attempt.second;
  streams_.Stop(attempt);
  if (Status lost = core_.store.MarkAttemptLost(trial_id, number, now); !lost.ok()) {
    spdlog::warn("{}: {}", dispatch::AttemptName(trial_id, number), lost.ToString());
  }
  auto lost = std::find_if(running.begin(), running.end(), [&](const store::RunningAttempt& a) {
    return a.trial_id == trial_id && a.attempt == number;
  });
  if (lost != running.end()) StopRuns(*lost);
  core_.changes.Notify();
}

void Dispatcher::StopRuns(const store::RunningAttempt& attempt) {
  auto trial = core_.store.GetTrial(attempt.trial_id);
  if (!trial.ok()) return;
  lost_runs_.Keep(attempt, trial->name);
}

StatusOr<store::NodeRemoval> Dispatcher::RemoveNode(const std::string& node) {
  ASSIGN_OR_RETURN(store::NodeRemoval removal, core_.store.RemoveNode(node, core_.clock.Now()));
  links_.Disconnect(node);
  for (const store::RunningAttempt& attempt : removal.lost) {
    spdlog::warn("node {} removed: {} is lost and requeued", node, dispatch::AttemptName(attempt));
    streams_.Stop({attempt.trial_id, attempt.attempt});
    if (!attempt.nodes.empty()) StopRuns(attempt);  // its runs on the other nodes
  }
  lost_runs_.ForgetNode(node);
  leases_.ForgetNode(node);
  hub_models_.ForgetNode(node);
  deliveries_.ForgetNode(node);
  if (removal.result == store::NodeRemoval::Result::kRemoved) {
    spdlog::info("node {} removed ({} running attempts requeued)", node, removal.lost.size());
  }
  core_.changes.Notify();
  Wake();
  return removal;
}

void Dispatcher::NodeCredentialsChanged(const std::string& node) {
  links_.Disconnect(node);
  // The readers hold the old link's stub: stopped, they are reopened by a round once the new link
  // is connected, from the last stored line.
  if (auto running = core_.store.ListRunningAttempts(); running.ok()) {
    for (const store::RunningAttempt& attempt : *running) {
      if (attempt.RunsOn(node)) streams_.Stop({attempt.trial_id, attempt.attempt});
    }
  } else {
    spdlog::error("node {}: cannot list its running attempts to stop their old streams: {}", node,
                  running.status().ToString());
  }
  hub_models_.ForgetNode(node);
  deliveries_.ForgetNode(node);
  Wake();
}

StatusOr<std::vector<std::string>> Dispatcher::Cancel(int64_t experiment_id, std::string_view trial,
                                                      bool checkpoint) {
  return cancellation_.Cancel(experiment_id, trial, checkpoint);
}

StatusOr<store::TrialResume> Dispatcher::Resume(int64_t experiment_id, std::string_view trial) {
  return cancellation_.Resume(experiment_id, trial);
}

Status Dispatcher::FetchArtifacts(const std::string& node, const v1::RunKey& key,
                                  const std::function<bool(const v1::ArtifactChunk&)>& sink,
                                  const std::string& path) {
  return artifacts_.Fetch(node, key, sink, path);
}

int Dispatcher::ActiveStreams() { return streams_.Active(); }
int Dispatcher::HubPreparationsInFlight() { return hub_models_.InFlight(); }
int Dispatcher::HubPreparationsHeld() { return hub_models_.Held(); }
int Dispatcher::BlobDeliveriesInFlight() { return deliveries_.InFlight(); }
int Dispatcher::BlobDeliveriesHeld() { return deliveries_.Held(); }
int Dispatcher::CheckpointCopiesInFlight() { return checkpoints_.InFlight(); }
int Dispatcher::LostRunCancelsInFlight() { return lost_runs_.InFlight(); }
int Dispatcher::CheckpointCopiesHeld() { return checkpoints_.Held(); }
std::string Dispatcher::NodeNotice(const std::string& node) { return leases_.Notice(node); }
std::string Dispatcher::NodeUnusable(const std::string& node) { return links_.Unusable(node); }
dispatch::RatesNote Dispatcher::NodeRatesPending(const std::string& node) {
  return links_.RatesPending(node);
}
StatusOr<std::string> Dispatcher::MeasureNodeRates(const std::string& node) {
  return links_.MeasureRates(node);
}
std::string Dispatcher::QueuedNotice(int64_t trial_id) { return placement_.QueuedNotice(trial_id); }

}  // namespace llmctl::controller
