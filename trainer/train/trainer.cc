#include "trainer/train/trainer.h"

#include <sys/statvfs.h>
#include <torch/torch.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <numbers>
#include <ostream>
#include <sstream>
#include <stdexcept>

#include "common/byte_size.h"
#include "common/kernel_fallback_event.h"
#include "common/model_config.h"
#include "common/snapshot_event.h"
#include "common/text.h"
#include "trainer/data/batch_iterator.h"
#include "trainer/kernels/kernel_choice.h"
#include "trainer/memory/accounting.h"
#include "trainer/memory/counting_allocator.h"
#include "trainer/model/projection.h"
#include "trainer/parallel/parallelism.h"
#include "trainer/peft/lora.h"
#include "trainer/train/batches.h"
#include "trainer/train/checkpoints.h"
#include "trainer/train/events.h"
#include "trainer/train/optimizer.h"
#include "trainer/train/precision.h"
#include "trainer/train/profiling.h"
#include "trainer/train/trained_model.h"

namespace llmctl::trainer {

std::string_view OutcomeName(Outcome outcome) {
  return trainer_exit::OutcomeName(ExitCodeFor(outcome));
}

int ExitCodeFor(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk:
      return trainer_exit::kOk;
    case Outcome::kOom:
      return trainer_exit::kOom;
    case Outcome::kDiverged:
      return trainer_exit::kDiverged;
    case Outcome::kFailed:
      return trainer_exit::kFailed;
    case Outcome::kCancelled:
      return trainer_exit::kCancelled;
  }
  return trainer_exit::kFailed;
}

namespace {

using Clock = std::chrono::steady_clock;
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

// Linear warmup to the peak rate, then cosine decay to zero at the last step (LitGPT's schedule).
double LearningRate(double peak, int64_t step, int64_t warmup_steps, int64_t total_steps) {
  if (warmup_steps > 0 && step < warmup_steps) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  const int64_t decay_steps = total_steps - warmup_steps;
  if (decay_steps <= 0) return peak;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps);
  return 0.5 * peak * (1.0 + std::cos(std::numbers::pi * progress));
}

// statvfs's free bytes (for unprivileged users) on the filesystem that holds `path`, or would hold
// it: the nearest existing ancestor is asked, as output_dir may not exist yet.
StatusOr<uint64_t> StatvfsFreeBytes(const std::string& path) {
  std::error_code error;
  std::filesystem::path probe = std::filesystem::absolute(path, error);
  if (error) probe = path;
  while (!std::filesystem::exists(probe, error) && probe.has_parent_path() &&
         probe != probe.parent_path()) {
    probe = probe.parent_path();
  }
  struct statvfs info;
  if (::statvfs(probe.c_str(), &info) != 0) {
    return UnavailableError("cannot tell the free space in " + probe.string() + ": " +
                            std::strerror(errno));
  }
  return static_cast<uint64_t>(info.f_bavail) * static_cast<uint64_t>(info.f_frsize);
}

// A Status from a strategy's collective, in the step: a failed collective leaves the ranks out of
// step, so it fails the trial (Run catches it), as a failing op does.
void ThrowIfError(const Status& status) {
  if (!status.ok()) throw std::runtime_error(status.message());
}

template <typename T>
T ValueOrThrow(StatusOr<T> value) {
  ThrowIfError(value.status());
  return *std::move(value);
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

// What one step's micro-batches add up to on this rank (after SumAcrossRanks: on all ranks).
struct StepTotals {
  double loss_sum = 0.0;  // Σ micro-batch mean loss × its label tokens
  int64_t tokens = 0;     // real (not padding) tokens
};

// Everything one run holds; members are destroyed in reverse order, model last.
class TrialRun {
 public:
  TrialRun(const TrialConfig& config, const RunOptions& options, EventLog& events)
      : config_(config), options_(options), events_(events) {}

  TrialResult Run();

 private:
  Status Setup();
  // The trial's data, its model (built, frozen, given its adapters) and its optimizer; the model
  // as the strategy prepares it between the last two.
  Status OpenData();
  Status LoadModel();
  Status PrepareModel();
  Status MakeTrialOptimizer();
  // The start event and lines, once everything is loaded.
  void EmitStart(uint64_t load_peak);
  // The steps from first_step_ to the end (or the stop), and the result.
  TrialResult Train();

  // Returns false when the trial ended (diverged or cancelled) inside the step.
  bool TrainStep(int64_t step);
  // What a signal asks of this process now.
  StopRequest AskedToStop() const;
  // The step's micro-batches, from the data position it starts at (step_start_position_).
  std::vector<MicroBatch> DrawMicroBatches();
  // Forward and backward of micro-batch `i` of `step`, adding its loss and tokens to `totals`.
  // False when its loss is not finite (divergence_ says where).
  bool ForwardBackward(int64_t step, int64_t i, MicroBatch& batch, const StepAgreement& agreement,
                       StepTotals& totals);
  // Unscales, clips and steps, unless the optimizer stepped in backward.
  void ApplyUpdate(double lr);
  // The step event and the progress line.
  void ReportStep(int64_t step, double lr, double seconds, const StepTotals& totals,
                  int64_t label_tokens);

  void Snapshot(int64_t step, int64_t micro_batch, std::string_view phase);
  // The `snapshot` event: `snapshot`'s bytes, where in the run it was taken, and when.
  void EmitSnapshot(const MemorySnapshot& snapshot, int64_t step, int64_t micro_batch,
                    std::string_view phase);
  // Milliseconds since the run's start, to the microsecond: enough to order the phases of the
  // smallest model's step.
  double ElapsedMs() const {
    return static_cast<double>(
               std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started_)
                   .count()) /
           1000.0;
  }
  void Log(const std::string& level, const std::string& message);
  // Writes the profiled steps' files (profiling.h) and names them in log events.
  void WriteProfile();
  // The ranks of a DDP job share a terminal: rank 0 speaks for them (each has its events file).
  void Human(const std::string& line) {
    if (options_.human != nullptr && rank_ == 0) *options_.human << line << std::endl;
  }
  TrialResult Finish(Outcome outcome, std::string error);
  // The run was asked to stop while step `step` ran: ends it as cancelled, first checkpointing the
  // last complete step when the trial keeps checkpoints or the stop asked for one.
  TrialResult Stop(int64_t step);
  TrialResult InvalidInput(const Status& status) {
    TrialResult result = Finish(Outcome::kFailed, status.message());
    result.invalid_input = true;
    return result;
  }
  // Puts weights, optimizer state, data position and generators back from options_.resume_from.
  Status Resume();
  TrainingState CheckpointState(int64_t completed_steps, const nlohmann::json& data_position) const;
  // Records the checkpoint written at `dir`.
  Status CheckpointWritten(int64_t completed_steps, const std::string& dir);
  // A checkpoint of the state after `completed_steps` optimizer steps, whose next micro-batches
  // start at `data_position`.
  Status WriteCheckpoint(int64_t completed_steps, const nlohmann::json& data_position);
  // WriteCheckpoint of the last complete step when a stop interrupted the next one, unless the
  // checkpoint does not fit on output_dir's filesystem: then nothing is written and the error says
  // how much it needs and how much is free.
  Status CheckpointBeforeStop(int64_t completed_steps);
  // With adapters and an output_dir: output_dir/adapter (PEFT's files) and, with peft.save_merged,
  // output_dir/merged.
  Status SaveAdapterOutputs();
  std::vector<torch::Tensor> OptimizerState() const {
    return optimizer_ ? optimizer_->StateTensors() : std::vector<torch::Tensor>{};
  }
  // Host allocations for the optimizer's state and its step while alive, when the strategy keeps
  // the trainable tensors in host memory (ModelTensors::on_host); nothing otherwise.
  std::optional<ScopedHostAllocations> OptimizerAllocations() const {
    if (!model_tensors_.on_host) return std::nullopt;
    return std::optional<ScopedHostAllocations>(std::in_place);
  }
  std::vector<torch::Tensor> CommBuffers() const { return parallel_->CommTensors(); }
  std::vector<torch::Tensor> GatheredParams() const { return parallel_->GatheredTensors(); }
  MemorySnapshot TakeMemorySnapshot(bool at_failure) const {
    return at_failure ? SnapshotAtFailure(*memory_, model_tensors_.state, OptimizerState(),
                                          CommBuffers(), GatheredParams())
                      : TakeSnapshot(*memory_, model_tensors_.state, OptimizerState(),
                                     CommBuffers(), GatheredParams());
  }

  const TrialConfig& config_;
  const RunOptions& options_;
  EventLog& events_;
  // The run's start, the zero of every snapshot's elapsed_ms: on the monotonic clock, and on the
  // wall clock (for the start event, so a reader can place the snapshots beside other clocks).
  const Clock::time_point started_ = Clock::now();
  const std::chrono::system_clock::time_point started_wall_ = std::chrono::system_clock::now();

  TrialModelConfig model_config_;
  Precision precision_;
  torch::Device device_{torch::kCPU};
  std::optional<DeviceMemory> memory_;
  std::unique_ptr<TrainedModel> model_;
  std::optional<LoraConfig> lora_;  // peft.method lora or qlora
  ModelTensors model_tensors_;      // what this rank holds and trains, as the strategy prepared it
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<BatchSource> batches_;
  std::unique_ptr<StepProfiler> profiler_;  // null when no step is profiled
  std::unique_ptr<Parallelism> parallel_;   // one process, ddp or fsdp
  int rank_ = 0;                            // outputs (checkpoints, adapters, profile) on rank 0
  std::optional<LossScaler> loss_scaler_;
  // The fused ops that ran ATen's composition since the run began, each said once (ReportStep).
  kernels::FallbackWatch kernel_fallbacks_;

  bool chunked_loss_ = false;
  bool optimizer_in_backward_ = false;
  int64_t micro_batch_size_ = 1;
  int64_t accumulation_ = 1;
  int64_t total_steps_ = 0;
  int64_t snapshot_every_ = 50;
  int64_t log_every_ = 1;
  bool snapshot_this_step_ = false;
  double train_seconds_ = 0.0;
  int64_t tokens_seen_ = 0;
  std::optional<double> last_loss_;
  int64_t steps_done_ = 0;
  int64_t first_step_ = 0;
  StopRequest stop_request_ = StopRequest::kNone;  // what ended the run early, when a stop did
  int64_t last_checkpoint_steps_ = 0;  // completed steps in the newest checkpoint (or resumed from)
  std::string last_checkpoint_dir_;    // that checkpoint's directory; empty when there is none
  nlohmann::json step_start_position_;  // the data position before the running step's micro-batches
  std::string divergence_;
};

Status TrialRun::Setup() {
  ASSIGN_OR_RETURN(model_config_, ResolveTrialModel(config_.GetString("model")));
  RETURN_IF_ERROR(CheckTrialForModel(config_, model_config_));
  ASSIGN_OR_RETURN(precision_, Precision::FromName(config_.GetString("precision")));
  // A DDP rank's GPU is its LOCAL_RANK, as torchrun's convention has it.
  const int local_rank = options_.rank_env ? options_.rank_env->local_rank : 0;
  device_ = config_.GetString("device") == "cuda" ? torch::Device(torch::kCUDA, local_rank)
                                                  : torch::Device(torch::kCPU);
  ASSIGN_OR_RETURN(DeviceMemory memory, DeviceMemory::For(device_));
  memory_.emplace(memory);
  RETURN_IF_ERROR(memory_->SetBudget(config_.GetByteSize("device_memory")));

  ASSIGN_OR_RETURN(parallel_, MakeParallelism(config_, options_.rank_env, device_));
  rank_ = parallel_->rank();
  micro_batch_size_ = config_.GetInt("train.micro_batch_size");
  accumulation_ =
      config_.GetInt("train.global_batch_size") / (micro_batch_size_ * parallel_->world_size());
  snapshot_every_ = std::max<int64_t>(1, config_.GetInt("snapshot_every"));
  log_every_ = std::max<int64_t>(1, config_.GetInt("log_every"));
  chunked_loss_ = UsesChunkedLoss(config_);
  optimizer_in_backward_ = config_.GetBool("optimizer_in_backward");
  if (precision_.loss_scaling) loss_scaler_.emplace(device_);
  ASSIGN_OR_RETURN(lora_, LoraConfigFromTrial(config_));
  if (config_.GetInt("checkpoint_every") > 0 && config_.GetString("output_dir").empty()) {
    return InvalidArgumentError(
        "checkpoint_every: checkpoints need output_dir to say where they go");
  }
  // The ranks' steps are the same; one profile of rank 0's says what they do.
  if (rank_ == 0) {
    ASSIGN_OR_RETURN(profiler_, StepProfiler::ForTrial(config_, device_));
  }
  return Status::Ok();
}

Status TrialRun::OpenData() {
  ASSIGN_OR_RETURN(batches_,
                   OpenTrialBatches(config_, model_config_, rank_, parallel_->world_size()));
  return Status::Ok();
}

Status TrialRun::LoadModel() {
  torch::manual_seed(static_cast<uint64_t>(config_.GetInt("seed")));
  ModelBuildOptions build;
  build.init = config_.GetString("init");
  build.model_dir = config_.GetString("model");
  build.dtype = precision_.param_dtype;
  build.device = device_;
  if (lora_) build.nf4 = lora_->nf4;
  build.activation_checkpointing = config_.GetBool("activation_checkpointing");
  build.kernels = KernelsNamed(config_.GetString("kernels"));
  ASSIGN_OR_RETURN(model_, BuildTrainedModel(model_config_, build));
  RETURN_IF_ERROR(model_->Freeze(config_.GetStringList("freeze")));
  if (lora_) {
    RETURN_IF_ERROR(CheckLoraTargets(model_->module(), *lora_));
    ApplyLora(model_->module(), *lora_);
    const std::string adapter = config_.GetString("peft.adapter");
    if (!adapter.empty()) RETURN_IF_ERROR(LoadAdapter(model_->module(), *lora_, adapter));
  }
  model_->module().train();
  return Status::Ok();
}

Status TrialRun::PrepareModel() {
  // Under fsdp bf16-mixed the units are gathered and computed in bf16 over fp32 shards (FSDP2's
  // param_dtype) instead of casting fp32 parameters op by op under autocast.
  ASSIGN_OR_RETURN(
      model_tensors_,
      parallel_->PrepareModel(*model_, precision_.autocast.value_or(precision_.param_dtype)));
  return Status::Ok();
}

Status TrialRun::MakeTrialOptimizer() {
  OptimizerOptions options;
  options.name = config_.GetString("optimizer");
  options.lr = config_.GetFloat("train.lr");
  const std::vector<double> betas = config_.GetFloatList("train.betas");
  options.beta1 = betas.at(0);
  options.beta2 = betas.at(1);
  options.eps = config_.GetFloat("train.eps");
  options.weight_decay = config_.GetFloat("train.weight_decay");
  options.momentum = config_.GetFloat("train.momentum");
  options.offload = config_.GetString("offload") == "optimizer";
  const auto host = OptimizerAllocations();
  ASSIGN_OR_RETURN(optimizer_,
                   MakeOptimizer(options, model_tensors_.trainable, model_tensors_.layouts));
  if (optimizer_in_backward_) {
    for (size_t i = 0; i < model_tensors_.trainable.size(); ++i) {
      // Freeing the gradient right after its update keeps about one layer's gradients alive.
      SetPostAccumulateGradHook(model_tensors_.trainable[i],
                                [optimizer = optimizer_.get(), i](const torch::Tensor& p) {
                                  optimizer->StepParameter(i);
                                  p.mutable_grad() = torch::Tensor();
                                });
    }
  }
  return Status::Ok();
}

Status TrialRun::Resume() {
  const std::string& dir = options_.resume_from;
  ASSIGN_OR_RETURN(LoadedCheckpoint checkpoint, LoadCheckpoint(dir));
  torch::NoGradGuard no_grad;
  RETURN_IF_ERROR(parallel_->LoadCheckpoint(dir, *model_, checkpoint));
  {
    const auto host = OptimizerAllocations();
    RETURN_IF_ERROR(optimizer_->LoadNamedState(checkpoint.optimizer).WithContext(dir));
  }
  RETURN_IF_ERROR(batches_->Restore(checkpoint.state.data_position).WithContext(dir));
  if (loss_scaler_) loss_scaler_->set_scale(checkpoint.state.loss_scale);
  RETURN_IF_ERROR(RestoreGeneratorStates(checkpoint.generators).WithContext(dir));
  first_step_ = checkpoint.state.next_step;
  last_checkpoint_steps_ = first_step_;
  last_checkpoint_dir_ = dir;
  return Status::Ok();
}

Status TrialRun::WriteCheckpoint(int64_t completed_steps, const nlohmann::json& data_position) {
  const std::string dir =
      config_.GetString("output_dir") + "/checkpoints/step-" + std::to_string(completed_steps);
  ASSIGN_OR_RETURN(const bool written,
                   parallel_->SaveCheckpoint(dir, *model_, optimizer_->NamedState(),
                                             CheckpointState(completed_steps, data_position)));
  if (!written) return Status::Ok();
  return CheckpointWritten(completed_steps, dir);
}

TrainingState TrialRun::CheckpointState(int64_t completed_steps,
                                        const nlohmann::json& data_position) const {
  TrainingState state;
  state.next_step = completed_steps;
  state.data_position = data_position;
  state.loss_scale = loss_scaler_ ? loss_scaler_->scale() : 0.0;
  state.config = config_.EffectiveJson();
  return state;
}

Status TrialRun::CheckpointWritten(int64_t completed_steps, const std::string& dir) {
  last_checkpoint_steps_ = completed_steps;
  last_checkpoint_dir_ = dir;
  events_.Emit({{"type", "checkpoint"}, {"step", completed_steps - 1}, {"path", dir}});
  Human("[checkpoint] " + dir);
  return Status::Ok();
}

Status TrialRun::CheckpointBeforeStop(int64_t completed_steps) {
  const std::string output_dir = config_.GetString("output_dir");
  if (output_dir.empty()) {
    return FailedPreconditionError("checkpoint skipped: the trial has no output_dir");
  }
  const uint64_t needed = CheckpointBytes(ModelState(model_->module()), optimizer_->NamedState());
  auto free = options_.free_disk_bytes ? options_.free_disk_bytes(output_dir)
                                       : StatvfsFreeBytes(output_dir);
  if (!free.ok()) {
    // Not knowing is no reason to lose the run's progress: the write reports its own failure.
    Log("warning", free.status().message());
  } else if (*free < needed) {
    return ResourceExhaustedError("checkpoint skipped: needs " + FormatBytes(needed) + ", " +
                                  FormatBytes(*free) + " free in " + output_dir);
  }
  return WriteCheckpoint(completed_steps, step_start_position_).WithContext("checkpoint failed");
}

Status TrialRun::SaveAdapterOutputs() {
  const std::string output_dir = config_.GetString("output_dir");
  if (!lora_ || output_dir.empty()) return Status::Ok();
  // Every rank takes part (under fsdp the units are gathered); rank 0 writes.
  ASSIGN_OR_RETURN(const NamedTensors state, parallel_->FullModelState(*model_));
  if (rank_ != 0) return Status::Ok();
  const std::string adapter_dir = output_dir + "/adapter";
  RETURN_IF_ERROR(SaveAdapter(state, *lora_, config_.GetString("model"),
                              model_->adapter_task_type(), adapter_dir));
  Log("info", "adapter written to " + adapter_dir);
  if (config_.GetBool("peft.save_merged")) {
    const std::string merged_dir = output_dir + "/merged";
    RETURN_IF_ERROR(model_->SaveMerged(merged_dir));
    Log("info", "merged model written to " + merged_dir);
  }
  return Status::Ok();
}

void TrialRun::Log(const std::string& level, const std::string& message) {
  events_.Emit({{"type", "log"}, {"level", level}, {"message", message}});
  Human("[" + level + "] " + message);
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

StopRequest TrialRun::AskedToStop() const {
  if (options_.cancel == nullptr || !options_.cancel->load()) return StopRequest::kNone;
  return options_.checkpoint_on_cancel != nullptr && options_.checkpoint_on_cancel->load()
             ? StopRequest::kStopWithCheckpoint
             : StopRequest::kStop;
}

std::vector<MicroBatch> TrialRun::DrawMicroBatches() {
  step_start_position_ = batches_->Position();
  std::vector<MicroBatch> micro_batches;
  for (int64_t i = 0; i < accumulation_; ++i) {
    micro_batches.push_back(batches_->Next(micro_batch_size_, device_));
  }
  return micro_batches;
}

bool TrialRun::TrainStep(int64_t step) {
  const auto started = Clock::now();
  if (profiler_) profiler_->BeginStep(step);
  // Profiled steps are snapshotted too, so their traces can be read beside the snapshots.
  snapshot_this_step_ = step == 0 || step == 1 || step % snapshot_every_ == 0 ||
                        (profiler_ && profiler_->Profiles(step));
  const double lr = LearningRate(config_.GetFloat("train.lr"), step,
                                 config_.GetInt("train.warmup_steps"), total_steps_);

  std::vector<MicroBatch> micro_batches = DrawMicroBatches();
  int64_t label_tokens = 0;
  for (const MicroBatch& batch : micro_batches) label_tokens += batch.label_tokens;
  const StepAgreement agreement = ValueOrThrow(parallel_->BeginStep(label_tokens, AskedToStop()));
  if (agreement.stop != StopRequest::kNone) {
    stop_request_ = agreement.stop;
    return false;
  }

  for (torch::Tensor& p : model_tensors_.trainable) p.mutable_grad() = torch::Tensor();
  // With the optimizer in backward, the parameters' hooks apply this step's update during backward.
  if (optimizer_in_backward_) optimizer_->BeginStep(lr);
  StepTotals totals;
  for (int64_t i = 0; i < accumulation_; ++i) {
    if (i > 0 && parallel_->StopsBetweenMicroBatches()) {
      stop_request_ = AskedToStop();
      if (stop_request_ != StopRequest::kNone) return false;
    }
    if (!ForwardBackward(step, i, micro_batches[static_cast<size_t>(i)], agreement, totals)) {
      return false;
    }
  }
  micro_batches.clear();
  ThrowIfError(parallel_->FinishGradients());
  if (agreement.label_tokens == 0) {
    // No rank had a label token: one device would have no gradients, and its optimizer would skip
    // every parameter; zero gradients (fsdp's zero backward, ddp's reduced buckets) must not make
    // AdamW step either.
    for (torch::Tensor& p : model_tensors_.trainable) p.mutable_grad() = torch::Tensor();
  }
  // The step's loss and tokens are the job's: every rank reports the same.
  const std::vector<double> sums = ValueOrThrow(
      parallel_->SumAcrossRanks({totals.loss_sum, static_cast<double>(totals.tokens)}));
  totals.loss_sum = sums.at(0);
  totals.tokens = static_cast<int64_t>(sums.at(1));

  ApplyUpdate(lr);
  Snapshot(step, accumulation_ - 1, snapshot_event::kAfterOptimizerStep);
  if (device_.is_cuda()) torch::cuda::synchronize();
  ReportStep(step, lr, std::chrono::duration<double>(Clock::now() - started).count(), totals,
             agreement.label_tokens);
  if (profiler_ && profiler_->EndsWith(step)) WriteProfile();
  return true;
}

bool TrialRun::ForwardBackward(int64_t step, int64_t i, MicroBatch& batch,
                               const StepAgreement& agreement, StepTotals& totals) {
  Snapshot(step, i, snapshot_event::kBeforeForward);
  torch::Tensor loss;
  {
    // Under fsdp bf16-mixed the gathered parameters are bf16 already, so autocast casts none of
    // them; the ops it keeps in fp32 still run in fp32, as on one device.
    AutocastScope autocast(precision_, device_);
    ThrowIfError(parallel_->BeforeForward());
    loss = model_->Loss(batch, chunked_loss_);
  }
  Snapshot(step, i, snapshot_event::kAfterForward);
  totals.tokens += batch.real_tokens;
  const bool last = i == accumulation_ - 1;
  if (batch.label_tokens == 0) {
    // Truncation left no target in this micro-batch: its mean loss is 0/0, and it adds nothing to
    // the gradient, so it is not a divergence and there is nothing to backpropagate, unless the
    // strategy's backward runs collectives that every rank must join: then a zero objective
    // (nan_to_num's gradient is zero where the loss is not finite) gives zero gradients.
    if (parallel_->BackwardWithoutLabels()) {
      parallel_->BeforeBackward(last);
      (torch::nan_to_num(loss, 0.0, 0.0, 0.0) * 0.0).backward();
      ThrowIfError(parallel_->AfterBackward());
    }
    loss = torch::Tensor();
    Snapshot(step, i, snapshot_event::kAfterBackward);
    return true;
  }
  const double loss_value = loss.item<double>();
  if (!std::isfinite(loss_value)) {
    divergence_ = "loss is " + std::to_string(loss_value) + " at step " + std::to_string(step) +
                  ", micro-batch " + std::to_string(i);
    return false;
  }
  // The global batch's loss is the mean over all of its label tokens (every rank's), so each
  // micro-batch's mean is weighted by its share of them: k micro-batches give exactly the gradient
  // of one batch k times larger. Non-zero: this micro-batch has label tokens, so the global batch
  // does too.
  const double weight = agreement.gradient_scale * static_cast<double>(batch.label_tokens) /
                        static_cast<double>(agreement.label_tokens);
  torch::Tensor objective = loss * weight;
  if (loss_scaler_) objective = objective * loss_scaler_->scale();
  parallel_->BeforeBackward(last);
  objective.backward();
  objective = torch::Tensor();
  loss = torch::Tensor();
  ThrowIfError(parallel_->AfterBackward());
  Snapshot(step, i, snapshot_event::kAfterBackward);
  totals.loss_sum += loss_value * static_cast<double>(batch.label_tokens);
  return true;
}

void TrialRun::ApplyUpdate(double lr) {
  // With the optimizer in backward the hooks have applied the update already; validation rules out
  // the loss scaling and clipping that would come first.
  if (optimizer_in_backward_) return;
  bool grads_finite = true;
  if (loss_scaler_) grads_finite = loss_scaler_->UnscaleAndCheck(model_tensors_.trainable);
  const double grad_clip = config_.GetFloat("train.grad_clip");
  if (grads_finite && grad_clip > 0.0) {
    ValueOrThrow(parallel_->ClipGradNorm(model_tensors_.trainable, grad_clip));
  }
  if (grads_finite) {
    const auto host = OptimizerAllocations();
    optimizer_->Step(lr);
  }
  if (loss_scaler_) loss_scaler_->Update(grads_finite);
}

void TrialRun::ReportStep(int64_t step, double lr, double seconds, const StepTotals& totals,
                          int64_t label_tokens) {
  train_seconds_ += seconds;
  tokens_seen_ += totals.tokens;
  const double step_loss =
      label_tokens > 0 ? totals.loss_sum / static_cast<double>(label_tokens) : 0.0;
  last_loss_ = step_loss;
  steps_done_ = step + 1;
  events_.Emit({{"type", "step"},
                {"step", step},
                {"loss", step_loss},
                {"lr", lr},
                {"tokens", totals.tokens},
                {"seconds", seconds},
                {"allocated_bytes", memory_->allocated_bytes()},
                {"peak_bytes", memory_->peak_bytes()}});
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
  std::ostringstream line;
  line.precision(2);
  line << std::fixed << "[done] outcome " << OutcomeName(outcome) << " | train time "
       << result.train_seconds << " s | peak memory " << FormatGiB(result.peak_bytes) << " ("
       << FormatBytes(result.peak_bytes) << ") | tokens/s " << std::setprecision(0)
       << result.tokens_per_second;
  if (!result.error.empty()) line << " | " << result.error;
  Human(line.str());
  return result;
}

TrialResult TrialRun::Stop(int64_t step) {
  std::string error = "cancelled at step " + std::to_string(step);
  // The weights and optimizer state are still those after the last complete step, and the data
  // resumes where the interrupted step's micro-batches began, so that step is what a checkpoint
  // keeps; one written (or resumed from) at that step already is enough.
  if ((stop_request_ == StopRequest::kStopWithCheckpoint ||
       config_.GetInt("checkpoint_every") > 0) &&
      step > last_checkpoint_steps_) {
    if (Status status = CheckpointBeforeStop(step); !status.ok()) {
      error += "; " + status.message();
    }
  }
  return Finish(Outcome::kCancelled, error);
}

void TrialRun::EmitStart(uint64_t load_peak) {
  const int64_t global_batch = micro_batch_size_ * accumulation_ * parallel_->world_size();
  total_steps_ = data::TotalSteps(config_, batches_->num_examples(), global_batch);
  const ParameterCounts counts = CountParameters(model_->module());
  const std::optional<uint64_t> limit = memory_->limit_bytes();
  events_.Emit({{"type", "start"},
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
                {"torch_version", TORCH_VERSION}});
  Human("[start] model " + config_.GetString("model") + " (" + std::to_string(counts.total) +
        " parameters, " + std::to_string(counts.trainable) + " trainable) | " + precision_.name +
        " | " + config_.GetString("optimizer") + " | micro-batch " +
        std::to_string(micro_batch_size_) + " x " + std::to_string(accumulation_) + " | " +
        std::to_string(total_steps_) + " steps | loading peak " + FormatBytes(load_peak));
  if (profiler_) {
    if (std::string missed = profiler_->StepsPast(total_steps_); !missed.empty()) {
      Log("warning", missed);
    }
  }
  Log("info", "dataset " + config_.GetString("data.path") + ": " +
                  std::to_string(batches_->num_examples()) + " examples");
}

TrialResult TrialRun::Train() {
  memory_->ResetPeak();
  const int64_t checkpoint_every = config_.GetInt("checkpoint_every");
  for (int64_t step = first_step_; step < total_steps_; ++step) {
    if (!TrainStep(step)) {
      if (!divergence_.empty()) return Finish(Outcome::kDiverged, divergence_);
      return Stop(step);
    }
    if (checkpoint_every > 0 && (step + 1) % checkpoint_every == 0) {
      if (Status status = WriteCheckpoint(step + 1, batches_->Position()); !status.ok()) {
        return Finish(Outcome::kFailed, status.message());
      }
    }
  }
  if (Status status = SaveAdapterOutputs(); !status.ok()) {
    return Finish(Outcome::kFailed, status.message());
  }
  return Finish(Outcome::kOk, "");
}

TrialResult TrialRun::Run() {
  if (Status status = Setup(); !status.ok()) return InvalidInput(status);
  try {
    // Data first: a bad dataset or tokenizer should fail before minutes of model loading.
    if (Status status = OpenData(); !status.ok()) return InvalidInput(status);
    memory_->ResetPeak();
    if (Status status = LoadModel(); !status.ok()) return InvalidInput(status);
    // The strategy's collectives failing is not the input's fault.
    if (Status status = PrepareModel(); !status.ok()) {
      return Finish(Outcome::kFailed, status.message());
    }
    const uint64_t load_peak = memory_->peak_bytes();
    if (Status status = MakeTrialOptimizer(); !status.ok()) return InvalidInput(status);
    if (!options_.resume_from.empty()) {
      if (Status status = Resume(); !status.ok()) return InvalidInput(status);
    }
    if (Status status = parallel_->BeginTraining(model_tensors_); !status.ok()) {
      return Finish(Outcome::kFailed, status.message());
    }
    EmitStart(load_peak);
    return Train();
  } catch (const c10::OutOfMemoryError& e) {
    const MemorySnapshot snapshot = TakeMemorySnapshot(/*at_failure=*/true);
    EmitSnapshot(snapshot, steps_done_, -1, snapshot_event::kAtOom);
    Human("[oom] " + FormatSnapshot(snapshot));
    return Finish(Outcome::kOom, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return Finish(Outcome::kFailed, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Finish(Outcome::kFailed, e.what());
  }
}

}  // namespace

TrialResult RunTrial(const TrialConfig& config, const RunOptions& options) {
  auto events = EventLog::Open(options.events_path);
  if (!events.ok()) {
    TrialResult result;
    result.outcome = Outcome::kFailed;
    result.invalid_input = true;
    result.error = events.status().message();
    return result;
  }
  TrialRun run(config, options, **events);
  return run.Run();
}

}  // namespace llmctl::trainer
