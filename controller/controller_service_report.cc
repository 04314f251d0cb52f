// ControllerService's Report: the store's report of an experiment as the CLI's ReportResponse.
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/estimate/rate_probe.h"
#include "common/foreign_json.h"
#include "common/snapshot_event.h"
#include "controller/controller_service.h"
#include "controller/json_fields.h"

namespace llmctl::controller {

using nlohmann::json;

namespace {

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
    for (const auto& [node_rank, started_unix_ms] : attempt.node_started_unix_ms) {
      (*proto->mutable_node_started_unix_ms())[static_cast<int32_t>(node_rank)] = started_unix_ms;
    }
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

// What the trial was submitted with: its description, resolved config and the estimate's
// prediction (none when it was submitted without one).
void AddSubmission(const store::TrialRecord& record, v1::TrialReport& row) {
  row.set_description(record.description);
  row.set_config_json(record.config_json);
  const json p = ParseForeignJson(record.prediction_json.value_or(""));
  if (p.is_object()) {
    v1::TrialPrediction* prediction = row.mutable_prediction();
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
    prediction->set_pace_seconds(NumberField(p, "pace_seconds"));
  }
}

// The trial's run as the store's report has it: outcome, figures, memory at peak and per phase,
// per rank, its kernel fallbacks and the attempts the run is made of.
void AddRun(const store::TrialReport& trial, v1::TrialReport& row) {
  row.set_outcome(std::string(store::TrialStateName(trial.state)));
  row.set_expected(trial.expect.value_or(""));
  row.set_attempt(static_cast<int32_t>(trial.attempt));
  row.set_node(store::AttemptNodesText(trial));
  row.set_train_seconds(trial.train_seconds.value_or(0));
  row.set_tokens_per_second(trial.tokens_per_second.value_or(0));
  row.set_peak_bytes(trial.peak_bytes.value_or(0));
  if (trial.final_loss.has_value()) row.set_final_loss(*trial.final_loss);
  row.set_error(trial.error);
  if (!trial.peak_snapshot.is_null()) *row.mutable_at_peak() = ToSnapshot(trial.peak_snapshot);
  for (const auto& [phase, snapshot] : trial.phase_peaks) {
    *row.add_per_phase() = ToSnapshot(snapshot);
  }
  row.set_load_peak_bytes(trial.load_peak_bytes.value_or(0));
  row.set_refused_event_lines(trial.refused_event_lines);
  for (const store::KernelFallback& fallback : trial.kernel_fallbacks) {
    v1::KernelFallback* proto = row.add_kernel_fallbacks();
    proto->set_op(fallback.op);
    proto->set_reason(fallback.reason);
    proto->set_step(fallback.step);
    proto->set_rank(fallback.rank);
  }
  for (const store::RankMemory& rank : trial.ranks) {
    v1::RankMemory* proto = row.add_ranks();
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
    row.add_run_attempts(static_cast<int32_t>(attempt));
  }
}

void AddSteps(const std::vector<const store::TrialStep*>& steps, v1::TrialReport& row) {
  for (const store::TrialStep* step : steps) {
    v1::TrialStep* proto = row.add_steps();
    proto->set_attempt(static_cast<int32_t>(step->attempt));
    proto->set_step(step->step);
    proto->set_loss(step->loss.value_or(0));
    proto->set_tokens(step->tokens.value_or(0));
    proto->set_seconds(step->seconds.value_or(0));
    // The trainer's word: only a share is one.
    if (const std::optional<double> share = step->others_cpu_share;
        share && *share >= 0 && *share <= 1) {
      proto->set_others_cpu_share(*share);
    }
    if (const std::optional<double> pace = step->pace_seconds;
        pace && estimate::IsPaceSeconds(*pace)) {
      proto->set_pace_seconds(*pace);
    }
  }
}

}  // namespace

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
        AddSubmission(*record->second, *row);
      }
      AddRun(trial, *row);
      ASSIGN_OR_RETURN(std::vector<store::DeviceSample> samples,
                       store_.DeviceSamples(id, trial.name));
      AddMemoryTimeline(trial, samples, *row);
      AddSteps(steps_by_trial[trial.trial_id], *row);
    }
    return Status::Ok();
  });
}

grpc::Status ControllerService::TimedRuns(grpc::ServerContext* context, const v1::TimedRunsRequest*,
                                          v1::TimedRunsResponse* response) {
  return Guard(context, "TimedRuns", [&]() -> Status {
    ASSIGN_OR_RETURN(std::vector<store::TimedRun> runs, store_.TimedRuns());
    // The store lists the newest store::kMaxTimedRuns, oldest first: sent newest first.
    for (auto run = runs.rbegin(); run != runs.rend(); ++run) {
      v1::TimedRun* timed = response->add_runs();
      timed->set_prediction_json(run->prediction_json);
      timed->set_pace_seconds(run->pace_seconds);
      timed->set_seconds_per_token(run->seconds_per_token);
      timed->set_steps(run->steps);
    }
    return Status::Ok();
  });
}

}  // namespace llmctl::controller
