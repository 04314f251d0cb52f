#include "trainer/parallel/ddp.h"

#include <utility>

#include "trainer/train/optimizer.h"

namespace llmctl::trainer {

StatusOr<std::unique_ptr<DataParallel>> DataParallel::Join(const dist::RankEnv& env,
                                                           torch::Device device,
                                                           uint64_t bucket_bytes) {
  ASSIGN_OR_RETURN(RankGroup group, RankGroup::Join(env, device));
  return std::unique_ptr<DataParallel>(new DataParallel(std::move(group), bucket_bytes));
}

Status DataParallel::BeginTraining(const ModelTensors& tensors) {
  {
    torch::NoGradGuard no_grad;
    for (torch::Tensor tensor : tensors.state) RETURN_IF_ERROR(group_.group().Broadcast(tensor, 0));
  }
  Attach(tensors.trainable);
  return Status::Ok();
}

void DataParallel::Attach(const std::vector<torch::Tensor>& params) {
  params_ = params;
  bucket_of_.assign(params_.size(), 0);
  // Reverse order: backward produces the last layers' gradients first, so the first bucket fills
  // (and its all-reduce starts) earliest. A bucket holds one dtype, as the flat tensor has one.
  uint64_t filled = 0;
  for (size_t i = params_.size(); i-- > 0;) {
    const torch::Tensor& p = params_[i];
    const uint64_t bytes = static_cast<uint64_t>(p.numel()) * p.element_size();
    const bool dtype_changes =
        !buckets_.empty() && params_[buckets_.back().params.front()].dtype() != p.dtype();
    if (buckets_.empty() || filled >= bucket_bytes_ || dtype_changes) {
      buckets_.emplace_back();
      filled = 0;
    }
    Bucket& bucket = buckets_.back();
    const int64_t offset =
        bucket.params.empty() ? 0 : bucket.offsets.back() + params_[bucket.params.back()].numel();
    bucket.params.push_back(i);
    bucket.offsets.push_back(offset);
    bucket_of_[i] = buckets_.size() - 1;
    filled += bytes;
  }
  for (Bucket& bucket : buckets_) {
    const torch::Tensor& last = params_[bucket.params.back()];
    const int64_t numel = bucket.offsets.back() + last.numel();
    bucket_tensors_.push_back(torch::zeros({numel}, last.options().requires_grad(false)));
    bucket.pending = bucket.params.size();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    SetPostAccumulateGradHook(params_[i], [this, i](const torch::Tensor&) { OnGradientReady(i); });
  }
}

torch::Tensor DataParallel::View(size_t bucket, size_t slot) {
  const torch::Tensor& p = params_[buckets_[bucket].params[slot]];
  return bucket_tensors_[bucket].narrow(0, buckets_[bucket].offsets[slot], p.numel()).view_as(p);
}

void DataParallel::OnGradientReady(size_t param) {
  if (!sync_) return;
  Bucket& bucket = buckets_[bucket_of_[param]];
  if (bucket.pending > 0) --bucket.pending;
  StartReadyBuckets(/*all=*/false);
}

void DataParallel::StartReadyBuckets(bool all) {
  for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
    Bucket& bucket = buckets_[next_bucket_];
    if (!all && bucket.pending > 0) return;
    torch::NoGradGuard no_grad;
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      const torch::Tensor& grad = params_[bucket.params[slot]].grad();
      torch::Tensor view = View(next_bucket_, slot);
      // A parameter this rank's step left without a gradient contributes zeros.
      if (grad.defined()) {
        view.copy_(grad);
      } else {
        view.zero_();
      }
    }
    auto work = group_.group().StartAllReduce(bucket_tensors_[next_bucket_], dist::ReduceOp::kAvg);
    if (!work.ok()) {
      if (error_.ok()) error_ = work.status();
      continue;
    }
    bucket.work.emplace(std::move(*work));
  }
}

Status DataParallel::FinishGradients() {
  StartReadyBuckets(/*all=*/true);
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.work) {
      const Status status = bucket.work->Wait();
      if (!status.ok() && error_.ok()) error_ = status;
      bucket.work.reset();
    }
    bucket.pending = bucket.params.size();
    if (!error_.ok()) continue;
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      torch::Tensor& grad = params_[bucket.params[slot]].mutable_grad();
      if (grad.defined()) {
        grad.copy_(View(b, slot));
      } else {
        grad = View(b, slot).clone();
      }
    }
  }
  next_bucket_ = 0;
  Status error = std::exchange(error_, Status::Ok());
  return error;
}

std::vector<torch::Tensor> DataParallel::CommTensors() const {
  std::vector<torch::Tensor> tensors = bucket_tensors_;
  tensors.push_back(group_.sum_slots());
  return tensors;
}

}  // namespace llmctl::trainer
