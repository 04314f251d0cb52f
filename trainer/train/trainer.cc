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
#include "common/model_config.h"
#include "common/text.h"
#include "trainer/inputs/trial_inputs.h"
#include "trainer/memory/accounting.h"
#include "trainer/model/projection.h"
#include "trainer/peft/lora.h"
#include "trainer/train/batches.h"
#include "trainer/train/caption_batches.h"
#include "trainer/train/checkpoints.h"
#include "trainer/train/events.h"
#include "trainer/train/fsdp_checkpoint.h"
#include "trainer/train/optimizer.h"
#include "trainer/train/precision.h"
#include "trainer/train/profiling.h"
#include "trainer/train/ranks.h"
#include "trainer/train/trained_model.h"

namespace llmctl::trainer {

std::string_view OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk:
      return "ok";
    case Outcome::kOom:
      return "oom";
    case Outcome::kDiverged:
      return "diverged";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kCancelled:
      return "cancelled";
  }
  return "failed";
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

constexpr const char* kPhaseBeforeForward = "phase0_before_fwd";
constexpr const char* kPhaseAfterForward = "phase1_after_fwd";
constexpr const char* kPhaseAfterBackward = "phase2_after_bwd";
constexpr const char* kPhaseAfterOptimizerStep = "phase3_after_opt_step";

json SnapshotJson(const MemorySnapshot& s) {
  return json{{"params_bytes", s.params_bytes},
              {"grads_bytes", s.grads_bytes},
              {"optim_device_bytes", s.optim_device_bytes},
              {"optim_host_bytes", s.optim_host_bytes},
              {"comm_bytes", s.comm_bytes},
              {"gathered_bytes", s.gathered_bytes},
              {"other_bytes", s.other_bytes},
              {"allocated_bytes", s.allocated_bytes},
              {"peak_bytes", s.peak_bytes},
              {"reserved_bytes", s.reserved_bytes}};
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

// What a checkpoint holds of the model: its parameters and buffers (a QLoRA model's NF4 base
// weights), by name.
NamedTensors ModelState(torch::nn::Module& model) {
  NamedTensors state;
  for (const auto& item : model.named_parameters()) state.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers()) state.emplace_back(item.key(), item.value());
  return state;
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

// Everything one run holds; members are destroyed in reverse order, model last.
class TrialRun {
 public:
  TrialRun(const TrialConfig& config, const RunOptions& options, EventLog& events)
      : config_(config), options_(options), events_(events) {}

  TrialResult Run();

 private:
  Status Setup();
  // Returns false when the trial ended (diverged or cancelled) inside the step.
  bool TrainStep(int64_t step);
  void Snapshot(int64_t step, int64_t micro_batch, const char* phase);
  // The `snapshot` event: `snapshot`'s bytes, where in the run it was taken, and when.
  void EmitSnapshot(const MemorySnapshot& snapshot, int64_t step, int64_t micro_batch,
                    const char* phase);
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
  // Records the checkpoint written at `dir` (under fsdp on every rank, which all wrote part of it).
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
  std::vector<torch::Tensor> CommBuffers() const { return ranks_.CommTensors(); }
  std::vector<torch::Tensor> GatheredParams() const { return ranks_.GatheredTensors(); }
  MemorySnapshot Categories(bool at_failure) const {
    return at_failure ? SnapshotAtFailure(*memory_, all_params_, OptimizerState(), CommBuffers(),
                                          GatheredParams())
                      : TakeSnapshot(*memory_, all_params_, OptimizerState(), CommBuffers(),
                                     GatheredParams());
  }
  // strategy fsdp: shards the model (before the optimizer is made); what accounting counts as
  // params and what the optimizer steps become the rank's flat shards.
  Status ShardModel();

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
  std::vector<torch::Tensor> all_params_;
  std::vector<torch::Tensor> trainable_params_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<BatchSource> batches_;
  std::unique_ptr<StepProfiler> profiler_;    // null when no step is profiled
  Ranks ranks_;                               // one process unless ddp or fsdp
  DataParallel* ddp_ = nullptr;               // ranks_'s, when strategy ddp
  FullyShardedDataParallel* fsdp_ = nullptr;  // ranks_'s, when strategy fsdp
  int rank_ = 0;                              // outputs (checkpoints, adapters, profile) on rank 0
  std::optional<LossScaler> loss_scaler_;

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
  bool stop_checkpoint_ = false;       // ddp/fsdp: the ranks agreed to stop with a checkpoint
  int64_t last_checkpoint_steps_ = 0;  // completed steps in the newest checkpoint (or resumed from)
  std::string last_checkpoint_dir_;    // that checkpoint's directory; empty when there is none
  nlohmann::json step_start_position_;  // the data position before the running step's micro-batches
  std::string divergence_;
};

Status TrialRun::Setup() {
  ASSIGN_OR_RETURN(model_config_, ResolveTrialModel(config_.GetString("model")));
  // The family is known only now (a directory's config.json): --set may have changed data.format
  // since the experiment was parsed.
  if (std::optional<ConfigProblem> problem =
          FindModelFamilyProblem(config_, std::holds_alternative<Blip2Config>(model_config_))) {
    return InvalidArgumentError(problem->message);
  }
  // Every input file, before anything loads: what `llmctl submit` checked on the user's machine,
  // checked again where the trial runs.
  const ModelConfig* llama = std::get_if<ModelConfig>(&model_config_);
  RETURN_IF_ERROR(TrialInputsChecker().Check(config_, llama).status());
  ASSIGN_OR_RETURN(precision_, Precision::FromName(config_.GetString("precision")));
  // A DDP rank's GPU is its LOCAL_RANK, as torchrun's convention has it.
  const int local_rank = options_.rank_env ? options_.rank_env->local_rank : 0;
  device_ = config_.GetString("device") == "cuda" ? torch::Device(torch::kCUDA, local_rank)
                                                  : torch::Device(torch::kCPU);
  ASSIGN_OR_RETURN(DeviceMemory memory, DeviceMemory::For(device_));
  memory_.emplace(memory);
  RETURN_IF_ERROR(memory_->SetBudget(config_.GetByteSize("device_memory")));

  ASSIGN_OR_RETURN(ranks_, Ranks::Join(config_, options_.rank_env, device_));
  ddp_ = ranks_.ddp();
  fsdp_ = ranks_.fsdp();
  rank_ = ranks_.rank();
  micro_batch_size_ = config_.GetInt("train.micro_batch_size");
  const int64_t world_size = ranks_.world_size();
  accumulation_ = config_.GetInt("train.global_batch_size") / (micro_batch_size_ * world_size);
  snapshot_every_ = std::max<int64_t>(1, config_.GetInt("snapshot_every"));
  log_every_ = std::max<int64_t>(1, config_.GetInt("log_every"));
  chunked_loss_ = config_.GetString("loss") == "chunked_ce";
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

Status TrialRun::ShardModel() {
  // bf16-mixed gathers and computes in bf16 over fp32 shards (FSDP2's param_dtype) instead of
  // casting fp32 parameters op by op under autocast.
  RETURN_IF_ERROR(fsdp_->Shard(
      model_->module(), [this](const std::string& name) { return model_->LayerOf(name); },
      precision_.autocast.value_or(precision_.param_dtype)));
  all_params_ = fsdp_->Shards();
  // Buffers stay whole on every rank (the model has none but a QLoRA base, which fsdp refuses).
  for (const auto& item : model_->module().named_buffers()) all_params_.push_back(item.value());
  trainable_params_ = fsdp_->Shards();
  model_->SetLayerHooks(fsdp_);
  return Status::Ok();
}

Status TrialRun::Resume() {
  const std::string& dir = options_.resume_from;
  ASSIGN_OR_RETURN(LoadedCheckpoint checkpoint, LoadCheckpoint(dir));
  torch::NoGradGuard no_grad;
  if (fsdp_) {
    // This rank's pieces of the full model, and its own optimizer shard.
    RETURN_IF_ERROR(LoadShardedCheckpoint(*fsdp_, dir, checkpoint));
  } else {
    std::map<std::string, torch::Tensor> saved(checkpoint.model.begin(), checkpoint.model.end());
    for (auto& [name, tensor] : ModelState(model_->module())) {
      auto it = saved.find(name);
      if (it == saved.end() || !it->second.sizes().equals(tensor.sizes())) {
        return DataLossError(
            dir + "/model.safetensors: tensor '" + name +
            "' is missing or has another shape (a checkpoint of a different model?)");
      }
      tensor.copy_(it->second);
    }
  }
  RETURN_IF_ERROR(optimizer_->LoadNamedState(checkpoint.optimizer).WithContext(dir));
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
  if (fsdp_) {
    RETURN_IF_ERROR(SaveShardedCheckpoint(*fsdp_, dir, optimizer_->NamedState(),
                                          CheckpointState(completed_steps, data_position)));
    return CheckpointWritten(completed_steps, dir);
  }
  // Every rank holds the same weights and optimizer state, and the data position is the ranks'
  // shared one: rank 0's checkpoint is the job's, and every rank resumes from it.
  if (rank_ != 0) return Status::Ok();
  const NamedTensors model = ModelState(model_->module());
  RETURN_IF_ERROR(SaveCheckpoint(dir, model, optimizer_->NamedState(),
                                 CheckpointState(completed_steps, data_position)));
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
  if (!lora_ || output_dir.empty() || rank_ != 0) return Status::Ok();
  const std::string adapter_dir = output_dir + "/adapter";
  RETURN_IF_ERROR(SaveAdapter(model_->module(), *lora_, config_.GetString("model"),
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
                            const char* phase) {
  json event = SnapshotJson(snapshot);
  event["type"] = "snapshot";
  event["step"] = step;
  event["micro_batch"] = micro_batch;
  event["phase"] = phase;
  event["elapsed_ms"] = ElapsedMs();
  events_.Emit(event);
}

void TrialRun::Snapshot(int64_t step, int64_t micro_batch, const char* phase) {
  // Each phase boundary is also where the profiler names what follows and marks its memory history.
  if (profiler_) profiler_->Phase(step, micro_batch, phase);
  if (!snapshot_this_step_) return;
  const MemorySnapshot snapshot = Categories(/*at_failure=*/false);
  EmitSnapshot(snapshot, step, micro_batch, phase);
  std::string label = "step" + std::to_string(step);
  if (accumulation_ > 1) label += "_mb" + std::to_string(micro_batch);
  Human("[" + label + "_" + phase + "] " + FormatSnapshot(snapshot));
}

bool TrialRun::TrainStep(int64_t step) {
  const auto started = Clock::now();
  if (profiler_) profiler_->BeginStep(step);
  // Profiled steps are snapshotted too, so their traces can be read beside the snapshots.
  snapshot_this_step_ = step == 0 || step == 1 || step % snapshot_every_ == 0 ||
                        (profiler_ && profiler_->Profiles(step));
  const double lr = LearningRate(config_.GetFloat("train.lr"), step,
                                 config_.GetInt("train.warmup_steps"), total_steps_);

  // The global batch's loss is the mean over all of its label tokens, so each micro-batch's mean is
  // weighted by its share of them: k micro-batches give exactly the gradient of one batch k times
  // larger.
  std::vector<MicroBatch> micro_batches;
  int64_t global_label_tokens = 0;
  step_start_position_ = batches_->Position();
  for (int64_t i = 0; i < accumulation_; ++i) {
    micro_batches.push_back(batches_->Next(micro_batch_size_, device_));
    global_label_tokens += micro_batches.back().label_tokens;
  }
  // Under DDP the global batch is every rank's micro-batches: the weights use all ranks' label
  // tokens, scaled by the world size that the gradients' average divides by again. The ranks stop
  // at the same step, decided in the same sum: a signal reaches them at different points of a step
  // (or only one of them), and a rank stopping alone would leave the others in the step's next
  // collective while it runs the stop's (fsdp's checkpoint gathers the model and every rank writes
  // its optimizer shard). A stop therefore waits for the next step's start under ddp and fsdp.
  double rank_weight = 1.0;
  if (ranks_.distributed()) {
    // A rank asked to stop adds 1, or kCheckpointStop when asked for a checkpoint; one rank
    // asking for a checkpoint makes every rank's stop write it.
    constexpr double kCheckpointStop = 1 << 20;
    double asked = 0.0;
    if (options_.cancel != nullptr && options_.cancel->load()) {
      asked = options_.checkpoint_on_cancel != nullptr && options_.checkpoint_on_cancel->load()
                  ? kCheckpointStop
                  : 1.0;
    }
    const std::vector<double> sums =
        ranks_.SumAcrossRanks({static_cast<double>(global_label_tokens), asked});
    if (sums.at(1) > 0) {
      stop_checkpoint_ = sums.at(1) >= kCheckpointStop;
      return false;
    }
    global_label_tokens = static_cast<int64_t>(sums.at(0));
    rank_weight = static_cast<double>(ranks_.world_size());
  }

  for (torch::Tensor& p : trainable_params_) p.mutable_grad() = torch::Tensor();
  // With the optimizer in backward, the parameters' hooks apply this step's update during backward.
  if (optimizer_in_backward_) optimizer_->BeginStep(lr);
  double loss_sum = 0.0;  // Σ micro-batch mean × its label tokens
  int64_t step_tokens = 0;
  for (int64_t i = 0; i < accumulation_; ++i) {
    if (!ranks_.distributed() && options_.cancel != nullptr && options_.cancel->load()) {
      return false;
    }
    MicroBatch& batch = micro_batches[static_cast<size_t>(i)];
    Snapshot(step, i, kPhaseBeforeForward);
    torch::Tensor loss;
    {
      // Under fsdp bf16-mixed the gathered parameters are bf16 already, so autocast casts none of
      // them; the ops it keeps in fp32 still run in fp32, as on one device.
      AutocastScope autocast(precision_, device_);
      if (fsdp_) {
        if (Status status = fsdp_->BeginForward(); !status.ok()) {
          throw std::runtime_error(status.message());
        }
      }
      loss = model_->Loss(batch, chunked_loss_);
    }
    Snapshot(step, i, kPhaseAfterForward);
    step_tokens += batch.real_tokens;
    if (batch.label_tokens == 0) {
      // Truncation left no target in this micro-batch: its mean loss is 0/0, and it adds nothing to
      // the gradient, so it is not a divergence and there is nothing to backpropagate. Under FSDP
      // every rank must still run backward, whose gathers and reductions are collectives: a zero
      // objective (nan_to_num's gradient is zero where the loss is not finite) gives zero
      // gradients.
      if (fsdp_) {
        (torch::nan_to_num(loss, 0.0, 0.0, 0.0) * 0.0).backward();
        if (Status status = fsdp_->FinishBackward(); !status.ok()) {
          throw std::runtime_error(status.message());
        }
      }
      loss = torch::Tensor();
      Snapshot(step, i, kPhaseAfterBackward);
      continue;
    }
    const double loss_value = loss.item<double>();
    if (!std::isfinite(loss_value)) {
      divergence_ = "loss is " + std::to_string(loss_value) + " at step " + std::to_string(step) +
                    ", micro-batch " + std::to_string(i);
      return false;
    }
    // Non-zero: this micro-batch has label tokens, so the global batch does too.
    const double weight = rank_weight * static_cast<double>(batch.label_tokens) /
                          static_cast<double>(global_label_tokens);
    torch::Tensor objective = loss * weight;
    if (loss_scaler_) objective = objective * loss_scaler_->scale();
    // DDP's no_sync: only the step's last backward all-reduces.
    if (ddp_) ddp_->SetSync(i == accumulation_ - 1);
    objective.backward();
    objective = torch::Tensor();
    loss = torch::Tensor();
    if (fsdp_) {
      if (Status status = fsdp_->FinishBackward(); !status.ok()) {
        throw std::runtime_error(status.message());
      }
    }
    Snapshot(step, i, kPhaseAfterBackward);
    loss_sum += loss_value * static_cast<double>(batch.label_tokens);
  }
  micro_batches.clear();
  if (fsdp_ && global_label_tokens == 0) {
    // No rank had a label token: one device would have no gradients, and its optimizer would skip
    // every parameter; the zero backward's zero gradient shards must not make AdamW step either.
    for (torch::Tensor& p : trainable_params_) p.mutable_grad() = torch::Tensor();
  }
  if (ddp_) {
    if (Status status = ddp_->FinishGradients(); !status.ok()) {
      throw std::runtime_error(status.message());
    }
  }
  if (ranks_.distributed()) {
    // The step's loss and tokens are the job's: every rank reports the same.
    const std::vector<double> totals =
        ranks_.SumAcrossRanks({loss_sum, static_cast<double>(step_tokens)});
    loss_sum = totals.at(0);
    step_tokens = static_cast<int64_t>(totals.at(1));
  }

  // With the optimizer in backward the hooks have applied the update already; validation rules out
  // the loss scaling and clipping that would come first.
  if (!optimizer_in_backward_) {
    bool grads_finite = true;
    if (loss_scaler_) grads_finite = loss_scaler_->UnscaleAndCheck(trainable_params_);
    const double grad_clip = config_.GetFloat("train.grad_clip");
    if (grads_finite && grad_clip > 0.0) {
      if (fsdp_) {
        // The norm is the whole model's: the ranks' shards' squares summed.
        if (auto norm = fsdp_->ClipGradNorm(grad_clip); !norm.ok()) {
          throw std::runtime_error(norm.status().message());
        }
      } else {
        ClipGradNorm(trainable_params_, grad_clip);
      }
    }
    if (grads_finite) optimizer_->Step(lr);
    if (loss_scaler_) loss_scaler_->Update(grads_finite);
  }
  Snapshot(step, accumulation_ - 1, kPhaseAfterOptimizerStep);
  if (device_.is_cuda()) torch::cuda::synchronize();

  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  train_seconds_ += seconds;
  tokens_seen_ += step_tokens;
  const double step_loss =
      global_label_tokens > 0 ? loss_sum / static_cast<double>(global_label_tokens) : 0.0;
  last_loss_ = step_loss;
  steps_done_ = step + 1;
  events_.Emit({{"type", "step"},
                {"step", step},
                {"loss", step_loss},
                {"lr", lr},
                {"tokens", step_tokens},
                {"seconds", seconds},
                {"allocated_bytes", memory_->allocated_bytes()},
                {"peak_bytes", memory_->peak_bytes()}});
  if (step % log_every_ == 0 || step + 1 == total_steps_) {
    std::ostringstream line;
    line.precision(4);
    line << "[step " << step + 1 << "/" << total_steps_ << "] loss " << std::fixed << step_loss
         << " | lr " << std::scientific << lr << std::fixed << " | " << step_tokens << " tokens | "
         << seconds << " s | " << static_cast<int64_t>(static_cast<double>(step_tokens) / seconds)
         << " tokens/s | allocated " << FormatBytes(memory_->allocated_bytes()) << " (peak "
         << FormatBytes(memory_->peak_bytes()) << ")";
    Human(line.str());
  }
  if (profiler_ && profiler_->EndsWith(step)) WriteProfile();
  return true;
}

void TrialRun::WriteProfile() {
  const ProfileFiles files = profiler_->Write(
      StorageCategories(*memory_, all_params_, OptimizerState(), CommBuffers(), GatheredParams()));
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
  // Under ddp or fsdp, whether any rank was asked for one (the ranks' stop is one decision).
  const bool requested = ranks_.distributed() ? stop_checkpoint_
                                              : options_.checkpoint_on_cancel != nullptr &&
                                                    options_.checkpoint_on_cancel->load();
  // The weights and optimizer state are still those after the last complete step, and the data
  // resumes where the interrupted step's micro-batches began, so that step is what a checkpoint
  // keeps; one written (or resumed from) at that step already is enough.
  if ((requested || config_.GetInt("checkpoint_every") > 0) && step > last_checkpoint_steps_) {
    if (Status status = CheckpointBeforeStop(step); !status.ok()) {
      error += "; " + status.message();
    }
  }
  return Finish(Outcome::kCancelled, error);
}

TrialResult TrialRun::Run() {
  if (Status status = Setup(); !status.ok()) return InvalidInput(status);
  uint64_t load_peak = 0;
  try {
    // Data first: a bad dataset or tokenizer should fail before minutes of model loading.
    auto batches = std::holds_alternative<Blip2Config>(model_config_)
                       ? OpenCaptionBatches(config_, std::get<Blip2Config>(model_config_), rank_,
                                            ranks_.world_size())
                       : OpenBatches(config_, std::get<ModelConfig>(model_config_).vocab_size,
                                     rank_, ranks_.world_size());
    if (!batches.ok()) return InvalidInput(batches.status());
    batches_ = std::move(*batches);

    memory_->ResetPeak();
    torch::manual_seed(static_cast<uint64_t>(config_.GetInt("seed")));
    ModelBuildOptions build;
    build.init = config_.GetString("init");
    build.model_dir = config_.GetString("model");
    build.dtype = precision_.param_dtype;
    build.device = device_;
    if (lora_) build.nf4 = lora_->nf4;
    build.activation_checkpointing = config_.GetBool("activation_checkpointing");
    auto model = BuildTrainedModel(model_config_, build);
    if (!model.ok()) return InvalidInput(model.status());
    model_ = std::move(*model);
    if (Status status = model_->Freeze(config_.GetStringList("freeze")); !status.ok()) {
      return InvalidInput(status);
    }
    if (lora_) {
      if (Status status = CheckLoraTargets(model_->module(), *lora_); !status.ok()) {
        return InvalidInput(status);
      }
      ApplyLora(model_->module(), *lora_);
      const std::string adapter = config_.GetString("peft.adapter");
      if (!adapter.empty()) {
        if (Status status = LoadAdapter(model_->module(), *lora_, adapter); !status.ok()) {
          return InvalidInput(status);
        }
      }
    }
    model_->module().train();
    if (fsdp_) {
      if (Status status = ShardModel(); !status.ok()) {
        return Finish(Outcome::kFailed, status.message());
      }
    } else {
      // What accounting counts as params is what a checkpoint holds: parameters and buffers (a
      // QLoRA model's NF4 base weights).
      for (auto& [name, tensor] : ModelState(model_->module())) all_params_.push_back(tensor);
      for (const torch::Tensor& p : model_->module().parameters()) {
        if (p.requires_grad()) trainable_params_.push_back(p);
      }
    }
    load_peak = memory_->peak_bytes();
    OptimizerOptions optimizer_options;
    optimizer_options.name = config_.GetString("optimizer");
    optimizer_options.lr = config_.GetFloat("train.lr");
    const std::vector<double> betas = config_.GetFloatList("train.betas");
    optimizer_options.beta1 = betas.at(0);
    optimizer_options.beta2 = betas.at(1);
    optimizer_options.eps = config_.GetFloat("train.eps");
    optimizer_options.weight_decay = config_.GetFloat("train.weight_decay");
    optimizer_options.momentum = config_.GetFloat("train.momentum");
    optimizer_options.offload = config_.GetString("offload") == "optimizer";
    auto optimizer = MakeOptimizer(optimizer_options, trainable_params_);
    if (!optimizer.ok()) return InvalidInput(optimizer.status());
    optimizer_ = std::move(*optimizer);
    if (optimizer_in_backward_) {
      for (size_t i = 0; i < trainable_params_.size(); ++i) {
        // Freeing the gradient right after its update keeps about one layer's gradients alive.
        SetPostAccumulateGradHook(trainable_params_[i],
                                  [optimizer = optimizer_.get(), i](const torch::Tensor& p) {
                                    optimizer->StepParameter(i);
                                    p.mutable_grad() = torch::Tensor();
                                  });
      }
    }
    if (!options_.resume_from.empty()) {
      if (Status status = Resume(); !status.ok()) return InvalidInput(status);
    }
    if (ddp_) {
      if (Status status = ddp_->BroadcastFromRankZero(all_params_); !status.ok()) {
        return Finish(Outcome::kFailed, status.message());
      }
      ddp_->Attach(trainable_params_, config_.GetByteSize("ddp.bucket_size").value_or(0));
    }

    const int64_t global_batch = micro_batch_size_ * accumulation_ * ranks_.world_size();
    const int64_t steps_per_epoch = std::max<int64_t>(1, batches_->num_examples() / global_batch);
    total_steps_ = config_.GetInt("train.max_steps") > 0
                       ? config_.GetInt("train.max_steps")
                       : steps_per_epoch * std::max<int64_t>(1, config_.GetInt("train.epochs"));

    int64_t trainable_count = 0;
    int64_t total_count = 0;
    for (const torch::Tensor& p : model_->module().parameters()) {
      total_count += p.numel();
      if (p.requires_grad()) trainable_count += p.numel();
    }
    for (auto& [name, projection] : NamedProjections(model_->module())) {
      if (projection->is_quantized()) total_count += projection->nf4_weight().numel();
    }
    const std::optional<uint64_t> limit = memory_->limit_bytes();
    events_.Emit({{"type", "start"},
                  {"config", config_.EffectiveJson()},
                  {"total_steps", total_steps_},
                  {"examples", batches_->num_examples()},
                  {"parameters_total", total_count},
                  {"parameters_trainable", trainable_count},
                  {"load_peak_bytes", load_peak},
                  {"first_step", first_step_},
                  {"resumed_from", options_.resume_from},
                  {"device", device_.str()},
                  {"rank", rank_},
                  {"world_size", ranks_.world_size()},
                  {"comm_bytes", UniqueStorageBytes(CommBuffers())},
                  {"device_limit_bytes", limit ? json(*limit) : json(nullptr)},
                  {"started_unix_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                          started_wall_.time_since_epoch())
                                          .count()},
                  {"threads", torch::get_num_threads()},
                  {"torch_version", TORCH_VERSION}});
    Human("[start] model " + config_.GetString("model") + " (" + std::to_string(total_count) +
          " parameters, " + std::to_string(trainable_count) + " trainable) | " + precision_.name +
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
  } catch (const c10::OutOfMemoryError& e) {
    const MemorySnapshot snapshot = Categories(/*at_failure=*/true);
    EmitSnapshot(snapshot, steps_done_, -1, "oom");
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
