// TrialRun's optimizer step: its micro-batches' forward and backward, and the update.
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <utility>

#include "common/snapshot_event.h"
#include "trainer/train/trial_run.h"

namespace llmctl::trainer {
namespace {

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

}  // namespace

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
  // What else ran on the machine during the step, for a one-process trial: several ranks on one
  // machine share its CPUs by design.
  const std::optional<CpuCounters> cpu_at_start =
      parallel_->world_size() == 1 ? ReadCpuCounters() : std::nullopt;
  const auto started = Clock::now();
  if (profiler_) profiler_->BeginStep(step);
  // Profiled steps are snapshotted too, so their traces can be read beside the snapshots.
  snapshot_this_step_ = step == 0 || step == 1 || step % snapshot_every_ == 0 ||
                        (profiler_ && profiler_->Profiles(step));
  const double lr =
      LearningRate(settings().train.lr, step, settings().train.warmup_steps, total_steps_);

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
  // The rank's device (cuda:local_rank), which need not be the current one.
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  // Outside the step's seconds: the machine's pace as the step ended.
  const std::optional<double> pace_seconds =
      pace_canary_ ? std::optional<double>(pace_canary_->Seconds()) : std::nullopt;
  ReportStep(step, lr, seconds, totals, agreement.label_tokens, cpu_at_start, pace_seconds);
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
  const double grad_clip = settings().train.grad_clip;
  if (grads_finite && grad_clip > 0.0) {
    ValueOrThrow(parallel_->ClipGradNorm(model_tensors_.trainable, grad_clip));
  }
  if (grads_finite) {
    const auto host = OptimizerAllocations();
    optimizer_->Step(lr);
  }
  if (loss_scaler_) loss_scaler_->Update(grads_finite);
}

}  // namespace llmctl::trainer
