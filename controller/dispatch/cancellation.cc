#include "controller/dispatch/cancellation.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <map>

#include "common/text.h"
#include "common/trial_name.h"

namespace llmctl::controller::dispatch {

bool CancelRun(const DispatcherCore& core, const store::RunningAttempt& attempt,
               const std::string& node, const std::string& trial_name, v1::Agent::Stub& stub,
               std::optional<std::chrono::milliseconds> checkpoint_grace,
               grpc::ClientContext* context) {
  v1::CancelRunRequest request;
  request.mutable_key()->set_experiment_id(attempt.experiment_id);
  request.mutable_key()->set_trial(trial_name);
  request.mutable_key()->set_attempt(static_cast<int32_t>(attempt.attempt));
  if (checkpoint_grace) {
    request.set_checkpoint(true);
    request.set_checkpoint_grace_ms(checkpoint_grace->count());
  }
  v1::RunState state;
  std::unique_ptr<grpc::ClientContext> made;
  if (context == nullptr) {
    made = core.CallContext();
    context = made.get();
  }
  const grpc::Status cancelled = stub.CancelRun(context, request, &state);
  if (cancelled.error_code() == grpc::StatusCode::NOT_FOUND) return true;
  if (!cancelled.ok()) {
    spdlog::warn("{} on node {}: CancelRun failed: {}", AttemptName(attempt), node,
                 cancelled.error_message());
    return false;
  }
  return state.status() == v1::RUN_STATUS_ENDED;
}

namespace {

// A run CancelEach stops: the attempt, one node it runs on, that node's agent, and the worker's
// grace to checkpoint first (none: a plain stop).
struct RunToStop {
  const store::RunningAttempt* attempt;
  const std::string* trial_name;
  std::string node;
  std::shared_ptr<v1::Agent::Stub> stub;
  std::optional<std::chrono::milliseconds> checkpoint_grace;
};

// The attempt's runs CancelRuns stops, added to `runs`: each on a connected node, but node rank
// `except_node_rank` and the runs that have ended.
void AddRunsToStop(AgentLinks& links, const store::RunningAttempt& attempt,
                   const std::string& trial_name,
                   std::optional<std::chrono::milliseconds> checkpoint_grace,
                   std::optional<int64_t> except_node_rank, std::vector<RunToStop>& runs) {
  for (const store::AttemptNode& run : attempt.Runs()) {
    if (run.ended || run.node_rank == except_node_rank) continue;
    if (std::shared_ptr<v1::Agent::Stub> stub = links.Stub(run.node)) {
      runs.push_back({&attempt, &trial_name, run.node, std::move(stub), checkpoint_grace});
    }
  }
}

// CancelRun on each of `runs` side by side: kCancelsAtOnce workers (the calling thread one of
// them) each take the next run as their call ends. An agent answers once its run has ended (up to
// its cancel_grace and 5 s) and a silent one at the call deadline, so one after the other a node
// slow to answer held up every node after it; side by side the calls take the slowest one's time,
// not their sum. Returns once every call has ended.
void CancelEach(const DispatcherCore& core, const std::vector<RunToStop>& runs) {
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < runs.size(); i = next++) {
      CancelRun(core, *runs[i].attempt, runs[i].node, *runs[i].trial_name, *runs[i].stub,
                runs[i].checkpoint_grace);
    }
  };
  std::vector<std::thread> workers;
  for (size_t i = 1; i < std::min(runs.size(), kCancelsAtOnce); ++i) workers.emplace_back(work);
  work();
  for (std::thread& worker : workers) worker.join();
}

}  // namespace

void CancelRuns(const DispatcherCore& core, AgentLinks& links, const store::RunningAttempt& attempt,
                const std::string& trial_name,
                std::optional<std::chrono::milliseconds> checkpoint_grace,
                std::optional<int64_t> except_node_rank) {
  std::vector<RunToStop> runs;
  AddRunsToStop(links, attempt, trial_name, checkpoint_grace, except_node_rank, runs);
  CancelEach(core, runs);
}

void CancelRunsOfEach(const DispatcherCore& core, AgentLinks& links,
                      const std::vector<AttemptToStop>& attempts) {
  std::vector<RunToStop> runs;
  for (const AttemptToStop& stop : attempts) {
    AddRunsToStop(links, *stop.attempt, stop.trial_name, stop.checkpoint_grace, std::nullopt, runs);
  }
  CancelEach(core, runs);
}

void LostRuns::Keep(const store::RunningAttempt& attempt, const std::string& trial_name) {
  for (const store::AttemptNode& run : attempt.Runs()) {
    if (run.ended) continue;
    auto kept = std::make_unique<Kept>();
    kept->run = {.trial_id = attempt.trial_id,
                 .experiment_id = attempt.experiment_id,
                 .attempt = attempt.attempt,
                 .node = run.node,
                 .started_at = attempt.started_at,
                 .device_indices = run.device_indices,
                 .nodes = {}};
    kept->trial_name = trial_name;
    spdlog::warn(
        "{} on node {}: declared lost, its run may still go on there: it is asked to stop, and its "
        "devices take no trial until it is confirmed stopped",
        AttemptName(attempt), run.node);
    MutexLock lock(core_.mutex);
    kept_.push_back(std::move(kept));
  }
}

void LostRuns::ReadKeptByTheStore() {
  {
    MutexLock lock(core_.mutex);
    if (read_.ok()) return;
  }
  StatusOr<std::vector<store::LostRun>> stored = core_.store.ListLostRuns();
  MutexLock lock(core_.mutex);
  if (!stored.ok()) {
    read_ = stored.status();
    return;
  }
  for (store::LostRun& run : *stored) {
    // Those this controller lost itself before this read are kept already.
    const bool known = std::any_of(kept_.begin(), kept_.end(), [&](const auto& kept) {
      return kept->run.trial_id == run.attempt.trial_id &&
             kept->run.attempt == run.attempt.attempt && kept->run.node == run.attempt.node;
    });
    if (known) continue;
    auto kept = std::make_unique<Kept>();
    kept->run = std::move(run.attempt);
    kept->trial_name = std::move(run.trial_name);
    spdlog::warn(
        "{} on node {}: declared lost before the controller started, its run may still go on "
        "there: it is asked to stop, and its devices take no trial until it is confirmed stopped",
        AttemptName(kept->run), kept->run.node);
    kept_.push_back(std::move(kept));
  }
  read_ = Status::Ok();
}

void LostRuns::Ask() {
  ReadKeptByTheStore();
  std::vector<std::unique_ptr<Kept>> done;
  std::vector<Kept*> idle;
  size_t asking = 0;
  {
    MutexLock lock(core_.mutex);
    for (auto kept = kept_.begin(); kept != kept_.end();) {
      if ((*kept)->asking) {
        ++asking;
        ++kept;
      } else if ((*kept)->stopped || (*kept)->forgotten) {
        done.push_back(std::move(*kept));
        kept = kept_.erase(kept);
      } else {
        idle.push_back(kept->get());
        ++kept;
      }
    }
  }
  // Joined outside the lock: an ended CancelRun's thread may still be waking the round.
  for (const std::unique_ptr<Kept>& kept : done) {
    if (kept->thread.joinable()) kept->thread.join();
    if (!kept->forgotten) {
      spdlog::info("{} on node {}: the lost attempt's run is stopped; its devices are free",
                   AttemptName(kept->run), kept->run.node);
    }
  }
  for (Kept* kept : idle) {
    // The rest wait for a later round: after an upgrade the store may hand back many at once.
    if (asking == kCancelsAtOnce) break;
    std::shared_ptr<v1::Agent::Stub> stub = links_.Stub(kept->run.node);
    if (stub == nullptr) continue;
    ++asking;
    if (kept->thread.joinable()) kept->thread.join();
    {
      MutexLock lock(core_.mutex);
      kept->asking = true;
    }
    kept->thread = std::thread([this, kept, stub = std::move(stub)] { AskOne(*kept, stub); });
  }
}

void LostRuns::AskOne(Kept& kept, const std::shared_ptr<v1::Agent::Stub>& stub) {
  const std::unique_ptr<grpc::ClientContext> context = core_.CallContext();
  {
    MutexLock lock(core_.mutex);
    // Stop or ForgetNode may have cancelled the calls under way before this one was published.
    if (core_.stopping || kept.forgotten) {
      kept.asking = false;
      return;
    }
    kept.context = context.get();
  }
  const bool stopped = CancelRun(core_, kept.run, kept.run.node, kept.trial_name, *stub,
                                 std::nullopt, context.get());
  if (stopped) {
    if (Status released =
            core_.store.ReleaseLostRun(kept.run.trial_id, kept.run.attempt, kept.run.node);
        !released.ok()) {
      spdlog::warn(
          "{} on node {}: its run is stopped, but the store could not record it ({}); a "
          "restarted controller asks its agent again",
          AttemptName(kept.run), kept.run.node, released.ToString());
    }
  }
  {
    MutexLock lock(core_.mutex);
    kept.context = nullptr;
    kept.stopped = stopped;
    kept.asking = false;
  }
  // Its devices may take a trial now, not at the next health check's round.
  if (stopped) core_.Wake();
}

StatusOr<std::vector<store::RunningAttempt>> LostRuns::HoldingDevices(
    std::vector<store::RunningAttempt> running) const {
  MutexLock lock(core_.mutex);
  RETURN_IF_ERROR(read_);
  for (const std::unique_ptr<Kept>& kept : kept_) {
    if (!kept->stopped && !kept->forgotten) running.push_back(kept->run);
  }
  return running;
}

void LostRuns::ForgetNode(const std::string& node) {
  MutexLock lock(core_.mutex);
  for (const std::unique_ptr<Kept>& kept : kept_) {
    if (kept->run.node != node) continue;
    kept->forgotten = true;
    if (kept->context != nullptr) kept->context->TryCancel();
  }
}

int LostRuns::InFlight() {
  MutexLock lock(core_.mutex);
  return static_cast<int>(std::count_if(
      kept_.begin(), kept_.end(), [](const std::unique_ptr<Kept>& kept) { return kept->asking; }));
}

void LostRuns::Stop() {
  std::vector<Kept*> kept;
  {
    MutexLock lock(core_.mutex);
    for (const std::unique_ptr<Kept>& run : kept_) {
      kept.push_back(run.get());
      if (run->context != nullptr) run->context->TryCancel();
    }
  }
  for (Kept* run : kept) {
    if (run->thread.joinable()) run->thread.join();
  }
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
                         OnOneLine(trial, kMaxTrialNameBytes) + "'");
  }
  ASSIGN_OR_RETURN(
      std::vector<store::RunningAttempt> running,
      trial.empty() ? store.CancelExperiment(experiment_id) : store.CancelTrial(named->id));
  const std::optional<std::chrono::milliseconds> grace =
      checkpoint ? std::optional(core_.options.cancel_checkpoint_grace) : std::nullopt;
  std::vector<RunToStop> runs;
  for (const store::RunningAttempt& attempt : running) {
    if (checkpoint) {
      checkpoints_.MarkStopped({attempt.trial_id, attempt.attempt},
                               "cancelled with a checkpoint (llmctl cancel --checkpoint)");
    }
    // Every node of a multi-node attempt: its ranks decide a stop together at a step's start, so
    // each node's ranks stop at the same step. An unreachable one ends as cancelled when the
    // attempt is declared lost.
    AddRunsToStop(links_, attempt, names[attempt.trial_id], grace, std::nullopt, runs);
  }
  // Every attempt's every node side by side: a node slow to answer delays no other.
  CancelEach(core_, runs);
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
                         OnOneLine(trial, kMaxTrialNameBytes) + "'");
  }
  ASSIGN_OR_RETURN(store::TrialResume resume, core_.store.ResumeTrial(named->id));
  spdlog::info("trial {} of experiment {}: resuming attempt {}'s checkpoint on node {} ({})",
               named->name, experiment_id, resume.attempt, resume.node, resume.checkpoint);
  core_.changes.Notify();
  core_.Wake();
  return resume;
}

}  // namespace llmctl::controller::dispatch
