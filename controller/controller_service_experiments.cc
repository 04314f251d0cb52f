// ControllerService's handlers of submitted experiments: list, status, watch, cancel, resume and
// fetch of a trial's artifacts.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/text.h"
#include "common/trial_name.h"
#include "controller/controller_service.h"
#include "controller/device_samples_proto.h"
#include "controller/json_fields.h"

namespace llmctl::controller {
namespace {

constexpr std::chrono::milliseconds kWatchInterval{200};

}  // namespace

grpc::Status ControllerService::ListExperiments(grpc::ServerContext* context,
                                                const v1::ListExperimentsRequest*,
                                                v1::ListExperimentsResponse* response) {
  return Guard(context, "ListExperiments", [&]() -> Status {
    ASSIGN_OR_RETURN(std::vector<store::ExperimentRecord> experiments, store_.ListExperiments());
    for (const store::ExperimentRecord& experiment : experiments) {
      ASSIGN_OR_RETURN(std::vector<store::TrialRecord> trials, store_.ListTrials(experiment.id));
      v1::ExperimentSummary* summary = response->add_experiments();
      summary->set_id(experiment.id);
      summary->set_name(experiment.name);
      summary->set_filename(experiment.filename);
      summary->set_created_unix(store::UnixSeconds(experiment.created_at));
      summary->set_trials(static_cast<int32_t>(trials.size()));
      int32_t ended = 0;
      bool started = false;
      for (const store::TrialRecord& trial : trials) {
        if (store::IsOutcome(trial.state)) ++ended;
        if (trial.state != store::TrialState::kQueued) started = true;
      }
      summary->set_ended(ended);
      summary->set_state(experiment.state == store::ExperimentState::kDone ? "ended"
                         : started                                         ? "running"
                                                                           : "queued");
    }
    return Status::Ok();
  });
}

StatusOr<int64_t> ControllerService::ResolveExperimentId(int64_t requested) {
  if (requested < 0) return InvalidArgumentError("experiment id must be positive (0: the latest)");
  if (requested > 0) return requested;
  auto latest = store_.LatestExperimentId();
  if (!latest.ok() && latest.status().code() == StatusCode::kNotFound) {
    return NotFoundError("no experiment has been submitted yet");
  }
  return latest;
}

StatusOr<v1::ExperimentStatus> ControllerService::BuildStatus(int64_t experiment_id) {
  ASSIGN_OR_RETURN(store::ExperimentReport report,
                   store_.Report(experiment_id, store::ReportDetail::kStatus));
  v1::ExperimentStatus status;
  status.set_id(experiment_id);
  status.set_name(report.experiment.name);
  bool started = false;
  for (const store::TrialReport& trial : report.trials) {
    v1::TrialStatus* row = status.add_trials();
    row->set_name(trial.name);
    row->set_state(std::string(store::TrialStateName(trial.state)));
    row->set_expect(trial.expect.value_or(""));
    row->set_attempt(static_cast<int32_t>(trial.attempt));
    row->set_node(store::AttemptNodesText(trial));
    // The event counts steps from 0; a step past int64_t's last (another process's) counts none.
    if (!trial.last_step.is_null()) {
      const int64_t step = IntField(trial.last_step, "step");
      row->set_step(step >= 0 && step < std::numeric_limits<int64_t>::max() ? step + 1 : 0);
    }
    row->set_total_steps(IntField(trial.start, "total_steps"));
    const double seconds = NumberField(trial.last_step, "seconds");
    // Once the trial has ended, its run's figure; before, the latest step's (a resumed trial's run
    // also holds the earlier attempts' results).
    if (store::IsOutcome(trial.state) && trial.tokens_per_second.has_value()) {
      row->set_tokens_per_second(*trial.tokens_per_second);
    } else if (seconds > 0) {
      // A step's figures are the trainer's: a denormal time would make an infinite rate.
      const double rate = NumberField(trial.last_step, "tokens") / seconds;
      if (std::isfinite(rate)) row->set_tokens_per_second(rate);
    }
    row->set_allocated_bytes(IntField(trial.last_step, "allocated_bytes"));
    row->set_peak_bytes(std::max(IntField(trial.last_step, "peak_bytes"),
                                 IntField(trial.peak_snapshot, "peak_bytes")));
    for (const store::RankMemory& rank : trial.ranks) {
      v1::RankMemory* proto = row->add_ranks();
      proto->set_rank(rank.rank);
      proto->set_peak_bytes(rank.peak_bytes.value_or(0));
      proto->set_allocated_bytes(rank.allocated_bytes.value_or(0));
      row->set_peak_bytes(std::max(row->peak_bytes(), proto->peak_bytes()));
    }
    row->set_loss(NumberField(trial.last_step, "loss"));
    row->set_error(trial.error);
    if (trial.state == store::TrialState::kRunning) {
      // Any of a multi-node attempt's nodes may be on a lease that ends.
      for (const std::string& node :
           trial.nodes.empty() ? std::vector<std::string>{trial.node} : trial.nodes) {
        if (std::string notice = dispatcher_.NodeNotice(node); !notice.empty()) {
          row->set_notice(std::move(notice));
          break;
        }
      }
      ASSIGN_OR_RETURN(const std::vector<store::DeviceSample> devices,
                       store_.LatestDeviceSamples(trial.trial_id, trial.attempt));
      for (const store::DeviceSample& device : devices) ToProto(device, row->add_devices());
    } else if (trial.state == store::TrialState::kQueued) {
      row->set_notice(dispatcher_.QueuedNotice(trial.trial_id));
    }
    if (trial.state != store::TrialState::kQueued) started = true;
  }
  status.set_state(report.experiment.state == store::ExperimentState::kDone ? "ended"
                   : started                                                ? "running"
                                                                            : "queued");
  return status;
}

grpc::Status ControllerService::GetExperiment(grpc::ServerContext* context,
                                              const v1::GetExperimentRequest* request,
                                              v1::ExperimentStatus* response) {
  return Guard(context, "GetExperiment", [&]() -> Status {
    ASSIGN_OR_RETURN(int64_t id, ResolveExperimentId(request->experiment_id()));
    ASSIGN_OR_RETURN(*response, BuildStatus(id));
    return Status::Ok();
  });
}

grpc::Status ControllerService::Watch(grpc::ServerContext* context,
                                      const v1::GetExperimentRequest* request,
                                      grpc::ServerWriter<v1::ExperimentStatus>* writer) {
  return Guard(context, "Watch", [&]() -> Status {
    ASSIGN_OR_RETURN(int64_t id, ResolveExperimentId(request->experiment_id()));
    uint64_t seen = changes_.version();
    std::string last_sent;
    while (!context->IsCancelled()) {
      const auto built_at = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(v1::ExperimentStatus status, BuildStatus(id));
      std::string serialized = status.SerializeAsString();
      if (serialized != last_sent) {
        if (!writer->Write(status)) return CancelledError("the watcher went away");
        last_sent = std::move(serialized);
      }
      if (status.state() == "ended") return Status::Ok();
      // Bounded so that a watcher that hung up is noticed even when nothing changes. A running
      // trial's event lines change the experiment tens of times a second, and each status is the
      // whole experiment read back from the store: the watcher gets the latest at most every
      // kWatchInterval. On a CPU node the controller shares the cores with the trial it measures
      // (11-30, the 2-core Zen 4: 0.6-0.9 CPU seconds for three short trials when every change was
      // sent, 0.33 so).
      seen = changes_.WaitForChangeNotBefore(seen, std::chrono::milliseconds(500),
                                             built_at + kWatchInterval);
    }
    return CancelledError("the watcher went away");
  });
}

grpc::Status ControllerService::Cancel(grpc::ServerContext* context,
                                       const v1::CancelRequest* request,
                                       v1::CancelResponse* response) {
  return Guard(context, "Cancel", [&]() -> Status {
    ASSIGN_OR_RETURN(int64_t id, ResolveExperimentId(request->experiment_id()));
    ASSIGN_OR_RETURN(std::vector<std::string> cancelled,
                     dispatcher_.Cancel(id, request->trial(), request->checkpoint()));
    for (std::string& name : cancelled) response->add_cancelled(std::move(name));
    return Status::Ok();
  });
}

grpc::Status ControllerService::Resume(grpc::ServerContext* context,
                                       const v1::ResumeRequest* request,
                                       v1::ResumeResponse* response) {
  return Guard(context, "Resume", [&]() -> Status {
    ASSIGN_OR_RETURN(int64_t id, ResolveExperimentId(request->experiment_id()));
    if (request->trial().empty()) return InvalidArgumentError("resume: which trial?");
    ASSIGN_OR_RETURN(store::TrialResume resume, dispatcher_.Resume(id, request->trial()));
    response->set_experiment_id(id);
    response->set_trial(request->trial());
    response->set_resumes_attempt(static_cast<int32_t>(resume.attempt));
    response->set_first_step(resume.step);
    response->set_node(resume.node);
    response->set_checkpoint(resume.checkpoint);
    response->set_checkpoint_copied(!resume.tree.empty());
    return Status::Ok();
  });
}

grpc::Status ControllerService::FetchArtifacts(grpc::ServerContext* context,
                                               const v1::FetchTrialArtifactsRequest* request,
                                               grpc::ServerWriter<v1::ArtifactChunk>* writer) {
  return Guard(context, "FetchArtifacts", [&]() -> Status {
    ASSIGN_OR_RETURN(int64_t id, ResolveExperimentId(request->experiment_id()));
    ASSIGN_OR_RETURN(store::ExperimentReport report, store_.Report(id));
    auto trial =
        std::find_if(report.trials.begin(), report.trials.end(),
                     [&](const store::TrialReport& t) { return t.name == request->trial(); });
    if (trial == report.trials.end()) {
      // The caller's bytes, of any length: quoted on one line.
      return NotFoundError("experiment " + std::to_string(id) + " has no trial '" +
                           OnOneLine(request->trial(), kMaxTrialNameBytes) + "'");
    }
    if (trial->attempt == 0) {
      return FailedPreconditionError("trial '" + trial->name + "' has not run yet");
    }
    v1::RunKey key;
    key.set_experiment_id(id);
    key.set_trial(trial->name);
    key.set_attempt(static_cast<int32_t>(trial->attempt));
    return dispatcher_.FetchArtifacts(trial->node, key, [&](const v1::ArtifactChunk& chunk) {
      return !context->IsCancelled() && writer->Write(chunk);
    });
  });
}

}  // namespace llmctl::controller
