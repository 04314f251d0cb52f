#include "controller/controller_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string_view>

#include "common/digest/digest.h"
#include "common/snapshot_event.h"
#include "controller/device_samples_proto.h"
#include "controller/node_certificates.h"
#include "controller/submission.h"
#include "rpc/grpc_status.h"

namespace llmctl::controller {

using nlohmann::json;

grpc::Status ControllerService::Guard(const grpc::ServerContext* context, std::string_view method,
                                      const std::function<Status()>& body) const {
  if (!api_token_.empty()) {
    grpc::Status authenticated = rpc::CheckBearerToken(context->client_metadata(), api_token_);
    if (!authenticated.ok()) {
      spdlog::warn("{} from {}: refused: {}", method, context->peer(),
                   authenticated.error_message());
      return authenticated;
    }
  }
  try {
    return rpc::ToGrpcStatus(body());
  } catch (const std::exception& e) {
    spdlog::error("{}: unexpected exception: {}", method, e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(method) + ": " + e.what());
  }
}

namespace {

int64_t IntField(const json& object, std::string_view key) {
  if (!object.is_object()) return 0;
  auto it = object.find(std::string(key));
  return it != object.end() && it->is_number() ? it->get<int64_t>() : 0;
}

double NumberField(const json& object, std::string_view key) {
  if (!object.is_object()) return 0;
  auto it = object.find(std::string(key));
  return it != object.end() && it->is_number() ? it->get<double>() : 0;
}

std::string StringField(const json& object, std::string_view key) {
  if (!object.is_object()) return "";
  auto it = object.find(std::string(key));
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

v1::MemorySnapshot ToSnapshot(const json& snapshot) {
  namespace field = snapshot_event;
  v1::MemorySnapshot proto;
  proto.set_step(IntField(snapshot, field::kStep));
  proto.set_micro_batch(static_cast<int32_t>(IntField(snapshot, field::kMicroBatch)));
  proto.set_phase(StringField(snapshot, field::kPhase));
  proto.set_params_bytes(IntField(snapshot, field::kParamsBytes));
  proto.set_grads_bytes(IntField(snapshot, field::kGradsBytes));
  proto.set_optim_device_bytes(IntField(snapshot, field::kOptimDeviceBytes));
  proto.set_optim_host_bytes(IntField(snapshot, field::kOptimHostBytes));
  proto.set_other_bytes(IntField(snapshot, field::kOtherBytes));
  proto.set_allocated_bytes(IntField(snapshot, field::kAllocatedBytes));
  proto.set_peak_bytes(IntField(snapshot, field::kPeakBytes));
  proto.set_reserved_bytes(IntField(snapshot, field::kReservedBytes));
  proto.set_elapsed_ms(NumberField(snapshot, field::kElapsedMs));
  proto.set_comm_bytes(IntField(snapshot, field::kCommBytes));
  proto.set_gathered_bytes(IntField(snapshot, field::kGatheredBytes));
  return proto;
}

// The trial's run's attempts for memory over time: each with its snapshots and, of `samples` (the
// trial's, every attempt's), its own.
void AddMemoryTimeline(const store::TrialReport& trial,
                       const std::vector<store::DeviceSample>& samples, v1::TrialReport& row) {
  std::map<int64_t, v1::AttemptMemory*> by_attempt;
  for (const store::AttemptMemory& attempt : trial.memory_timeline) {
    v1::AttemptMemory* proto = row.add_memory_timeline();
    by_attempt[attempt.attempt] = proto;
    proto->set_attempt(static_cast<int32_t>(attempt.attempt));
    proto->set_started_unix_ms(attempt.started_unix_ms.value_or(0));
    proto->set_device_limit_bytes(attempt.device_limit_bytes.value_or(0));
    for (const json& snapshot : attempt.snapshots) *proto->add_snapshots() = ToSnapshot(snapshot);
    proto->set_ended_elapsed_ms(attempt.ended_elapsed_ms.value_or(0));
  }
  for (const store::DeviceSample& sample : samples) {
    auto attempt = by_attempt.find(sample.attempt);
    if (attempt == by_attempt.end()) continue;  // a lost attempt, not part of the run
    v1::DeviceMemorySample* proto = attempt->second->add_device_samples();
    proto->set_device(sample.device);
    proto->set_node_rank(static_cast<int32_t>(sample.node_rank));
    proto->set_unix_ms(
        std::chrono::duration_cast<std::chrono::milliseconds>(sample.time.time_since_epoch())
            .count());
    proto->set_memory_used_bytes(sample.memory_used_bytes);
    proto->set_memory_total_bytes(sample.memory_total_bytes);
  }
}

digest::InputTree FromProto(const v1::InputTree& tree) {
  digest::InputTree spec{.digest = tree.digest(), .files = {}, .is_file = tree.is_file()};
  for (const v1::TreeFile& file : tree.files()) {
    spec.files.push_back({file.path(), file.sha256(), file.size()});
  }
  return spec;
}

Status ValidateAgentAddress(std::string_view address) {
  if (address.starts_with("unix:")) {
    if (address.size() > 5 && address[5] == '/') return Status::Ok();
  } else if (const size_t colon = address.rfind(':');
             colon != std::string_view::npos && colon > 0 && colon + 1 < address.size() &&
             address.find_first_of(" \t\n") == std::string_view::npos) {
    return Status::Ok();
  }
  return InvalidArgumentError("register node: address '" + std::string(address) +
                              "' is neither host:port nor unix:/absolute/path");
}

}  // namespace

Status ValidateNodeName(std::string_view name) {
  const bool good_length = !name.empty() && name.size() <= 63;
  const bool good_chars = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  });
  if (!good_length || !good_chars || name.front() == '-' || name.back() == '-') {
    return InvalidArgumentError("node name '" + std::string(name) +
                                "': use 1 to 63 letters, digits and '-' (not at either end)");
  }
  return Status::Ok();
}

ControllerService::ControllerService(store::Store& store, const BlobStore& blobs,
                                     SecretsFile& secrets, const rpc::CertificateAuthority& ca,
                                     Dispatcher& dispatcher, const ChangeNotifier& changes,
                                     const Clock& clock, std::string api_token,
                                     rpc::TlsIdentity controller_identity)
    : store_(store),
      blobs_(blobs),
      secrets_(secrets),
      ca_(ca),
      dispatcher_(dispatcher),
      changes_(changes),
      clock_(clock),
      api_token_(std::move(api_token)),
      controller_identity_(std::move(controller_identity)) {}

grpc::Status ControllerService::MissingBlobs(grpc::ServerContext* context,
                                             const v1::MissingBlobsRequest* request,
                                             v1::MissingBlobsResponse* response) {
  return Guard(context, "MissingBlobs", [&]() -> Status {
    const std::vector<std::string> wanted(request->sha256().begin(), request->sha256().end());
    ASSIGN_OR_RETURN(std::vector<std::string> missing, blobs_.Missing(wanted));
    for (std::string& sha256 : missing) response->add_sha256(std::move(sha256));
    return Status::Ok();
  });
}

grpc::Status ControllerService::UploadBlob(grpc::ServerContext* context,
                                           grpc::ServerReader<v1::BlobChunk>* reader,
                                           v1::UploadBlobResponse* response) {
  return Guard(context, "UploadBlob", [&]() -> Status {
    v1::BlobChunk chunk;
    if (!reader->Read(&chunk)) return InvalidArgumentError("upload: no chunk arrived");
    const std::string sha256 = chunk.sha256();
    response->set_sha256(sha256);
    if (blobs_.Has(sha256)) {
      while (reader->Read(&chunk)) {
      }
      response->set_already_present(true);
      return Status::Ok();
    }
    ASSIGN_OR_RETURN(std::unique_ptr<digest::VerifiedFileWriter> writer,
                     blobs_.BeginWrite(sha256, chunk.size()));
    do {
      if (!chunk.sha256().empty() && chunk.sha256() != sha256) {
        return InvalidArgumentError("upload of " + sha256 + ": a later chunk names another blob");
      }
      RETURN_IF_ERROR(writer->Append(chunk.data()));
    } while (reader->Read(&chunk));
    return writer->Commit(sha256);
  });
}

grpc::Status ControllerService::Submit(grpc::ServerContext* context,
                                       const v1::SubmitRequest* request,
                                       v1::SubmitResponse* response) {
  return Guard(context, "Submit", [&]() -> Status {
    std::map<std::string, digest::InputTree> inputs;
    for (const auto& [path, tree] : request->inputs()) {
      if (path.empty()) return InvalidArgumentError("submit: an input has an empty path");
      inputs[path] = FromProto(tree);
    }
    ASSIGN_OR_RETURN(
        store::NewExperiment experiment,
        PrepareSubmission(request->yaml_text(), request->filename(), inputs, blobs_,
                          {request->only_trials().begin(), request->only_trials().end()}));
    std::map<std::string, json> predictions;
    for (const auto& [name, prediction] : request->predictions()) {
      predictions[name] = {{"peak_bytes", prediction.peak_bytes()},
                           {"activation_bytes", prediction.activation_bytes()},
                           {"model_state_bytes", prediction.model_state_bytes()},
                           {"peak_phase", prediction.peak_phase()},
                           {"device_memory_bytes", prediction.device_memory_bytes()},
                           {"verdict", prediction.verdict()}};
      if (prediction.step_seconds() > 0) {
        json& p = predictions[name];
        p["step_seconds"] = prediction.step_seconds();
        p["tokens_per_second"] = prediction.tokens_per_second();
        p["trial_seconds"] = prediction.trial_seconds();
        p["time_device"] = prediction.time_device();
        p["calibration"] = prediction.calibration();
        p["work"] = json::parse(prediction.work_json(), nullptr, /*allow_exceptions=*/false);
      }
    }
    RETURN_IF_ERROR(AttachPredictions(predictions, experiment));
    for (const auto& [path, tree] : inputs) {
      RETURN_IF_ERROR(blobs_.PutTree(tree).WithContext("input '" + path + "'"));
    }
    ASSIGN_OR_RETURN(int64_t id, store_.CreateExperiment(experiment, clock_.Now()));
    spdlog::info("experiment {} ({}, {} trials) submitted from {}", id, experiment.name,
                 experiment.trials.size(), experiment.filename);
    response->set_experiment_id(id);
    response->set_name(experiment.name);
    for (const store::NewTrial& trial : experiment.trials) response->add_trials(trial.name);
    dispatcher_.Wake();
    return Status::Ok();
  });
}

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
      summary->set_created_unix(
          std::chrono::duration_cast<std::chrono::seconds>(experiment.created_at.time_since_epoch())
              .count());
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
  ASSIGN_OR_RETURN(store::ExperimentReport report, store_.Report(experiment_id));
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
    row->set_node(trial.node);
    if (!trial.last_step.is_null()) row->set_step(IntField(trial.last_step, "step") + 1);
    row->set_total_steps(IntField(trial.start, "total_steps"));
    const double seconds = NumberField(trial.last_step, "seconds");
    // Once the trial has ended, its run's figure; before, the latest step's (a resumed trial's run
    // also holds the earlier attempts' results).
    if (store::IsOutcome(trial.state) && trial.tokens_per_second.has_value()) {
      row->set_tokens_per_second(*trial.tokens_per_second);
    } else if (seconds > 0) {
      row->set_tokens_per_second(NumberField(trial.last_step, "tokens") / seconds);
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
      row->set_notice(dispatcher_.NodeNotice(trial.node));
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
      ASSIGN_OR_RETURN(v1::ExperimentStatus status, BuildStatus(id));
      std::string serialized = status.SerializeAsString();
      if (serialized != last_sent) {
        if (!writer->Write(status)) return CancelledError("the watcher went away");
        last_sent = std::move(serialized);
      }
      if (status.state() == "ended") return Status::Ok();
      // Bounded so that a watcher that hung up is noticed even when nothing changes.
      seen = changes_.WaitForChange(seen, std::chrono::milliseconds(500));
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

grpc::Status ControllerService::Report(grpc::ServerContext* context,
                                       const v1::GetExperimentRequest* request,
                                       v1::ReportResponse* response) {
  return Guard(context, "Report", [&]() -> Status {
    ASSIGN_OR_RETURN(int64_t id, ResolveExperimentId(request->experiment_id()));
    ASSIGN_OR_RETURN(store::ExperimentReport report, store_.Report(id));
    ASSIGN_OR_RETURN(std::vector<store::TrialRecord> records, store_.ListTrials(id));
    ASSIGN_OR_RETURN(std::vector<store::TrialStep> steps, store_.RunSteps(id));
    std::map<int64_t, const store::TrialRecord*> by_id;
    for (const store::TrialRecord& record : records) by_id[record.id] = &record;
    std::map<int64_t, std::vector<const store::TrialStep*>> steps_by_trial;
    for (const store::TrialStep& step : steps) steps_by_trial[step.trial_id].push_back(&step);
    response->set_experiment_id(id);
    response->set_name(report.experiment.name);
    for (const store::TrialReport& trial : report.trials) {
      v1::TrialReport* row = response->add_trials();
      row->set_name(trial.name);
      if (auto record = by_id.find(trial.trial_id); record != by_id.end()) {
        row->set_description(record->second->description);
        row->set_config_json(record->second->config_json);
        const json p = json::parse(record->second->prediction_json.value_or(""), nullptr,
                                   /*allow_exceptions=*/false);
        if (p.is_object()) {
          v1::TrialPrediction* prediction = row->mutable_prediction();
          // Field by field, each of the wrong type (a null where an older controller stored a
          // non-finite number) read as absent: one trial's odd value must not fail the report.
          prediction->set_peak_bytes(IntField(p, "peak_bytes"));
          prediction->set_activation_bytes(IntField(p, "activation_bytes"));
          prediction->set_model_state_bytes(IntField(p, "model_state_bytes"));
          prediction->set_peak_phase(StringField(p, "peak_phase"));
          prediction->set_device_memory_bytes(IntField(p, "device_memory_bytes"));
          prediction->set_verdict(StringField(p, "verdict"));
          prediction->set_step_seconds(NumberField(p, "step_seconds"));
          prediction->set_tokens_per_second(NumberField(p, "tokens_per_second"));
          prediction->set_trial_seconds(NumberField(p, "trial_seconds"));
          prediction->set_time_device(StringField(p, "time_device"));
          prediction->set_calibration(StringField(p, "calibration"));
        }
      }
      row->set_outcome(std::string(store::TrialStateName(trial.state)));
      row->set_expected(trial.expect.value_or(""));
      row->set_attempt(static_cast<int32_t>(trial.attempt));
      row->set_node(trial.node);
      row->set_train_seconds(trial.train_seconds.value_or(0));
      row->set_tokens_per_second(trial.tokens_per_second.value_or(0));
      row->set_peak_bytes(trial.peak_bytes.value_or(0));
      if (trial.final_loss.has_value()) row->set_final_loss(*trial.final_loss);
      row->set_error(trial.error);
      if (!trial.peak_snapshot.is_null()) *row->mutable_at_peak() = ToSnapshot(trial.peak_snapshot);
      for (const auto& [phase, snapshot] : trial.phase_peaks) {
        *row->add_per_phase() = ToSnapshot(snapshot);
      }
      row->set_load_peak_bytes(trial.load_peak_bytes.value_or(0));
      row->set_refused_event_lines(trial.refused_event_lines);
      for (const store::KernelFallback& fallback : trial.kernel_fallbacks) {
        v1::KernelFallback* proto = row->add_kernel_fallbacks();
        proto->set_op(fallback.op);
        proto->set_reason(fallback.reason);
        proto->set_step(fallback.step);
        proto->set_rank(fallback.rank);
      }
      for (const store::RankMemory& rank : trial.ranks) {
        v1::RankMemory* proto = row->add_ranks();
        proto->set_rank(rank.rank);
        proto->set_peak_bytes(rank.peak_bytes.value_or(0));
        proto->set_allocated_bytes(rank.allocated_bytes.value_or(0));
        for (const auto& [phase, bytes] : rank.phase_allocated) {
          v1::PhaseBytes* entry = proto->add_per_phase();
          entry->set_phase(phase);
          entry->set_allocated_bytes(bytes);
        }
      }
      for (int64_t attempt : trial.run_attempts) {
        row->add_run_attempts(static_cast<int32_t>(attempt));
      }
      ASSIGN_OR_RETURN(std::vector<store::DeviceSample> samples,
                       store_.DeviceSamples(id, trial.name));
      AddMemoryTimeline(trial, samples, *row);
      for (const store::TrialStep* step : steps_by_trial[trial.trial_id]) {
        v1::TrialStep* proto = row->add_steps();
        proto->set_attempt(static_cast<int32_t>(step->attempt));
        proto->set_step(step->step);
        proto->set_loss(step->loss.value_or(0));
        proto->set_tokens(step->tokens.value_or(0));
        proto->set_seconds(step->seconds.value_or(0));
      }
    }
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
      return NotFoundError("experiment " + std::to_string(id) + " has no trial '" +
                           request->trial() + "'");
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

StatusOr<v1::NodeStatus> ControllerService::BuildNodeStatus(
    const store::NodeRecord& node, const std::vector<store::RunningAttempt>& running) {
  v1::NodeStatus row;
  row.set_name(node.name);
  row.set_address(node.address);
  row.set_state(node.state);
  row.set_unusable(dispatcher_.NodeUnusable(node.name));
  if (StatusOr<int64_t> expiry = secrets_.NodeCertificateExpiry(node.name); expiry.ok()) {
    row.set_certificate_expires_unix(*expiry);
  }
  row.set_last_seen_unix(
      std::chrono::duration_cast<std::chrono::seconds>(node.last_seen.time_since_epoch()).count());
  const json devices = json::parse(node.devices_json, nullptr, /*allow_exceptions=*/false);
  if (devices.is_array()) {
    for (const json& device : devices) {
      v1::Device* proto = row.add_devices();
      proto->set_type(StringField(device, "type"));
      proto->set_index(static_cast<int32_t>(IntField(device, "index")));
      proto->set_name(StringField(device, "name"));
      proto->set_memory_bytes(IntField(device, "memory_bytes"));
    }
  }
  std::string runs;
  for (const store::RunningAttempt& attempt : running) {
    if (!attempt.RunsOn(node.name)) continue;
    ASSIGN_OR_RETURN(store::TrialRecord trial, store_.GetTrial(attempt.trial_id));
    if (!runs.empty()) runs += ",";
    runs += std::to_string(attempt.experiment_id) + "/" + trial.name + "#" +
            std::to_string(attempt.attempt);
  }
  row.set_running(runs);
  if (node.lease.has_value()) {
    v1::NodeLease* lease = row.mutable_lease();
    lease->set_name(node.lease->name);
    lease->set_site(node.lease->site);
    lease->set_flavor(node.lease->flavor);
    lease->set_ends_unix(
        std::chrono::duration_cast<std::chrono::seconds>(node.lease->ends.time_since_epoch())
            .count());
  }
  return row;
}

grpc::Status ControllerService::ListNodes(grpc::ServerContext* context, const v1::ListNodesRequest*,
                                          v1::ListNodesResponse* response) {
  return Guard(context, "ListNodes", [&]() -> Status {
    ASSIGN_OR_RETURN(std::vector<store::NodeRecord> nodes, store_.ListNodes());
    ASSIGN_OR_RETURN(std::vector<store::RunningAttempt> running, store_.ListRunningAttempts());
    ASSIGN_OR_RETURN(const auto rates, store_.NodeRates());
    for (const store::NodeRecord& node : nodes) {
      v1::NodeStatus* status = response->add_nodes();
      ASSIGN_OR_RETURN(*status, BuildNodeStatus(node, running));
      if (auto measured = rates.find(node.name); measured != rates.end()) {
        status->set_rate_probe_json(measured->second);
      }
    }
    return Status::Ok();
  });
}

grpc::Status ControllerService::RegisterNode(grpc::ServerContext* context,
                                             const v1::RegisterNodeRequest* request,
                                             v1::NodeCredentials* response) {
  return Guard(context, "RegisterNode", [&]() -> Status {
    RETURN_IF_ERROR(ValidateNodeName(request->name()));
    if (!request->address().empty()) RETURN_IF_ERROR(ValidateAgentAddress(request->address()));
    // Held from the check of the current token to the new one's storing, so that two calls
    // cannot both find the name free.
    MutexLock registering(registration_mutex_);
    StatusOr<std::string> current_token = secrets_.NodeToken(request->name());
    if (current_token.ok()) {
      // A live node: only a holder of its token may replace its credentials, else any caller
      // could take over its name (and the trials, inputs and artifacts sent to it).
      if (request->current_token().empty()) {
        return Status(StatusCode::kPermissionDenied,
                      "register node: node '" + request->name() +
                          "' is registered; registering it again needs its current token "
                          "(current_token), or remove it first (llmctl node down " +
                          request->name() + ")");
      }
      if (!rpc::SameSecret(request->current_token(), *current_token)) {
        return Status(StatusCode::kPermissionDenied,
                      "register node: current_token is not node '" + request->name() + "''s token");
      }
    } else if (current_token.status().code() != StatusCode::kNotFound) {
      return current_token.status();
    }
    if (request->enroll()) {
      RETURN_IF_ERROR(IssueEnrollment(request->name(), *response));
    } else {
      RETURN_IF_ERROR(IssueCredentials(request->name(), *response));
    }
    store::NodeRecord node{.name = request->name(),
                           .address = request->address(),
                           .devices_json = "[]",
                           .last_seen = {},
                           .state = "registered",
                           .lease = std::nullopt};
    ASSIGN_OR_RETURN(std::vector<store::NodeRecord> known, store_.ListNodes());
    for (const store::NodeRecord& existing : known) {
      if (existing.name == node.name) node.last_seen = existing.last_seen;
    }
    RETURN_IF_ERROR(store_.RegisterNode(node));
    spdlog::info("node {} registered at {}", node.name,
                 node.address.empty() ? "an address not yet known" : node.address);
    response->set_name(node.name);
    response->set_ca_certificate_pem(ca_.ca_certificate_pem());
    dispatcher_.Wake();
    return Status::Ok();
  });
}

namespace {

// How long a cloud node's enrollment token lasts: the node boots and installs Docker and the
// agent first (minutes; a bare-metal host takes about 10 to come up, a driver upgrade reboots it).
constexpr std::chrono::hours kEnrollmentLifetime{1};
// Node certificates: renewed over the link at the health checks (controller/node_certificates.h).
constexpr int kNodeCertificateDays = kNodeCertificateLifetime / std::chrono::hours(24);

int64_t UnixSeconds(store::Time time) {
  return std::chrono::duration_cast<std::chrono::seconds>(time.time_since_epoch()).count();
}

}  // namespace

Status ControllerService::IssueCredentials(const std::string& node, v1::NodeCredentials& response) {
  // A name of this registration's own: the controller dials the node under it, so no
  // certificate of an earlier node of this name passes for this one.
  ASSIGN_OR_RETURN(const std::string registration, RandomHex(8));
  const std::string certificate_name = rpc::AgentCertificateName(node, registration);
  ASSIGN_OR_RETURN(rpc::IssuedCertificate certificate,
                   ca_.Issue(certificate_name, kNodeCertificateDays));
  ASSIGN_OR_RETURN(std::string token, NewNodeToken());
  RETURN_IF_ERROR(secrets_.PutNodeToken(node, token, certificate_name));
  RETURN_IF_ERROR(RecordCertificateExpiry(secrets_, node, certificate.certificate_pem));
  RETURN_IF_ERROR(store_.PutSecretRef(node, SecretsFile::NodeTokenRef(node)));
  response.set_certificate_pem(std::move(certificate.certificate_pem));
  response.set_private_key_pem(std::move(certificate.private_key_pem));
  response.set_token(std::move(token));
  return Status::Ok();
}

Status ControllerService::IssueEnrollment(const std::string& node, v1::NodeCredentials& response) {
  // A live node registered again this way loses its credentials at once, as with new ones.
  RETURN_IF_ERROR(secrets_.RemoveNodeToken(node));
  ASSIGN_OR_RETURN(const std::string registration, RandomHex(8));
  ASSIGN_OR_RETURN(std::string enrollment_token, RandomHex(32));
  const int64_t expires = UnixSeconds(clock_.Now() + kEnrollmentLifetime);
  RETURN_IF_ERROR(secrets_.PutEnrollment(node, enrollment_token, expires,
                                         rpc::AgentCertificateName(node, registration)));
  spdlog::info("node {}: enrollment token issued, valid until unix time {}", node, expires);
  response.set_enrollment_token(std::move(enrollment_token));
  response.set_enrollment_expires_unix(expires);
  return Status::Ok();
}

StatusOr<v1::EnrollmentGrant> ControllerService::DecideEnrollment(const std::string& node,
                                                                  const std::string& token,
                                                                  std::string& token_out) {
  ASSIGN_OR_RETURN(const std::string certificate_name,
                   secrets_.CheckEnrollment(node, token, UnixSeconds(clock_.Now())));
  ASSIGN_OR_RETURN(rpc::IssuedCertificate certificate,
                   ca_.Issue(certificate_name, kNodeCertificateDays));
  ASSIGN_OR_RETURN(token_out, NewNodeToken());
  v1::EnrollmentGrant grant;
  grant.set_certificate_pem(std::move(certificate.certificate_pem));
  grant.set_private_key_pem(std::move(certificate.private_key_pem));
  grant.set_token(token_out);
  return grant;
}

grpc::Status ControllerService::EnrollNode(grpc::ServerContext* context,
                                           const v1::EnrollNodeRequest* request,
                                           v1::EnrollNodeResponse* response) {
  return Guard(context, "EnrollNode", [&]() -> Status {
    const std::string& name = request->name();
    RETURN_IF_ERROR(ValidateNodeName(name).WithContext("enroll node"));
    if (controller_identity_.certificate_pem.empty()) {
      return FailedPreconditionError("enroll node: this controller has no client certificate");
    }
    ASSIGN_OR_RETURN(std::vector<store::NodeRecord> known, store_.ListNodes());
    auto node = std::find_if(known.begin(), known.end(),
                             [&](const store::NodeRecord& record) { return record.name == name; });
    if (node == known.end() || node->address.empty()) {
      return FailedPreconditionError("enroll node: node '" + name +
                                     "' is not registered with an address to dial");
    }
    // One enrollment of a name at a time, and none while RegisterNode changes its secrets: the
    // token is checked and spent under the same lock.
    MutexLock registering(registration_mutex_);
    response->set_name(name);
    if (!secrets_.HasEnrollment(name) && secrets_.NodeToken(name).ok()) {
      response->set_already_enrolled(true);
      return Status::Ok();
    }
    std::string token;
    std::string certificate_pem;
    Status enrolled = EnrollAgent(
        node->address, name, controller_identity_, std::chrono::seconds(20),
        [&](const std::string& presented) -> StatusOr<v1::EnrollmentGrant> {
          StatusOr<v1::EnrollmentGrant> grant = DecideEnrollment(name, presented, token);
          if (grant.ok()) certificate_pem = grant->certificate_pem();
          return grant;
        });
    if (enrolled.ok()) enrolled = secrets_.CompleteEnrollment(name, token);
    if (enrolled.ok()) enrolled = RecordCertificateExpiry(secrets_, name, certificate_pem);
    if (!enrolled.ok()) {
      if (enrolled.code() != StatusCode::kUnavailable &&
          enrolled.code() != StatusCode::kDeadlineExceeded) {
        spdlog::warn("enroll node {} at {}: refused: {}", name, node->address, enrolled.message());
      }
      return enrolled.WithContext("enroll node " + name);
    }
    RETURN_IF_ERROR(store_.PutSecretRef(name, SecretsFile::NodeTokenRef(name)));
    spdlog::info("node {} at {} enrolled", name, node->address);
    dispatcher_.Wake();
    return Status::Ok();
  });
}

grpc::Status ControllerService::UpdateNode(grpc::ServerContext* context,
                                           const v1::UpdateNodeRequest* request,
                                           v1::NodeStatus* response) {
  return Guard(context, "UpdateNode", [&]() -> Status {
    RETURN_IF_ERROR(ValidateNodeName(request->name()));
    if (!request->address().empty()) RETURN_IF_ERROR(ValidateAgentAddress(request->address()));
    if (request->has_lease() && request->lease().ends_unix() <= 0) {
      return InvalidArgumentError("update node " + request->name() +
                                  ": the lease's end (ends_unix) is missing");
    }
    ASSIGN_OR_RETURN(std::vector<store::NodeRecord> known, store_.ListNodes());
    auto node = std::find_if(known.begin(), known.end(), [&](const store::NodeRecord& record) {
      return record.name == request->name();
    });
    if (node == known.end()) {
      return NotFoundError("no node '" + request->name() + "' is registered");
    }
    if (!request->address().empty() && request->address() != node->address) {
      node->address = request->address();
      RETURN_IF_ERROR(store_.UpsertNode(*node));
      spdlog::info("node {} is at {}", node->name, node->address);
    }
    if (request->has_lease()) {
      node->lease =
          store::NodeLease{.name = request->lease().name(),
                           .site = request->lease().site(),
                           .flavor = request->lease().flavor(),
                           .ends = store::Time(std::chrono::seconds(request->lease().ends_unix()))};
      RETURN_IF_ERROR(store_.SetNodeLease(node->name, *node->lease));
    }
    ASSIGN_OR_RETURN(std::vector<store::RunningAttempt> running, store_.ListRunningAttempts());
    ASSIGN_OR_RETURN(*response, BuildNodeStatus(*node, running));
    dispatcher_.Wake();
    return Status::Ok();
  });
}

grpc::Status ControllerService::DeregisterNode(grpc::ServerContext* context,
                                               const v1::DeregisterNodeRequest* request,
                                               v1::DeregisterNodeResponse* response) {
  return Guard(context, "DeregisterNode", [&]() -> Status {
    RETURN_IF_ERROR(ValidateNodeName(request->name()).WithContext("deregister node"));
    // The token goes first: from the moment the node is removed the controller cannot present it
    // again. Should the removal fail after this, the node is unreachable until a retry removes it.
    RETURN_IF_ERROR(secrets_.RemoveNodeToken(request->name()));
    ASSIGN_OR_RETURN(store::NodeRemoval removal, dispatcher_.RemoveNode(request->name()));
    response->set_name(request->name());
    switch (removal.result) {
      case store::NodeRemoval::Result::kRemoved:
        response->set_result("removed");
        break;
      case store::NodeRemoval::Result::kAlreadyRemoved:
        response->set_result("already_removed");
        break;
      case store::NodeRemoval::Result::kUnknown:
        response->set_result("unknown");
        break;
    }
    if (removal.removed_at.has_value()) {
      response->set_removed_unix(
          std::chrono::duration_cast<std::chrono::seconds>(removal.removed_at->time_since_epoch())
              .count());
    }
    for (const store::RunningAttempt& attempt : removal.lost) {
      ASSIGN_OR_RETURN(store::TrialRecord trial, store_.GetTrial(attempt.trial_id));
      response->add_requeued(std::to_string(attempt.experiment_id) + "/" + trial.name + "#" +
                             std::to_string(attempt.attempt));
    }
    return Status::Ok();
  });
}

}  // namespace llmctl::controller
