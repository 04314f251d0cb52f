// How a trial's ranks share its work: one process, strategy ddp, or strategy fsdp. The training
// loop (trainer/train/trainer.cc) calls the hooks below at fixed points of every step and holds no
// strategy switch of its own. A new strategy (tensor or pipeline parallelism) is a new
// implementation of this interface and a case in MakeParallelism; it touches neither the step nor
// a model.
//
// The calls, in the order the loop makes them on every rank:
//
//   PrepareModel                       once: after the model is built, frozen and given its
//                                      adapters, before the optimizer is made
//   LoadCheckpoint                     when the trial resumes, after the optimizer is made
//   BeginTraining                      once, before the first step
//   for each step:
//     BeginStep                        with the rank's micro-batches of the step already drawn
//     for each micro-batch:
//       StopBetweenMicroBatches        (not before the first: BeginStep decided that one)
//       BeforeForward, forward
//       BeforeBackward, backward, AfterBackward
//                                      (a micro-batch without label tokens runs a backward only
//                                      when BackwardWithoutLabels)
//     FinishGradients, SumAcrossRanks (the step's loss and tokens), ClipGradNorm
//   SaveCheckpoint                     at the checkpoint steps and when a stop asks for one
//   FullModelState                     at the end, for the adapter outputs
//
// Collectives: every call that may communicate (PrepareModel, LoadCheckpoint, FullModelState,
// BeginTraining,
// BeginStep,
// BeforeForward, AfterBackward, FinishGradients, SumAcrossRanks, ClipGradNorm, SaveCheckpoint)
// is made by every rank, the same number of times and in the same order; the backward pass in
// between may communicate too (gradient hooks). A rank that skips one leaves the others waiting
// until the collective times out.
//
// Errors: a Status. A failure inside a collective leaves the ranks out of step, so the caller ends
// the trial as failed; nothing is thrown, except by the layer hooks some strategies install in the
// model (they run inside the model's forward, where a throw is the only way out).
//
// Memory: CommTensors and GatheredTensors are the strategy's own buffers, which memory accounting
// counts as "comm buckets" and "gathered params" (trainer/memory/accounting.h); ModelTensors says
// what it counts as the rank's params.
#ifndef LLMCTL_TRAINER_PARALLEL_PARALLELISM_H_
#define LLMCTL_TRAINER_PARALLEL_PARALLELISM_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/flat_layout.h"
#include "common/status.h"
#include "common/trial_config.h"
#include "trainer/dist/rank_env.h"
#include "trainer/train/checkpoints.h"
#include "trainer/train/trained_model.h"

namespace llmctl::trainer {

// What a rank holds of the model once the strategy has prepared it.
struct ModelTensors {
  // The rank's model state: memory accounting's params (their .grad its grads), and what its
  // parameter counts leave out of "trainable".
  std::vector<torch::Tensor> state;
  // What the rank's optimizer steps.
  std::vector<torch::Tensor> trainable;
  // What each trainable tensor is made of (MakeOptimizer's layouts): fsdp's shards hold pieces of
  // several parameters. Empty: each is one whole parameter.
  std::vector<std::vector<ShardPiece>> layouts;
  // The trainable tensors live in host memory (fsdp's offload: full): the optimizer keeps its
  // state there and steps there, and memory accounting counts them, their gradients and that state
  // as the host's.
  bool on_host = false;
};

// What a rank was asked (by a signal) when a step began.
enum class StopRequest {
  kNone,
  kStop,                // stop after the last complete step
  kStopWithCheckpoint,  // and write a checkpoint of it first
};

// What the ranks agreed at a step's start.
struct StepAgreement {
  // The ranks stop together, here, if any of them was asked; with a checkpoint if any asked for
  // one.
  StopRequest stop = StopRequest::kNone;
  // The global batch's label tokens: every rank's micro-batches of the step.
  int64_t label_tokens = 0;
  // What each micro-batch's weight (its label tokens over the global batch's) is multiplied by, so
  // that the strategy's reduction of the gradients yields the gradient of the global batch's mean
  // loss: the world size, which the ranks' gradient average divides by again.
  double gradient_scale = 1.0;
};

class Parallelism {
 public:
  virtual ~Parallelism() = default;

  // Outputs (checkpoints written by one rank, adapters, profiles, progress lines) come from rank 0.
  virtual int rank() const = 0;
  virtual int64_t world_size() const = 0;

  // Makes `model` this rank's part of the job (every rank starts from rank 0's weights) and says
  // what the rank holds and trains. `compute_dtype` is the dtype the model computes in (autocast's,
  // else the parameters'): a strategy that gathers parameters may gather them in it. May install
  // post-accumulate-grad hooks on the parameters and layer hooks in the model.
  virtual StatusOr<ModelTensors> PrepareModel(TrainedModel& model, torch::Dtype compute_dtype) = 0;

  // Puts `checkpoint` (LoadCheckpoint of `dir`) back into the rank's model; may replace
  // checkpoint.optimizer with this rank's own optimizer state, for the optimizer to load.
  virtual Status LoadCheckpoint(const std::string& dir, TrainedModel& model,
                                LoadedCheckpoint& checkpoint) = 0;

  // Writes the checkpoint at `dir`: the whole model in Hugging Face names, `optimizer` (this
  // rank's optimizer state) and `state`. True when this rank took part in writing it, and so
  // records it as the trial's newest.
  virtual StatusOr<bool> SaveCheckpoint(const std::string& dir, TrainedModel& model,
                                        const NamedTensors& optimizer,
                                        const TrainingState& state) = 0;

  // The whole model's parameters and buffers by name, as a checkpoint holds them, for what one rank
  // writes of it (adapters): a collective under fsdp, whose units are gathered one by one into host
  // copies in the shards' dtype.
  virtual StatusOr<NamedTensors> FullModelState(TrainedModel& model) = 0;

  // After the optimizer is made and any checkpoint loaded, before the first step, with what
  // PrepareModel returned.
  virtual Status BeginTraining(const ModelTensors& tensors) = 0;

  // The ranks' common decision at a step's start, from this rank's `label_tokens` (of all its
  // micro-batches of the step) and what it was `asked`.
  virtual StatusOr<StepAgreement> BeginStep(int64_t label_tokens, StopRequest asked) = 0;
  // Whether this rank may end the step alone before its next micro-batch when asked to stop. Ranks
  // whose steps run collectives cannot: they stop together, at the next BeginStep.
  virtual bool StopsBetweenMicroBatches() const = 0;

  // Before the model's forward of a micro-batch.
  virtual Status BeforeForward() = 0;
  // Whether a micro-batch without label tokens (a zero objective) must still run backward, because
  // the strategy's backward runs collectives that every rank must join.
  virtual bool BackwardWithoutLabels() const = 0;
  // Before a micro-batch's backward; `last` when it is the step's last micro-batch.
  virtual void BeforeBackward(bool last) = 0;
  // After a micro-batch's backward: reports the first failure of the strategy's gradient hooks.
  virtual Status AfterBackward() = 0;
  // After the step's last backward: the trainable tensors' .grad hold the global batch's gradient.
  virtual Status FinishGradients() = 0;

  // The element-wise sum over the ranks of at most two numbers.
  virtual StatusOr<std::vector<double>> SumAcrossRanks(const std::vector<double>& values) = 0;
  // Clips the global L2 norm of `trainable`'s gradients (the whole model's, over the ranks) to
  // `max_norm`; returns the norm before clipping.
  virtual StatusOr<double> ClipGradNorm(const std::vector<torch::Tensor>& trainable,
                                        double max_norm) = 0;

  // Memory accounting's "comm buckets" and "gathered params" (empty when the strategy has none).
  virtual std::vector<torch::Tensor> CommTensors() const = 0;
  virtual std::vector<torch::Tensor> GatheredTensors() const = 0;
};

// The trial's strategy: ddp or fsdp over the process group `env` describes when the trial has
// `strategy: ddp | fsdp` over more than one device (nodes x devices ranks), one process otherwise.
// Fails, saying how to start the ranks, when such a trial has no rank environment, or one of
// another world size.
StatusOr<std::unique_ptr<Parallelism>> MakeParallelism(const TrialConfig& config,
                                                       const std::optional<dist::RankEnv>& env,
                                                       torch::Device device);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_PARALLEL_PARALLELISM_H_
