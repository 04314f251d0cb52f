// TrialRun's checkpoints (periodic, before a stop), resuming from one, and the adapter outputs.
#include <limits>

#include "common/byte_size.h"
#include "common/data/batch_iterator.h"
#include "common/files.h"
#include "common/rank_files.h"
#include "trainer/train/trial_run.h"

namespace llmctl::trainer {

int64_t TrialRun::TotalSteps() const {
  const int64_t global_batch = micro_batch_size_ * accumulation_ * parallel_->world_size();
  return data::TotalSteps(settings().train, batches_->num_examples(), global_batch);
}

Status TrialRun::Resume() {
  const std::string& dir = options_.resume_from;
  ASSIGN_OR_RETURN(LoadedCheckpoint checkpoint, LoadCheckpoint(dir));
  // A checkpoint may come from another node: its numbers must make sense for this trial.
  const std::string state_file = dir + "/" + kCheckpointStateFile;
  if (const int64_t total = TotalSteps(); checkpoint.state.next_step > total) {
    return DataLossError(state_file + ": next_step " + std::to_string(checkpoint.state.next_step) +
                         " is past the trial's " + std::to_string(total) + " steps");
  }
  // 16-mixed multiplies the loss by the scale and its gradients by 1 / scale in float32: either
  // out of float32's normal range would skip every step (0 stays 0 under halving).
  const double scale = checkpoint.state.loss_scale;
  if (loss_scaler_ &&
      !(scale >= std::numeric_limits<float>::min() && scale <= std::numeric_limits<float>::max())) {
    return DataLossError(state_file + ": loss_scale " + std::to_string(scale) +
                         " is not a scale a 16-mixed run can use (a normal float32)");
  }
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
      settings().output.dir + "/checkpoints/step-" + std::to_string(completed_steps);
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
  const std::string& output_dir = settings().output.dir;
  if (output_dir.empty()) {
    return FailedPreconditionError("checkpoint skipped: the trial has no output_dir");
  }
  const uint64_t needed = CheckpointBytes(ModelState(model_->module()), optimizer_->NamedState());
  auto free = options_.free_disk_bytes ? options_.free_disk_bytes(output_dir)
                                       : AvailableBytesForNewPath("checkpoint", output_dir);
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
  const std::string& output_dir = settings().output.dir;
  if (!lora_ || output_dir.empty()) return Status::Ok();
  // Every rank takes part (under fsdp the units are gathered); rank 0 writes.
  ASSIGN_OR_RETURN(const NamedTensors state, parallel_->FullModelState(*model_));
  if (rank_ != 0) return Status::Ok();
  const std::string adapter_dir = output_dir + "/adapter";
  RETURN_IF_ERROR(
      SaveAdapter(state, *lora_, settings().model.name, model_->adapter_task_type(), adapter_dir));
  Log("info", "adapter written to " + adapter_dir);
  if (settings().peft.save_merged) {
    const std::string merged_dir = output_dir + "/merged";
    RETURN_IF_ERROR(model_->SaveMerged(merged_dir));
    Log("info", "merged model written to " + merged_dir);
  }
  return Status::Ok();
}

}  // namespace llmctl::trainer
