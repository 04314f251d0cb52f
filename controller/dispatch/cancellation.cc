#include "controller/dispatch/cancellation.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>

namespace llmctl::controller::dispatch {

bool CancelRun(const DispatcherCore& core, const store::RunningAttempt& attempt,
               const std::string& node, const std::string& trial_name, v1::Agent::Stub& stub,
               std::optional<std::chrono::milliseconds> checkpoint_grace) {
  v1::CancelRunRequest request;
  request.mutable_key()->set_experiment_id(attempt.experiment_id);
  request.mutable_key()->set_trial(trial_name);
  request.mutable_key()->set_attempt(static_cast<int32_t>(attempt.attempt));
  if (checkpoint_grace) {
    request.set_checkpoint(true);
    request.set_checkpoint_grace_ms(checkpoint_grace->count());
  }
  v1::RunState state;
  auto context = core.CallContext();
  const grpc::Status cancelled = stub.CancelRun(context.get(), request, &state);
  if (cancelled.error_code() == grpc::StatusCode::NOT_FOUND) return true;
  if (!cancelled.ok()) {
    spdlog::warn("{} on node {}: CancelRun failed: {}", AttemptName(attempt), node,
                 cancelled.error_message());
    return false;
  }
  return state.status() == v1::RUN_STATUS_ENDED;
}

void CancelRuns(const DispatcherCore& core, AgentLinks& links, const store::RunningAttempt& attempt,
                const std::string& trial_name,
                std::optional<std::chrono::milliseconds> checkpoint_grace,
                std::optional<int64_t> except_node_rank) {
  for (const store::AttemptNode& run : attempt.Runs()) {
    if (run.ended || run.node_rank == except_node_rank) continue;
    if (const std::shared_ptr<v1::Agent::Stub> stub = links.Stub(run.node)) {
      CancelRun(core, attempt, run.node, trial_name, *stub, checkpoint_grace);
    }
  }
}

void LostRuns::Stop(const store::RunningAttempt& attempt, const std::string& trial_name) {
  for (const store::AttemptNode& run : attempt.Runs()) {
    if (run.ended) continue;
    Kept kept{.run = {.trial_id = attempt.trial_id,
                      .experiment_id = attempt.experiment_id,
                      .attempt = attempt.attempt,
                      .node = run.node,
                      .started_at = attempt.started_at,
                      .device_indices = run.device_indices,
                      .nodes = {}},
              .trial_name = trial_name};
    if (StopOne(kept)) continue;
    spdlog::warn(
        "{} on node {}: declared lost, its run may still go on there: its devices take no "
        "trial until it is confirmed stopped",
        AttemptName(attempt), run.node);
    MutexLock lock(core_.mutex);
    kept_.push_back(std::move(kept));
  }
}

void LostRuns::StopAgain() {
  std::vector<Kept> kept;
  {
    MutexLock lock(core_.mutex);
    kept = kept_;
  }
  for (const Kept& run : kept) {
    if (!StopOne(run)) continue;
    spdlog::info("{} on node {}: the lost attempt's run is stopped; its devices are free",
                 AttemptName(run.run), run.run.node);
    MutexLock lock(core_.mutex);
    std::erase_if(kept_, [&](const Kept& other) {
      return other.run.trial_id == run.run.trial_id && other.run.attempt == run.run.attempt &&
             other.run.node == run.run.node;
    });
  }
}

bool LostRuns::StopOne(const Kept& kept) {
  const std::shared_ptr<v1::Agent::Stub> stub = links_.Stub(kept.run.node);
  return stub != nullptr &&
         CancelRun(core_, kept.run, kept.run.node, kept.trial_name, *stub, std::nullopt);
}

std::vector<store::RunningAttempt> LostRuns::HoldingDevices(
    std::vector<store::RunningAttempt> running) const {
  MutexLock lock(core_.mutex);
  for (const Kept& kept : kept_) running.push_back(kept.run);
  return running;
}

void LostRuns::ForgetNode(const std::string& node) {
  MutexLock lock(core_.mutex);
  std::erase_if(kept_, [&](const Kept& kept) { return kept.run.node == node; });
}

StatusOr<std::vector<std::string>> Cancellation::Cancel(int64_t experiment_id,
                                                        std::string_view trial, bool checkpoint) {
  store::Store& store = core_.store;
  ASSIGN_OR_RETURN(std::vector<store::TrialRecord> trials, store.ListTrials(experiment_id));
  std::vector<std::string> affected;
  std::map<int64_t, std::string> names;
  const store::TrialRecord* named = nullptr;
  for (const store::TrialRecord& record : trials) {
    names[record.id] = record.name;
    if (!trial.empty() && record.name != trial) continue;
    named = &record;
    if (!store::IsOutcome(record.state)) affected.push_back(record.name);
  }
  if (!trial.empty() && named == nullptr) {
    return NotFoundError("experiment " + std::to_string(experiment_id) + " has no trial '" +
                         std::string(trial) + "'");
  }
  ASSIGN_OR_RETURN(
      std::vector<store::RunningAttempt> running,
      trial.empty() ? store.CancelExperiment(experiment_id) : store.CancelTrial(named->id));
  for (const store::RunningAttempt& attempt : running) {
    if (checkpoint) {
      checkpoints_.MarkStopped({attempt.trial_id, attempt.attempt},
                               "cancelled with a checkpoint (llmctl cancel --checkpoint)");
    }
    // Every node of a multi-node attempt: its ranks decide a stop together at a step's start, so
    // each node's ranks stop at the same step. An unreachable one ends as cancelled when the
    // attempt is declared lost.
    CancelRuns(core_, links_, attempt, names[attempt.trial_id],
               checkpoint ? std::optional(core_.options.cancel_checkpoint_grace) : std::nullopt);
  }
  core_.changes.Notify();
  core_.Wake();
  return affected;
}

StatusOr<store::TrialResume> Cancellation::Resume(int64_t experiment_id, std::string_view trial) {
  ASSIGN_OR_RETURN(std::vector<store::TrialRecord> trials, core_.store.ListTrials(experiment_id));
  auto named = std::find_if(trials.begin(), trials.end(),
                            [&](const store::TrialRecord& record) { return record.name == trial; });
  if (named == trials.end()) {
    return NotFoundError("experiment " + std::to_string(experiment_id) + " has no trial '" +
                         std::string(trial) + "'");
  }
  ASSIGN_OR_RETURN(store::TrialResume resume, core_.store.ResumeTrial(named->id));
  spdlog::info("trial {} of experiment {}: resuming attempt {}'s checkpoint on node {} ({})",
               named->name, experiment_id, resume.attempt, resume.node, resume.checkpoint);
  core_.changes.Notify();
  core_.Wake();
  return resume;
}

}  // namespace llmctl::controller::dispatch
