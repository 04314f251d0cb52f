// strategy: fsdp, PyTorch's fully sharded data parallelism (FSDP2's fully_shard) over
// trainer/dist's c10d process group.
//
// Units: every block is one unit (a LLaMA decoder layer; BLIP-2's vision, Q-Former and language
// model blocks); everything else (the embeddings, the final norms, the output head) is the root
// unit, as fully_shard(model) after fully_shard(block) for each block leaves them. A unit's
// parameters are laid out, in named_parameters order, in one flat tensor padded with zeros to a
// multiple of the world size N (common/flat_layout.h); each rank keeps only its 1/N piece of it,
// the shard, a leaf tensor that requires grad: the optimizer's parameter, its gradient the gradient
// shard, its state the optimizer-state shard. Under 8-bit AdamW the trainable flats are aligned to
// its state blocks (each parameter starts on a multiple of 256 elements, each shard is whole
// blocks), and the optimizer is told which pieces of which parameters each shard holds, so its
// blockwise state is one process's, cut between the ranks at block boundaries.
//
// The module's parameters stay the model's own tensors, but their data are views into the unit's
// gathered flat buffer (FSDP1's flat parameter): gathering allocates the buffer's storage and
// all-gathers the shards into it, freeing releases the storage (resizes it to zero bytes) while
// every view, and every tensor autograd saved for backward, keeps pointing at the same storage.
// So memory is freed when FSDP says, never when a last reference happens to die: c10d's Gloo
// worker thread keeps references to a collective's tensors for a while after wait() returns.
//
// Forward: the root is gathered before the model runs (BeforeForward) and stays gathered until its
// gradients are reduced at the end of backward (FSDP2 does not reshard the root after forward, as
// backward needs it first). Layer i is gathered before its forward and, with
// fsdp.reshard_after_forward (ZeRO-3, the default), freed after it; an identity autograd node on
// its output gathers it again when backward reaches it (activation checkpointing recomputes inside
// that window). Without reshard_after_forward (ZeRO-2) the layers stay gathered from their forward
// until their gradients are reduced. When a unit's last parameter has accumulated its gradient
// (post-accumulate-grad hooks, counted per unit), its gradients are copied into the flat gradient
// buffer and reduce-scattered with mean into the rank's piece, and the unit's unsharded gradients
// and gathered parameters are freed; the piece is added to the gradient shard when that
// reduce-scatter is waited for. Every micro-batch reduce-scatters (FSDP2's default; no no_sync).
//
// Prefetch and overlap, as FSDP2 does them with async work handles: while layer i computes its
// forward, layer i + 1's all-gather is in flight (started once layer i's has been waited for; the
// root's gather starts layer 0's); while backward computes layer i, layer i - 1's all-gather is in
// flight, and so is the reduce-scatter of the unit whose gradients were finished last (one at a
// time: the next unit's reduce-scatter waits for it, and AfterBackward for the last). So at most
// two layers are gathered at once besides the root, and every collective but the first gather of a
// pass overlaps compute. Every rank issues the same collectives in the same order, because every
// rank runs the same model's forward and backward.
//
// On Gloo (cpu) the all-gather and the reduce-scatter are both an in-place all-reduce of the flat
// buffer (the rank's piece written in, zeros elsewhere, summed; or the gradients averaged and the
// rank's piece taken): Gloo's own all-gather and reduce-scatter allocate full-size temporaries
// that its worker thread frees at an unpredictable time, and Gloo's reduce-scatter is an
// all-reduce anyway. On NCCL (cuda) they are the real all-gather and reduce-scatter.
//
// Frozen parameters and buffers: a unit's frozen parameters (LoRA's base weights, a frozen BLIP-2
// part) form a flat parameter of their own, with no gradient, reduction or optimizer state, freed
// in backward by an identity node on the layer's input once that input's gradient is complete; its
// buffers (QLoRA's NF4 codes and scales) one flat per dtype, gathered in that dtype.
//
// Full offload (`offload: full`), FSDP2's CPUOffloadPolicy and DeepSpeed's ZeRO-3 offload: the
// shards, their gradients and the optimizer's state live in host memory (the host pool on a cpu
// run, outside the device_memory budget; pinned memory on cuda) and the optimizer steps there
// (ModelTensors::on_host). A unit's gather copies the rank's shard into its piece of the device's
// flat buffer first; a reduced piece is copied back into the host gradient shard. The device holds
// only the gathered units, the flat gradient buffer and the activations.
//
// Mixed precision, FSDP2's MixedPrecisionPolicy(param_dtype, reduce_dtype=the shards' dtype): the
// gathered buffers, hence the parameters the model computes with and their gradients, are in
// param_dtype. Each rank casts its shard into its own piece of the gathered buffer and all-gathers
// that; a unit's gradients are cast into the flat gradient buffer, in the shards' dtype, and
// reduced there. For bf16-mixed: bf16 gathers over fp32 shards, half the gathered bytes.
#ifndef LLMCTL_TRAINER_PARALLEL_FSDP_H_
#define LLMCTL_TRAINER_PARALLEL_FSDP_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/flat_layout.h"
#include "common/status.h"
#include "trainer/dist/process_group.h"
#include "trainer/dist/rank_env.h"
#include "trainer/model/layer_hooks.h"
#include "trainer/parallel/parallelism.h"
#include "trainer/parallel/rank_group.h"

namespace llmctl::trainer {

class FullyShardedDataParallel final : public Parallelism, public LayerHooks {
 public:
  // Joins the process group `env` describes on `device`'s backend: Gloo for cpu, NCCL for cuda.
  struct Options {
    bool reshard_after_forward = true;  // fsdp.reshard_after_forward (above)
    bool offload = false;               // offload: full (above)
    // The trainable flats' alignment in elements: common/flat_layout.h's ShardAlignment for the
    // trial's optimizer.
    int64_t alignment = 1;
  };
  static StatusOr<std::unique_ptr<FullyShardedDataParallel>> Join(const dist::RankEnv& env,
                                                                  torch::Device device,
                                                                  const Options& options);
  ~FullyShardedDataParallel() override;

  int rank() const override { return group_.rank(); }
  // This rank's index on its node (0: the node's first rank).
  int local_rank() const { return local_rank_; }
  int64_t world_size() const override { return group_.world_size(); }

  // Shards `model` (Shard, in `compute_dtype`) and installs this object as its layer hooks. The
  // rank's state is its flat shards (and the model's buffers, whole on every rank); its trainable
  // tensors are the shards, and their layouts the pieces of parameters each holds.
  StatusOr<ModelTensors> PrepareModel(TrainedModel& model, torch::Dtype compute_dtype) override;
  // This rank's pieces of the full model, and its own optimizer shard (fsdp_checkpoint.h).
  Status LoadCheckpoint(const std::string& dir, TrainedModel& model,
                        LoadedCheckpoint& checkpoint) override;
  // The collective write of fsdp_checkpoint.h: every rank takes part.
  StatusOr<bool> SaveCheckpoint(const std::string& dir, TrainedModel& model,
                                const NamedTensors& optimizer, const TrainingState& state) override;
  // FullState: every parameter and buffer is in a unit.
  StatusOr<NamedTensors> FullModelState(TrainedModel& model) override;
  Status BeginTraining(const ModelTensors&) override { return Status::Ok(); }

  StatusOr<StepAgreement> BeginStep(int64_t label_tokens, StopRequest asked) override {
    return group_.AgreeOnStep(label_tokens, asked);
  }
  bool StopsBetweenMicroBatches() const override { return false; }
  // Gathers the root unit.
  Status BeforeForward() override;
  // Every unit's gathers and reductions are collectives.
  bool BackwardWithoutLabels() const override { return true; }
  void BeforeBackward(bool) override {}
  // Every unit's gradients must have been reduced and every gathered buffer freed; reports the
  // first failure inside a hook.
  Status AfterBackward() override;
  // Each micro-batch's backward has reduce-scattered into the gradient shards already.
  Status FinishGradients() override { return Status::Ok(); }

  StatusOr<std::vector<double>> SumAcrossRanks(const std::vector<double>& values) override {
    return group_.Sum(values);
  }
  // The norm of the rank's gradient shards' squares summed over the ranks: the whole model's.
  StatusOr<double> ClipGradNorm(const std::vector<torch::Tensor>& trainable,
                                double max_norm) override;

  // The flat gradient buffer (in the shards' dtype) and the sums' slots.
  std::vector<torch::Tensor> CommTensors() const override;
  // The units' gathered flat buffers in param_dtype (zero bytes while freed).
  std::vector<torch::Tensor> GatheredTensors() const override;

  // Makes rank 0's weights every rank's, then shards `model` into its units: afterwards the model's
  // parameters and buffers own no memory until gathered, and the flats' shards hold the rank's
  // pieces. Once, after the model is built and before the optimizer is made.
  // `layer_of` names each parameter's unit by the parameter's name: its block's number (0, 1, ...:
  // the number the model's LayerHooks calls carry), -1 for the root.
  // `param_dtype` is FSDP2's MixedPrecisionPolicy.param_dtype: the shards keep the model's dtype,
  // but the units are gathered, computed with and their gradients produced in `param_dtype`; the
  // gradients are reduced in the shards' dtype (reduce_dtype). bf16 over fp32 shards for
  // bf16-mixed; the shards' own dtype otherwise.
  Status Shard(torch::nn::Module& model, const std::function<int64_t(const std::string&)>& layer_of,
               torch::Dtype param_dtype);

  // LayerHooks: gather layer i before its forward (and start layer i + 1's), free it after unless
  // the layers stay gathered until backward.
  torch::Tensor BeforeLayer(int64_t layer, const torch::Tensor& hidden) override;
  torch::Tensor AfterLayer(int64_t layer, const torch::Tensor& hidden) override;
  // From the autograd node on layer i's output: gathers layer i for its backward and starts layer
  // i - 1's (a failure is kept for AfterBackward, as nothing may throw through the autograd
  // engine).
  void GatherForBackward(int64_t layer);
  // From the autograd node on layer i's input: backward is done with layer i, whose frozen
  // parameters are freed (its trainable ones are freed when their gradients are reduced).
  void FreeAfterBackward(int64_t layer);

  // The whole model in Hugging Face names, gathered unit by unit into host copies (collective:
  // every rank must call it; rank 0 writes it).
  StatusOr<std::vector<std::pair<std::string, torch::Tensor>>> FullState();
  // Puts a full state (FullState's names and shapes) back into the rank's shards.
  Status LoadFullState(const std::map<std::string, torch::Tensor>& state);

  Status Barrier() { return group_.group().Barrier(); }

 private:
  // One flat parameter of a unit (FSDP1's FlatParameter): its parameters laid end to end, padded,
  // the rank's shard of them and the buffer they are gathered into.
  struct Flat {
    std::string name;  // "root", "layer 3", "layer 3 (frozen)", "layer 3 (buffers, Byte)"
    std::vector<std::string> names;     // Hugging Face names of its parameters
    std::vector<torch::Tensor> params;  // the module's parameters (views into `gathered`)
    std::vector<int64_t> offsets;       // each one's first element in the flat parameter
    int64_t numel = 0;                  // the end of its last parameter
    int64_t padded = 0;                 // the flat's length with padding (common/flat_layout.h)
    std::vector<ShardPiece> pieces;     // what the rank's shard holds
    torch::Tensor shard;                // (padded / N,), on the host with offload
    torch::Tensor gathered;             // (padded,) in param_dtype, storage freed between uses
    std::optional<dist::PendingCollective> gathering;  // its all-gather, while in flight
    bool trainable = true;  // false: frozen parameters (no gradient, no reduction, no state)
    bool buffer = false;    // buffers (QLoRA's NF4 codes and scales), gathered in their own dtype
    size_t pending = 0;     // gradients not yet accumulated in this backward
  };
  // The reduce-scatter in flight: whose, and where its piece of the mean lands.
  struct Reduction {
    size_t flat = 0;
    torch::Tensor piece;  // (padded / N,)
    dist::PendingCollective work;
  };

  FullyShardedDataParallel(RankGroup group, int local_rank, torch::Device device,
                           const Options& options);
  // Shard's steps. Groups the model's parameters and buffers into their units' flat parameters.
  Status GroupIntoFlats(torch::nn::Module& model,
                        const std::function<int64_t(const std::string&)>& layer_of);
  // Adds one tensor to the flat of unit `layer + 1` that holds its kind (trainable, frozen, or
  // buffers of its dtype), making that flat if the unit has none yet.
  void AddToUnit(int64_t layer, const std::string& name, const torch::Tensor& tensor,
                 bool trainable, bool buffer);
  // Lays `flat` out, copies the rank's shard of rank 0's weights into it and makes its parameters
  // views into its (freed) gathered buffer.
  Status ShardFlat(Flat& flat, torch::Dtype param_dtype);
  // The gradient buffer a unit's reduce-scatter works in, sized for the largest trainable flat.
  void AllocateReductionBuffers();
  // Starts a unit's reduction once its last trainable parameter's gradient is accumulated.
  void InstallGradientHooks();
  // The same as below for every flat parameter of unit `u` (0: the root, i + 1: layer i).
  Status GatherUnit(size_t u);
  Status PrefetchUnit(size_t u);
  void FreeUnit(size_t u, bool frozen_only);
  // Makes `flat` gathered: waits for its prefetch, or gathers it now.
  Status Gather(Flat& flat);
  // Starts gathering `flat` unless it is gathered or being gathered.
  Status Prefetch(Flat& flat);
  // Allocates `flat`'s gathered storage and starts its all-gather.
  StatusOr<dist::PendingCollective> StartGather(Flat& flat);
  // Starts all-gathering `flat`'s shards into `buffer` (padded elements, any dtype: the shard is
  // cast).
  StatusOr<dist::PendingCollective> StartAllGatherInto(Flat& flat, torch::Tensor& buffer);
  // Releases `unit`'s gathered storage (after waiting for its gather, if one is in flight).
  void Free(Flat& flat);
  // Waits for the reduce-scatter in flight, if any, and adds its piece to its gradient shard.
  Status FinishReduction();
  // Copies `units_[u]`'s gradients into the flat buffer and starts their reduce-scatter (after the
  // previous one's, whose buffer it reuses); frees the unit's gradients and gathered parameters.
  Status StartReduction(size_t u);
  void OnGradientReady(size_t flat);
  void Fail(const Status& status) {
    if (error_.ok()) error_ = status;
  }

  RankGroup group_;
  int local_rank_;
  torch::Device device_;
  Options options_;
  std::vector<Flat> flats_;
  // The flat parameters of each unit, as indices into flats_: the root's first, then layer i's at
  // index i + 1 (a unit's trainable flat parameter and, with frozen parameters, its frozen one).
  std::vector<std::vector<size_t>> units_;
  std::vector<torch::Tensor> shards_;  // the trainable flats' shards: what the optimizer steps
  torch::Tensor grad_buffer_;     // (max padded,): a unit's unsharded gradients, reduced in place
  torch::Tensor scatter_buffer_;  // (max padded / N,): NCCL's reduce-scatter output (cuda only)
  std::optional<Reduction> reduction_;  // the reduce-scatter in flight
  Status error_;                        // the first failure inside a hook or an autograd node
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_PARALLEL_FSDP_H_
