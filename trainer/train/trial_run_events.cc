// TrialRun's events (start, snapshot, step, log, result) and the human lines beside them.
#include <cmath>
#include <iomanip>
#include <sstream>
#include <utility>

#include "common/byte_size.h"
#include "common/data/batch_iterator.h"
#include "common/kernel_fallback_event.h"
#include "common/snapshot_event.h"
#include "common/text.h"
#include "trainer/model/projection.h"
#include "trainer/train/trial_run.h"

namespace llmctl::trainer {
namespace {

using nlohmann::json;

json SnapshotJson(const MemorySnapshot& s) {
  return json{{snapshot_event::kParamsBytes, s.params_bytes},
              {snapshot_event::kGradsBytes, s.grads_bytes},
              {snapshot_event::kOptimDeviceBytes, s.optim_device_bytes},
              {snapshot_event::kOptimHostBytes, s.optim_host_bytes},
              {snapshot_event::kCommBytes, s.comm_bytes},
              {snapshot_event::kGatheredBytes, s.gathered_bytes},
              {snapshot_event::kOtherBytes, s.other_bytes},
              {snapshot_event::kAllocatedBytes, s.allocated_bytes},
              {snapshot_event::kPeakBytes, s.peak_bytes},
              {snapshot_event::kReservedBytes, s.reserved_bytes}};
}

// The model's parameter counts for the start event: every element, quantized base weights (stored
// as NF4 buffers) included, and those that train.
struct ParameterCounts {
  int64_t total = 0;
  int64_t trainable = 0;
};

ParameterCounts CountParameters(torch::nn::Module& model) {
  ParameterCounts counts;
  for (const torch::Tensor& p : model.parameters()) {
    counts.total += p.numel();
    if (p.requires_grad()) counts.trainable += p.numel();
  }
  for (auto& [name, projection] : NamedProjections(model)) {
    if (projection->is_quantized()) counts.total += projection->nf4_weight().numel();
  }
  return counts;
}

}  // namespace

void TrialRun::Log(const std::string& level, const std::string& message) {
  events_.Emit({{"type", "log"}, {"level", level}, {"message", message}});
  Human("[" + level + "] " + ForTerminal(message));
}

void TrialRun::EmitSnapshot(const MemorySnapshot& snapshot, int64_t step, int64_t micro_batch,
                            std::string_view phase) {
  json event = SnapshotJson(snapshot);
  event["type"] = snapshot_event::kType;
  event[snapshot_event::kStep] = step;
  event[snapshot_event::kMicroBatch] = micro_batch;
  event[snapshot_event::kPhase] = phase;
  event[snapshot_event::kElapsedMs] = ElapsedMs();
  events_.Emit(event);
}

void TrialRun::Snapshot(int64_t step, int64_t micro_batch, std::string_view phase) {
  // Each phase boundary is also where the profiler names what follows and marks its memory history.
  if (profiler_) profiler_->Phase(step, micro_batch, phase);
  if (!snapshot_this_step_) return;
  const MemorySnapshot snapshot = TakeMemorySnapshot(/*at_failure=*/false);
  EmitSnapshot(snapshot, step, micro_batch, phase);
  std::string label = "step" + std::to_string(step);
  if (accumulation_ > 1) label += "_mb" + std::to_string(micro_batch);
  Human("[" + label + "_" + std::string(phase) + "] " + FormatSnapshot(snapshot));
}

void TrialRun::ReportStep(int64_t step, double lr, double seconds, const StepTotals& totals,
                          int64_t label_tokens, const std::optional<CpuCounters>& cpu_at_start,
                          std::optional<double> pace_seconds) {
  train_seconds_ += seconds;
  tokens_seen_ += totals.tokens;
  const double step_loss =
      label_tokens > 0 ? totals.loss_sum / static_cast<double>(label_tokens) : 0.0;
  last_loss_ = step_loss;
  steps_done_ = step + 1;
  json step_event{{"type", "step"},
                  {"step", step},
                  {"loss", step_loss},
                  {"lr", lr},
                  {"tokens", totals.tokens},
                  {"seconds", seconds},
                  {"allocated_bytes", memory_->allocated_bytes()},
                  {"peak_bytes", memory_->peak_bytes()}};
  // The share of the time of the CPUs this process may run on that other processes (and a VM
  // host's other guests) took during the step: the report says when a trial's tokens/s was measured
  // on a busy machine.
  if (const std::optional<CpuCounters> now = cpu_at_start ? ReadCpuCounters() : std::nullopt) {
    if (const std::optional<double> others =
            OthersCpuShare(*cpu_at_start, *now, ProcStatTicksPerSecond())) {
      step_event["others_cpu_share"] = std::round(*others * 1000) / 1000;
    }
  }
  // Against the probe's pace_seconds, how fast the machine ran while the report's tokens/s was
  // measured (trainer/train/machine_pace.h).
  if (pace_seconds) step_event["pace_seconds"] = *pace_seconds;
  events_.Emit(step_event);
  for (const kernels::Fallback& fallback : kernel_fallbacks_.TakeNew()) {
    const std::string op(kernels::FusedOpName(fallback.op));
    json event;
    event["type"] = kernel_fallback_event::kType;
    event[kernel_fallback_event::kOp] = op;
    event[kernel_fallback_event::kReason] = fallback.reason;
    event[kernel_fallback_event::kStep] = step;
    events_.Emit(event);
    Human("[warning] kernels: " + op +
          " ran ATen's composition, not a fused kernel: " + fallback.reason);
  }
  if (step % log_every_ == 0 || step + 1 == total_steps_) {
    std::ostringstream line;
    line.precision(4);
    line << "[step " << step + 1 << "/" << total_steps_ << "] loss " << std::fixed << step_loss
         << " | lr " << std::scientific << lr << std::fixed << " | " << totals.tokens
         << " tokens | " << seconds << " s | "
         << static_cast<int64_t>(static_cast<double>(totals.tokens) / seconds)
         << " tokens/s | allocated " << FormatBytes(memory_->allocated_bytes()) << " (peak "
         << FormatBytes(memory_->peak_bytes()) << ")";
    Human(line.str());
  }
}

void TrialRun::WriteProfile() {
  const ProfileFiles files = profiler_->Write(StorageCategories(
      *memory_, model_tensors_.state, OptimizerState(), CommBuffers(), GatheredParams()));
  for (const std::string& path : files.paths) Log("info", "profile written to " + path);
  for (const std::string& problem : files.problems) Log("warning", "profile: " + problem);
}

void TrialRun::EmitStart(uint64_t load_peak) {
  total_steps_ = TotalSteps();
  const ParameterCounts counts = CountParameters(model_->module());
  const std::optional<uint64_t> limit = memory_->limit_bytes();
  json start{{"type", "start"},
             {"config", config_.EffectiveJson()},
             {"total_steps", total_steps_},
             {"examples", batches_->num_examples()},
             {"parameters_total", counts.total},
             {"parameters_trainable", counts.trainable},
             {"load_peak_bytes", load_peak},
             {"first_step", first_step_},
             {"resumed_from", options_.resume_from},
             {"device", device_.str()},
             {"rank", rank_},
             {"world_size", parallel_->world_size()},
             {"comm_bytes", UniqueStorageBytes(CommBuffers())},
             {"device_limit_bytes", limit ? json(*limit) : json(nullptr)},
             {"started_unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                     started_wall_.time_since_epoch())
                                     .count()},
             {"threads", torch::get_num_threads()},
             {"torch_version", TORCH_VERSION}};
  if (ranks_met_elapsed_ms_) start["ranks_met_elapsed_ms"] = *ranks_met_elapsed_ms_;
  events_.Emit(start);
  Human("[start] model " + OnOneLine(settings().model.name) + " (" + std::to_string(counts.total) +
        " parameters, " + std::to_string(counts.trainable) + " trainable) | " + precision_.name +
        " | " + std::string(Name(settings().train.optimizer)) + " | micro-batch " +
        std::to_string(micro_batch_size_) + " x " + std::to_string(accumulation_) + " | " +
        std::to_string(total_steps_) + " steps | loading peak " + FormatBytes(load_peak));
  if (profiler_) {
    if (std::string missed = profiler_->StepsPast(total_steps_); !missed.empty()) {
      Log("warning", missed);
    }
  }
  Log("info", "dataset " + settings().data.path + ": " + std::to_string(batches_->num_examples()) +
                  " examples");
}

TrialResult TrialRun::Finish(Outcome outcome, std::string error) {
  // A run that ends inside its profiled steps (out of memory, cancelled) keeps what was recorded.
  if (profiler_ && profiler_->recording()) WriteProfile();
  TrialResult result;
  result.outcome = outcome;
  result.error = NameInputs(std::move(error), options_.input_names);
  result.train_seconds = train_seconds_;
  result.tokens_per_second =
      train_seconds_ > 0 ? static_cast<double>(tokens_seen_) / train_seconds_ : 0.0;
  result.peak_bytes = memory_ ? memory_->peak_bytes() : 0;
  result.final_loss = last_loss_;
  result.steps_done = steps_done_;
  json event{{"type", "result"},
             {"outcome", OutcomeName(outcome)},
             {"train_seconds", result.train_seconds},
             {"tokens_per_second", result.tokens_per_second},
             {"peak_bytes", result.peak_bytes},
             {"steps", result.steps_done},
             {"final_loss", result.final_loss ? json(*result.final_loss) : json(nullptr)},
             {"error", result.error},
             {"elapsed_ms", ElapsedMs()}};
  // The newest checkpoint, written or resumed from, with the checkpoint event's fields: what
  // --resume continues from (the controller names it when it stopped the run).
  if (!last_checkpoint_dir_.empty()) {
    event["checkpoint"] = {{"step", last_checkpoint_steps_ - 1}, {"path", last_checkpoint_dir_}};
  }
  events_.Emit(event);
  // The events are the trial's record (the agent's metrics, its checkpoints): a run whose record
  // was cut short failed, whatever its training did.
  if (const Status& recorded = events_.status(); !recorded.ok()) {
    if (result.outcome == Outcome::kOk) result.outcome = Outcome::kFailed;
    result.error = result.error.empty()
                       ? recorded.message()
                       : std::string(result.error).append("; ").append(recorded.message());
  }
  std::ostringstream line;
  line.precision(2);
  line << std::fixed << "[done] outcome " << OutcomeName(result.outcome) << " | train time "
       << result.train_seconds << " s | peak memory " << FormatGiB(result.peak_bytes) << " ("
       << FormatBytes(result.peak_bytes) << ") | tokens/s " << std::setprecision(0)
       << result.tokens_per_second;
  // The error may quote a dataset's bytes: the line stays one line of text.
  if (!result.error.empty()) line << " | " << OnOneLine(result.error);
  Human(line.str());
  return result;
}

}  // namespace llmctl::trainer
