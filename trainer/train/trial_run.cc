#include "trainer/train/trial_run.h"

#include <utility>

#include "common/snapshot_event.h"
#include "trainer/kernels/kernel_choice.h"

namespace llmctl::trainer {

Status TrialRun::Setup() {
  ASSIGN_OR_RETURN(model_config_, ResolveTrialModel(settings().model.name));
  RETURN_IF_ERROR(CheckTrialForModel(config_, model_config_));
  ASSIGN_OR_RETURN(precision_, Precision::FromName(std::string(Name(settings().memory.precision))));
  // A DDP rank's GPU is its LOCAL_RANK, as torchrun's convention has it.
  const int local_rank = options_.rank_env ? options_.rank_env->local_rank : 0;
  device_ = settings().device.kind == trial::Device::kCuda ? torch::Device(torch::kCUDA, local_rank)
                                                           : torch::Device(torch::kCPU);
  ASSIGN_OR_RETURN(DeviceMemory memory, DeviceMemory::For(device_));
  memory_.emplace(memory);
  const std::optional<ByteSizeSetting>& budget = settings().device.memory;
  RETURN_IF_ERROR(
      memory_->SetBudget(budget ? std::optional<uint64_t>(budget->bytes) : std::nullopt));

  ASSIGN_OR_RETURN(parallel_, MakeParallelism(config_, options_.rank_env, device_));
  if (parallel_->world_size() > 1) ranks_met_elapsed_ms_ = ElapsedMs();
  rank_ = parallel_->rank();
  micro_batch_size_ = settings().train.micro_batch_size;
  accumulation_ =
      settings().train.global_batch_size / (micro_batch_size_ * parallel_->world_size());
  snapshot_every_ = std::max<int64_t>(1, settings().output.snapshot_every);
  log_every_ = std::max<int64_t>(1, settings().output.log_every);
  chunked_loss_ = UsesChunkedLoss(config_);
  optimizer_in_backward_ = settings().memory.optimizer_in_backward;
  if (precision_.loss_scaling) loss_scaler_.emplace(device_);
  lora_ = LoraConfigFor(settings().peft);
  if (settings().output.checkpoint_every > 0 && settings().output.dir.empty()) {
    return InvalidArgumentError(
        "checkpoint_every: checkpoints need output_dir to say where they go");
  }
  // The ranks' steps are the same; one profile of rank 0's says what they do.
  if (rank_ == 0) {
    ASSIGN_OR_RETURN(profiler_, StepProfiler::ForTrial(settings(), device_));
  }
  // A CPU's pace moves with a shared machine's other guests; a GPU's step is the GPU's. Not in a
  // profiled run, whose trace would show the canary's products between its steps, nor beside
  // other ranks, which share the machine's CPUs by design (as others_cpu_share).
  if (device_.is_cpu() && parallel_->world_size() == 1 && !profiler_) {
    pace_canary_ = std::make_unique<PaceCanary>();
  }
  return Status::Ok();
}

Status TrialRun::OpenData() {
  ASSIGN_OR_RETURN(batches_,
                   OpenTrialBatches(config_, model_config_, rank_, parallel_->world_size()));
  return Status::Ok();
}

Status TrialRun::LoadModel() {
  torch::manual_seed(static_cast<uint64_t>(settings().train.seed));
  ModelBuildOptions build;
  build.init = Name(settings().model.init);
  build.model_dir = settings().model.name;
  build.dtype = precision_.param_dtype;
  build.device = device_;
  if (lora_) build.nf4 = lora_->nf4;
  build.activation_checkpointing = settings().memory.activation_checkpointing;
  build.kernels = KernelsNamed(std::string(Name(settings().memory.kernels)));
  ASSIGN_OR_RETURN(model_, BuildTrainedModel(model_config_, build));
  RETURN_IF_ERROR(model_->Freeze(settings().peft.freeze));
  if (lora_) {
    RETURN_IF_ERROR(CheckLoraTargets(model_->module(), *lora_));
    ApplyLora(model_->module(), *lora_);
    const std::string& adapter = settings().peft.adapter;
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
  const OptimizerOptions options = OptimizerOptionsOf(settings());
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

TrialResult TrialRun::Run() {
  if (Status status = Setup(); !status.ok()) return FailedBeforeTraining(status);
  try {
    // Data first: a bad dataset or tokenizer should fail before minutes of model loading.
    if (Status status = OpenData(); !status.ok()) return FailedBeforeTraining(status);
    memory_->ResetPeak();
    if (Status status = LoadModel(); !status.ok()) return FailedBeforeTraining(status);
    // The strategy's collectives failing is not the input's fault.
    if (Status status = PrepareModel(); !status.ok()) {
      return Finish(Outcome::kFailed, status.message());
    }
    const uint64_t load_peak = memory_->peak_bytes();
    if (Status status = MakeTrialOptimizer(); !status.ok()) return FailedBeforeTraining(status);
    if (!options_.resume_from.empty()) {
      if (Status status = Resume(); !status.ok()) return FailedBeforeTraining(status);
    }
    // A run killed while writing a checkpoint left its staging directory, keeping a disk full
    // that the next checkpoint needs. Each node's first rank clears its node's before the first
    // step (several nodes each write theirs: SaveShardedCheckpoint); no rank writes into one
    // before every rank has started training.
    const int local_rank = options_.rank_env ? options_.rank_env->local_rank : 0;
    if (local_rank == 0 && !settings().output.dir.empty()) {
      if (Status status = RemoveCheckpointStaging(settings().output.dir + "/checkpoints");
          !status.ok()) {
        Log("warning", status.message());
      }
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

TrialResult TrialRun::Train() {
  memory_->ResetPeak();
  const int64_t checkpoint_every = settings().output.checkpoint_every;
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

TrialResult TrialRun::Stop(int64_t step) {
  std::string error = "cancelled at step " + std::to_string(step);
  // The weights and optimizer state are still those after the last complete step, and the data
  // resumes where the interrupted step's micro-batches began, so that step is what a checkpoint
  // keeps; one written (or resumed from) at that step already is enough.
  if ((stop_request_ == StopRequest::kStopWithCheckpoint ||
       settings().output.checkpoint_every > 0) &&
      step > last_checkpoint_steps_) {
    if (Status status = CheckpointBeforeStop(step); !status.ok()) {
      error += "; " + status.message();
    }
  }
  return Finish(Outcome::kCancelled, error);
}

}  // namespace llmctl::trainer
