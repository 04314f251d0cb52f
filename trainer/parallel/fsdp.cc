#include "trainer/parallel/fsdp.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "trainer/memory/counting_allocator.h"
#include "trainer/parallel/fsdp_checkpoint.h"
#include "trainer/train/optimizer.h"

namespace llmctl::trainer {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The identity on a layer's hidden states whose backward calls `Hook` with the layer's number.
template <void (FullyShardedDataParallel::*Hook)(int64_t)>
struct LayerBackwardHook : public torch::autograd::Function<LayerBackwardHook<Hook>> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor hidden,
                               FullyShardedDataParallel* fsdp, int64_t layer) {
    ctx->saved_data["fsdp"] = reinterpret_cast<int64_t>(fsdp);
    ctx->saved_data["layer"] = layer;
    return hidden.view_as(hidden);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grad_outputs) {
    auto* fsdp = reinterpret_cast<FullyShardedDataParallel*>(ctx->saved_data["fsdp"].toInt());
    (fsdp->*Hook)(ctx->saved_data["layer"].toInt());
    return {grad_outputs[0], torch::Tensor(), torch::Tensor()};
  }
};

// On a layer's output: gathers the layer again before its own backward nodes run, which all lie
// upstream of this output, so none can run before it (FSDP2's pre-backward hook on the module's
// outputs).
using PreBackward = LayerBackwardHook<&FullyShardedDataParallel::GatherForBackward>;

// On a layer's input: runs once the gradient of that input is complete, that is once every
// backward node of the layer has run, so the layer's frozen parameters are done with (FSDP2's
// post-backward hook on the module's inputs).
using PostBackward = LayerBackwardHook<&FullyShardedDataParallel::FreeAfterBackward>;

// Frees `tensor`'s memory now, whoever still references its storage (FSDP1's resize_(0)): the old
// DataPtr, returned and dropped here, releases it.
void ReleaseStorage(const torch::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

// A host tensor of `numel` zeros with `options`' dtype, for offloaded shards: in the counting
// allocator's host pool on a cpu run, in pinned memory on cuda (so the copies to the device can be
// asynchronous, as FSDP2's CPUOffloadPolicy(pin_memory=True) keeps them).
torch::Tensor HostZeros(int64_t numel, const torch::TensorOptions& options) {
  ScopedHostAllocations host;
  torch::Tensor zeros = torch::zeros({numel}, options.device(torch::kCPU));
  return options.device().is_cuda() ? zeros.pin_memory() : zeros;
}

}  // namespace

StatusOr<std::unique_ptr<FullyShardedDataParallel>> FullyShardedDataParallel::Join(
    const dist::RankEnv& env, torch::Device device, const Options& options) {
  ASSIGN_OR_RETURN(RankGroup group, RankGroup::Join(env, device));
  return std::unique_ptr<FullyShardedDataParallel>(
      new FullyShardedDataParallel(std::move(group), env.local_rank, device, options));
}

FullyShardedDataParallel::FullyShardedDataParallel(RankGroup group, int local_rank,
                                                   torch::Device device, const Options& options)
    : group_(std::move(group)), local_rank_(local_rank), device_(device), options_(options) {}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  // A step that failed midway (out of memory in forward) may leave collectives in flight, which
  // write into buffers released below: they finish (or fail, the peers gone) first.
  if (reduction_) (void)reduction_->work.Wait();
  for (Flat& flat : flats_) {
    if (flat.gathering) (void)flat.gathering->Wait();
    // The hooks point at this object; the model may outlive it.
    for (const torch::Tensor& p : flat.params) SetPostAccumulateGradHook(p, nullptr);
  }
}

Status FullyShardedDataParallel::Shard(torch::nn::Module& model,
                                       const std::function<int64_t(const std::string&)>& layer_of,
                                       torch::Dtype param_dtype) {
  torch::NoGradGuard no_grad;
  RETURN_IF_ERROR(GroupIntoFlats(model, layer_of));
  for (Flat& flat : flats_) RETURN_IF_ERROR(ShardFlat(flat, param_dtype));
  if (shards_.empty()) {
    return InvalidArgumentError("strategy fsdp: the model has no trainable parameter to shard");
  }
  AllocateReductionBuffers();
  InstallGradientHooks();
  return Status::Ok();
}

Status FullyShardedDataParallel::GroupIntoFlats(
    torch::nn::Module& model, const std::function<int64_t(const std::string&)>& layer_of) {
  for (const auto& item : model.named_parameters()) {
    AddToUnit(layer_of(item.key()), item.key(), item.value(), item.value().requires_grad(),
              /*buffer=*/false);
  }
  for (const auto& item : model.named_buffers()) {
    AddToUnit(layer_of(item.key()), item.key(), item.value(), /*trainable=*/false,
              /*buffer=*/true);
  }
  // Every block owns parameters; a gap would mean the numbering and the hooks disagree.
  for (const std::vector<size_t>& unit : units_) {
    if (unit.empty()) return InternalError("fsdp: a unit has no parameters");
  }
  return Status::Ok();
}

// Each unit's trainable parameters form one flat parameter, its frozen ones (LoRA's base weights, a
// frozen BLIP-2 part) another, so that only the first has gradients, a reduction and optimizer
// state, and its buffers (QLoRA's NF4 codes and quantisation state) one per dtype, gathered in that
// dtype.
void FullyShardedDataParallel::AddToUnit(int64_t layer, const std::string& name,
                                         const torch::Tensor& tensor, bool trainable, bool buffer) {
  const size_t u = static_cast<size_t>(layer + 1);
  if (units_.size() <= u) units_.resize(u + 1);
  size_t f = flats_.size();
  for (size_t candidate : units_[u]) {
    const Flat& flat = flats_[candidate];
    if (flat.trainable == trainable && flat.buffer == buffer &&
        (!buffer || flat.params.front().scalar_type() == tensor.scalar_type())) {
      f = candidate;
    }
  }
  if (f == flats_.size()) {
    flats_.emplace_back();
    Flat& flat = flats_.back();
    flat.name = layer < 0 ? std::string("root") : "layer " + std::to_string(layer);
    if (buffer) {
      flat.name += std::string(" (buffers, ") + c10::toString(tensor.scalar_type()) + ")";
    } else if (!trainable) {
      flat.name += " (frozen)";
    }
    flat.trainable = trainable;
    flat.buffer = buffer;
    units_[u].push_back(f);
  }
  Flat& flat = flats_[f];
  flat.names.push_back(name);
  flat.params.push_back(tensor);
}

Status FullyShardedDataParallel::ShardFlat(Flat& flat, torch::Dtype param_dtype) {
  // Every rank starts from rank 0's weights, as DDP's broadcast makes them.
  for (torch::Tensor& p : flat.params) RETURN_IF_ERROR(group_.group().Broadcast(p, 0));
  const torch::TensorOptions options = flat.params.front().options().requires_grad(false);
  std::vector<int64_t> numels;
  for (const torch::Tensor& p : flat.params) numels.push_back(p.numel());
  const FlatLayout layout =
      LayOutFlat(numels, world_size(), flat.trainable ? options_.alignment : 1);
  flat.offsets = layout.offsets;
  flat.numel = layout.numel;
  flat.padded = layout.padded;
  if (flat.trainable) flat.pieces = ShardPieces(layout, numels, rank());
  const int64_t shard_numel = layout.shard();
  flat.shard =
      options_.offload ? HostZeros(shard_numel, options) : torch::zeros({shard_numel}, options);
  // The rank's piece of the flat parameter: the elements [rank × shard, (rank + 1) × shard) of the
  // parameters laid end to end, the padding left zero.
  const int64_t begin = rank() * shard_numel;
  for (size_t i = 0; i < flat.params.size(); ++i) {
    const int64_t first = std::max(begin, flat.offsets[i]);
    const int64_t last = std::min(begin + shard_numel, flat.offsets[i] + flat.params[i].numel());
    if (first >= last) continue;
    flat.shard.narrow(0, first - begin, last - first)
        .copy_(flat.params[i].reshape({-1}).narrow(0, first - flat.offsets[i], last - first));
  }
  if (flat.trainable) {
    flat.shard.requires_grad_(true);
    shards_.push_back(flat.shard);
  }
  flat.gathered = torch::empty({flat.padded}, flat.buffer ? options : options.dtype(param_dtype));
  // The parameters become views into the gathered buffer, in its dtype (as FSDP1's flat parameter
  // takes its low-precision data); their own storage dies here.
  for (size_t i = 0; i < flat.params.size(); ++i) {
    torch::Tensor& p = flat.params[i];
    p.set_data(flat.gathered.narrow(0, flat.offsets[i], p.numel()).view(p.sizes()));
  }
  Free(flat);
  flat.pending = flat.trainable ? flat.params.size() : 0;
  return Status::Ok();
}

void FullyShardedDataParallel::AllocateReductionBuffers() {
  int64_t max_padded = 0;
  for (const Flat& flat : flats_) {
    if (flat.trainable) max_padded = std::max(max_padded, flat.padded);
  }
  // On the device even when the shards are on the host (offload).
  grad_buffer_ =
      torch::zeros({max_padded}, shards_.front().options().device(device_).requires_grad(false));
  if (device_.is_cuda()) {
    scatter_buffer_ = torch::zeros({max_padded / world_size()}, grad_buffer_.options());
  }
}

// Only the parameters' tensors, not the module's, were replaced: the module names them too.
void FullyShardedDataParallel::InstallGradientHooks() {
  for (size_t f = 0; f < flats_.size(); ++f) {
    if (!flats_[f].trainable) continue;
    for (const torch::Tensor& p : flats_[f].params) {
      SetPostAccumulateGradHook(p, [this, f](const torch::Tensor&) { OnGradientReady(f); });
    }
  }
}

std::vector<torch::Tensor> FullyShardedDataParallel::GatheredTensors() const {
  std::vector<torch::Tensor> tensors;
  for (const Flat& flat : flats_) tensors.push_back(flat.gathered);
  return tensors;
}

std::vector<torch::Tensor> FullyShardedDataParallel::CommTensors() const {
  std::vector<torch::Tensor> tensors = {grad_buffer_, group_.sum_slots()};
  if (scatter_buffer_.defined()) tensors.push_back(scatter_buffer_);
  return tensors;
}

Status FullyShardedDataParallel::Gather(Flat& flat) {
  if (flat.gathering) {
    const Status status = flat.gathering->Wait();
    flat.gathering.reset();
    return status;
  }
  if (flat.gathered.storage().nbytes() > 0) return Status::Ok();
  ASSIGN_OR_RETURN(dist::PendingCollective gathering, StartGather(flat));
  return gathering.Wait();
}

Status FullyShardedDataParallel::Prefetch(Flat& flat) {
  if (flat.gathering || flat.gathered.storage().nbytes() > 0) return Status::Ok();
  ASSIGN_OR_RETURN(flat.gathering, StartGather(flat));
  return Status::Ok();
}

StatusOr<dist::PendingCollective> FullyShardedDataParallel::StartGather(Flat& flat) {
  c10::StorageImpl* storage = flat.gathered.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(flat.padded) * flat.gathered.element_size();
  // The storage's own allocator (the counting one on cpu, CUDA's caching one on cuda): the views
  // see the new memory at once, as their data pointers are the storage's plus their offsets.
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
  return StartAllGatherInto(flat, flat.gathered);
}

StatusOr<dist::PendingCollective> FullyShardedDataParallel::StartAllGatherInto(
    Flat& flat, torch::Tensor& buffer) {
  torch::NoGradGuard no_grad;
  const int64_t shard_numel = flat.shard.numel();
  torch::Tensor piece = buffer.narrow(0, rank() * shard_numel, shard_numel);
  if (device_.is_cuda()) {
    if (buffer.scalar_type() == flat.shard.scalar_type() && !options_.offload) {
      return group_.group().StartAllGatherIntoTensor(buffer, flat.shard);
    }
    // FSDP2's in-place all-gather: the shard, cast or copied from the host, is written into the
    // rank's own piece of the output, so the copy needs no buffer of its own.
    piece.copy_(flat.shard);
    return group_.group().StartAllGatherIntoTensor(buffer, piece);
  }
  buffer.zero_();
  piece.copy_(flat.shard);
  // Exact, in any dtype: each element is one rank's value plus zeros.
  return group_.group().StartAllReduce(buffer, dist::ReduceOp::kSum);
}

void FullyShardedDataParallel::Free(Flat& flat) {
  if (flat.gathering) {
    Fail(flat.gathering->Wait());
    flat.gathering.reset();
  }
  ReleaseStorage(flat.gathered);
}

Status FullyShardedDataParallel::GatherUnit(size_t u) {
  for (size_t f : units_[u]) RETURN_IF_ERROR(Gather(flats_[f]));
  return Status::Ok();
}

Status FullyShardedDataParallel::PrefetchUnit(size_t u) {
  for (size_t f : units_[u]) RETURN_IF_ERROR(Prefetch(flats_[f]));
  return Status::Ok();
}

void FullyShardedDataParallel::FreeUnit(size_t u, bool frozen_only) {
  for (size_t f : units_[u]) {
    if (!frozen_only || !flats_[f].trainable) Free(flats_[f]);
  }
}

Status FullyShardedDataParallel::BeforeForward() {
  RETURN_IF_ERROR(error_);
  RETURN_IF_ERROR(GatherUnit(0));
  // Layer 0's gather runs while the root's first ops (the embedding) do.
  return units_.size() > 1 ? PrefetchUnit(1) : Status::Ok();
}

torch::Tensor FullyShardedDataParallel::BeforeLayer(int64_t layer, const torch::Tensor& hidden) {
  const size_t u = static_cast<size_t>(layer + 1);
  Status status = GatherUnit(u);
  if (status.ok() && u + 1 < units_.size()) status = PrefetchUnit(u + 1);
  if (!status.ok()) {
    Fail(status);
    throw std::runtime_error(status.message());
  }
  // A frozen flat parameter has no gradient to say when backward is done with it: the gradient
  // of the layer's input does (every path through the layer has run by then).
  const bool has_frozen = std::any_of(units_[u].begin(), units_[u].end(),
                                      [this](size_t f) { return !flats_[f].trainable; });
  if (!has_frozen || !hidden.requires_grad()) return hidden;
  return PostBackward::apply(hidden, this, layer);
}

torch::Tensor FullyShardedDataParallel::AfterLayer(int64_t layer, const torch::Tensor& hidden) {
  if (options_.reshard_after_forward) FreeUnit(static_cast<size_t>(layer + 1), false);
  if (!hidden.requires_grad()) return hidden;
  return PreBackward::apply(hidden, this, layer);
}

void FullyShardedDataParallel::GatherForBackward(int64_t layer) {
  // An exception here would cross the autograd engine; the failure is reported after backward.
  if (!error_.ok()) return;
  const size_t u = static_cast<size_t>(layer + 1);
  Fail(GatherUnit(u));
  // The layer before it is next in backward (the root, unit 0, is gathered throughout).
  if (error_.ok() && u > 1) Fail(PrefetchUnit(u - 1));
}

void FullyShardedDataParallel::FreeAfterBackward(int64_t layer) {
  FreeUnit(static_cast<size_t>(layer + 1), /*frozen_only=*/true);
}

void FullyShardedDataParallel::OnGradientReady(size_t u) {
  Flat& flat = flats_[u];
  if (flat.pending > 0) --flat.pending;
  if (flat.pending > 0 || !error_.ok()) return;
  Fail(StartReduction(u));
  flat.pending = flat.params.size();
}

Status FullyShardedDataParallel::StartReduction(size_t u) {
  // The flat buffer is the previous reduce-scatter's until it is waited for.
  RETURN_IF_ERROR(FinishReduction());
  Flat& flat = flats_[u];
  torch::NoGradGuard no_grad;
  torch::Tensor grads = grad_buffer_.narrow(0, 0, flat.padded);
  // The buffer holds the previous unit's gradients: the padding's must be zeros again.
  int64_t filled = 0;
  for (size_t i = 0; i < flat.params.size(); ++i) {
    if (flat.offsets[i] > filled) grads.narrow(0, filled, flat.offsets[i] - filled).zero_();
    const torch::Tensor& grad = flat.params[i].grad();
    torch::Tensor slot = grads.narrow(0, flat.offsets[i], flat.params[i].numel());
    if (grad.defined()) {
      // Cast from param_dtype to the shards' dtype here: FSDP2's reduce_dtype.
      slot.copy_(grad.reshape({-1}));
    } else {
      slot.zero_();
    }
    filled = flat.offsets[i] + flat.params[i].numel();
  }
  grads.narrow(0, filled, flat.padded - filled).zero_();
  // The unit's gradients are in the flat buffer and its parameters are done with until the next
  // forward.
  for (torch::Tensor& p : flat.params) p.mutable_grad() = torch::Tensor();
  Free(flat);
  const int64_t shard_numel = flat.shard.numel();
  if (device_.is_cuda()) {
    torch::Tensor piece = scatter_buffer_.narrow(0, 0, shard_numel);
    ASSIGN_OR_RETURN(dist::PendingCollective work,
                     group_.group().StartReduceScatterTensor(piece, grads, dist::ReduceOp::kAvg));
    reduction_.emplace(Reduction{u, piece, std::move(work)});
  } else {
    ASSIGN_OR_RETURN(dist::PendingCollective work,
                     group_.group().StartAllReduce(grads, dist::ReduceOp::kAvg));
    reduction_.emplace(
        Reduction{u, grads.narrow(0, rank() * shard_numel, shard_numel), std::move(work)});
  }
  return Status::Ok();
}

Status FullyShardedDataParallel::FinishReduction() {
  if (!reduction_) return Status::Ok();
  Reduction reduction = std::move(*reduction_);
  reduction_.reset();
  RETURN_IF_ERROR(reduction.work.Wait());
  torch::NoGradGuard no_grad;
  // Accumulated micro-batches add their reduced pieces, as FSDP2 accumulates sharded gradients.
  torch::Tensor& shard_grad = flats_[reduction.flat].shard.mutable_grad();
  if (shard_grad.defined()) {
    // With offload a cuda run's piece is copied to the host first; a cpu run's is already there.
    shard_grad.add_(reduction.piece.to(shard_grad.device()));
  } else if (options_.offload) {
    // The gradient shard lives with its shard, on the host.
    ScopedHostAllocations host;
    shard_grad = reduction.piece.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
  } else {
    shard_grad = reduction.piece.clone();
  }
  return Status::Ok();
}

Status FullyShardedDataParallel::AfterBackward() {
  // The last unit's reduce-scatter (the root's).
  Fail(FinishReduction());
  Status error = std::exchange(error_, Status::Ok());
  for (Flat& flat : flats_) {
    const size_t expected = flat.trainable ? flat.params.size() : 0;
    if (flat.pending != expected && error.ok()) {
      error = InternalError("fsdp: backward left " + std::to_string(flat.pending) + " of " +
                            flat.name + "'s " + std::to_string(flat.params.size()) +
                            " parameters without a gradient");
    }
    flat.pending = expected;
    for (torch::Tensor& p : flat.params) p.mutable_grad() = torch::Tensor();
    Free(flat);
  }
  return error;
}

StatusOr<double> FullyShardedDataParallel::ClipGradNorm(const std::vector<torch::Tensor>& trainable,
                                                        double max_norm) {
  torch::NoGradGuard no_grad;
  // The padding's gradient is zero, so the shards' squares sum to the whole model's.
  double squares = 0.0;
  for (const torch::Tensor& shard : trainable) {
    if (!shard.grad().defined()) continue;
    const double norm =
        shard.grad().norm(2, torch::IntArrayRef{}, false, torch::kFloat32).item<double>();
    squares += norm * norm;
  }
  ASSIGN_OR_RETURN(std::vector<double> total, SumAcrossRanks({squares}));
  const double norm = std::sqrt(total.at(0));
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    for (const torch::Tensor& shard : trainable) {
      if (shard.grad().defined()) shard.grad().mul_(coefficient);
    }
  }
  return norm;
}

StatusOr<ModelTensors> FullyShardedDataParallel::PrepareModel(TrainedModel& model,
                                                              torch::Dtype compute_dtype) {
  RETURN_IF_ERROR(Shard(
      model.module(), [&model](const std::string& name) { return model.LayerOf(name); },
      compute_dtype));
  ModelTensors tensors;
  // Every parameter's and buffer's shard.
  for (const Flat& flat : flats_) tensors.state.push_back(flat.shard);
  tensors.trainable = shards_;
  for (const Flat& flat : flats_) {
    if (flat.trainable) tensors.layouts.push_back(flat.pieces);
  }
  tensors.on_host = options_.offload;
  model.SetLayerHooks(this);
  return tensors;
}

StatusOr<NamedTensors> FullyShardedDataParallel::FullModelState(TrainedModel&) {
  return FullState();
}

Status FullyShardedDataParallel::LoadCheckpoint(const std::string& dir, TrainedModel&,
                                                LoadedCheckpoint& checkpoint) {
  return LoadShardedCheckpoint(*this, dir, checkpoint);
}

StatusOr<bool> FullyShardedDataParallel::SaveCheckpoint(const std::string& dir, TrainedModel&,
                                                        const NamedTensors& optimizer,
                                                        const TrainingState& state) {
  RETURN_IF_ERROR(SaveShardedCheckpoint(*this, dir, optimizer, state));
  return true;
}

StatusOr<std::vector<std::pair<std::string, torch::Tensor>>> FullyShardedDataParallel::FullState() {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (Flat& flat : flats_) {
    if (flat.gathered.scalar_type() == flat.shard.scalar_type()) {
      RETURN_IF_ERROR(Gather(flat));
      for (size_t i = 0; i < flat.params.size(); ++i) {
        // A host copy that the checkpoint owns (on cpu, outside the device pool's accounting only
        // in that it lives as long as the write).
        state.emplace_back(flat.names[i],
                           flat.params[i].detach().to(torch::kCPU, /*non_blocking=*/false,
                                                      /*copy=*/true));
      }
      Free(flat);
      continue;
    }
    // The checkpoint holds the shards' (master) weights, not their param_dtype casts: the unit is
    // gathered in the shards' dtype into a buffer that lives only for this unit's copies.
    torch::Tensor buffer =
        torch::empty({flat.padded}, flat.shard.options().device(device_).requires_grad(false));
    ASSIGN_OR_RETURN(dist::PendingCollective gathering, StartAllGatherInto(flat, buffer));
    RETURN_IF_ERROR(gathering.Wait());
    for (size_t i = 0; i < flat.params.size(); ++i) {
      state.emplace_back(flat.names[i],
                         buffer.narrow(0, flat.offsets[i], flat.params[i].numel())
                             .view(flat.params[i].sizes())
                             .to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true));
    }
    // Not left to the last reference: Gloo's worker thread may hold one for a while.
    ReleaseStorage(buffer);
  }
  return state;
}

Status FullyShardedDataParallel::LoadFullState(const std::map<std::string, torch::Tensor>& state) {
  torch::NoGradGuard no_grad;
  for (Flat& flat : flats_) {
    const int64_t shard_numel = flat.shard.numel();
    const int64_t begin = rank() * shard_numel;
    flat.shard.zero_();
    for (size_t i = 0; i < flat.params.size(); ++i) {
      auto it = state.find(flat.names[i]);
      if (it == state.end() || !it->second.sizes().equals(flat.params[i].sizes())) {
        return DataLossError("tensor '" + flat.names[i] +
                             "' is missing or has another shape (a checkpoint of a different "
                             "model?)");
      }
      const int64_t first = std::max(begin, flat.offsets[i]);
      const int64_t last = std::min(begin + shard_numel, flat.offsets[i] + flat.params[i].numel());
      if (first >= last) continue;
      flat.shard.narrow(0, first - begin, last - first)
          .copy_(it->second.reshape({-1}).narrow(0, first - flat.offsets[i], last - first));
    }
  }
  return Status::Ok();
}

}  // namespace llmctl::trainer
