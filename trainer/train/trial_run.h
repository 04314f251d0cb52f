// The run of one trial (RunTrial in trainer.h): setup, loading, the steps, checkpoints and the
// events that report them. Its implementation is split by concern: trial_run.cc (setup, loading,
// the loop and how it ends), trial_run_step.cc (one optimizer step), trial_run_checkpoints.cc
// (checkpoints, resume and the adapter outputs) and trial_run_events.cc (events and human lines).
//
// Internal to trainer/train.
#ifndef LLMCTL_TRAINER_TRAIN_TRIAL_RUN_H_
#define LLMCTL_TRAINER_TRAIN_TRIAL_RUN_H_

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/machine_cpu.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/kernels/kernel_choice.h"
#include "trainer/memory/accounting.h"
#include "trainer/memory/counting_allocator.h"
#include "trainer/parallel/parallelism.h"
#include "trainer/peft/lora.h"
#include "trainer/train/batches.h"
#include "trainer/train/checkpoints.h"
#include "trainer/train/events.h"
#include "trainer/train/machine_pace.h"
#include "trainer/train/optimizer.h"
#include "trainer/train/precision.h"
#include "trainer/train/profiling.h"
#include "trainer/train/trained_model.h"
#include "trainer/train/trainer.h"

namespace llmctl::trainer {

// What one step's micro-batches add up to on this rank (after SumAcrossRanks: on all ranks).
struct StepTotals {
  double loss_sum = 0.0;  // Σ micro-batch mean loss × its label tokens
  int64_t tokens = 0;     // real (not padding) tokens
};

// Everything one run holds; members are destroyed in reverse order, model last.
class TrialRun {
 public:
  using Clock = std::chrono::steady_clock;

  TrialRun(const TrialConfig& config, const RunOptions& options, EventLog& events)
      : config_(config), options_(options), events_(events) {}

  TrialResult Run();

 private:
  const TrialSettings& settings() const { return config_.settings(); }
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
  // The step event and the progress line; `cpu_at_start`: the machine's CPU counters as the step
  // began (nullopt: not read); `pace_seconds`: PaceCanary's seconds after it (nullopt: not timed).
  void ReportStep(int64_t step, double lr, double seconds, const StepTotals& totals,
                  int64_t label_tokens, const std::optional<CpuCounters>& cpu_at_start,
                  std::optional<double> pace_seconds);

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
  // A failure before training: invalid input unless the system refused a read or write.
  TrialResult FailedBeforeTraining(const Status& status) {
    TrialResult result = Finish(Outcome::kFailed, status.message());
    result.invalid_input = IsInputsFault(status);
    return result;
  }
  // Puts weights, optimizer state, data position and generators back from options_.resume_from.
  Status Resume();
  // The steps the trial runs: train.max_steps, else its epochs over the data at the global batch.
  int64_t TotalSteps() const;
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
  // A multi-rank run's clock when its ranks met: MakeParallelism returns once the process group
  // has connected every rank to every other, the same moment on every node. Node rank 0's ranks
  // wait there for the nodes launched after theirs, so it is the one moment by which another
  // node's clock can be set against rank 0's start (the report's memory chart does). Unset in a
  // one-process run.
  std::optional<double> ranks_met_elapsed_ms_;

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
  // Times the machine's pace after each step (the step event's pace_seconds): a one-process CPU
  // trial's that profiles no step; null otherwise.
  std::unique_ptr<PaceCanary> pace_canary_;
  std::unique_ptr<Parallelism> parallel_;  // one process, ddp or fsdp
  int rank_ = 0;                           // outputs (checkpoints, adapters, profile) on rank 0
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

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_TRAIN_TRIAL_RUN_H_
