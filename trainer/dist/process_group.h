// A c10d process group (PyTorch's own distributed engine, from the LibTorch we link): the
// rendezvous through a TCPStore that rank 0 hosts, and Gloo or NCCL underneath. The collectives are
// the ones data parallelism needs: DDP all-reduces flat gradient buckets, FSDP reduce-scatters
// gradients into flat shards and all-gathers parameter shards back; each call waits for its result
// and returns a Status, never an exception.
#ifndef LLMCTL_TRAINER_DIST_PROCESS_GROUP_H_
#define LLMCTL_TRAINER_DIST_PROCESS_GROUP_H_

#include <ATen/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "common/status.h"
#include "trainer/dist/rank_env.h"

namespace llmctl::dist {

enum class BackendKind {
  kGloo,  // CPU tensors, and CUDA tensors (staged through the host)
  kNccl,  // CUDA tensors, one distinct GPU per rank; only in a CUDA build
};

// "gloo" or "nccl"; InvalidArgument naming the value otherwise.
StatusOr<BackendKind> ParseBackendKind(std::string_view name);
std::string_view BackendKindName(BackendKind kind);
// Whether this build has `kind` (NCCL needs the CUDA build of LibTorch).
bool BackendKindCompiled(BackendKind kind);

enum class ReduceOp { kSum, kAvg };

struct ProcessGroupOptions {
  BackendKind backend = BackendKind::kGloo;
  // How long a rank waits for the store on MASTER_ADDR:MASTER_PORT and for the other ranks to join.
  std::chrono::milliseconds rendezvous_timeout{std::chrono::seconds(60)};
  // How long one collective may take before it fails.
  std::chrono::milliseconds collective_timeout{std::chrono::minutes(10)};
  // The CUDA device this rank's NCCL communicator uses (LOCAL_RANK, usually); ignored by Gloo.
  int cuda_device = 0;
};

// The padded length of each rank's shard when `numel` elements are split across `world_size`
// ranks: ceil(numel / world_size). A flat tensor is padded with zeros to shard * world_size
// elements so that reduce-scatter and all-gather see equal pieces.
int64_t ShardNumel(int64_t numel, int world_size);

// A collective started by one of ProcessGroup's Start calls and not yet waited for: DDP starts one
// all-reduce per gradient bucket while backward is still computing the others; FSDP gathers the
// next unit while the current one computes, and reduces a unit's gradients while backward goes on.
// Its tensors must stay untouched until Wait returns. Dropping it without Wait leaves the
// collective running.
class PendingCollective {
 public:
  PendingCollective(PendingCollective&&) = default;
  PendingCollective& operator=(PendingCollective&&) = default;

  // Waits until the output holds the result (for a mean on Gloo, divides it here); Unavailable
  // naming the collective and the rank when it failed. On NCCL, waiting makes the current CUDA
  // stream wait for the collective's: the host goes on at once.
  Status Wait();

 private:
  friend class ProcessGroup;
  PendingCollective(std::string_view name, c10::intrusive_ptr<c10d::Work> work, at::Tensor output,
                    int divisor, int rank)
      : name_(name),
        work_(std::move(work)),
        output_(std::move(output)),
        divisor_(divisor),
        rank_(rank) {}

  std::string_view name_;  // "all_reduce", ...: a literal
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor output_;
  int divisor_ = 1;  // the world size for a mean the backend cannot take itself, else 1
  int rank_ = 0;
};

class ProcessGroup {
 public:
  // Joins the group `env` describes: rank 0 binds MASTER_PORT and serves the store
  // (FailedPrecondition when the port is already in use), every rank connects to it (Unavailable
  // when it cannot within the rendezvous timeout), then the backend connects the ranks to each
  // other.
  static StatusOr<ProcessGroup> Create(const RankEnv& env, const ProcessGroupOptions& options);

  ProcessGroup(ProcessGroup&&) = default;
  ProcessGroup& operator=(ProcessGroup&&) = default;
  ~ProcessGroup();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  BackendKind backend() const { return backend_kind_; }

  // In place: every rank's `tensor` becomes the element-wise sum (or mean) over the ranks.
  Status AllReduce(at::Tensor& tensor, ReduceOp op);
  // AllReduce without waiting.
  StatusOr<PendingCollective> StartAllReduce(at::Tensor& tensor, ReduceOp op);
  // In place: every rank's `tensor` becomes rank `root`'s.
  Status Broadcast(at::Tensor& tensor, int root);
  // `output` (world_size * input.numel() elements, contiguous) becomes the ranks' `input`s one
  // after another in rank order.
  Status AllGatherIntoTensor(at::Tensor& output, const at::Tensor& input);
  StatusOr<PendingCollective> StartAllGatherIntoTensor(at::Tensor& output, const at::Tensor& input);
  // `output` becomes this rank's piece of the reduction over the ranks of `input` (world_size *
  // output.numel() elements): rank r gets elements [r * n, (r + 1) * n) of the sum (or mean).
  Status ReduceScatterTensor(at::Tensor& output, const at::Tensor& input, ReduceOp op);
  StatusOr<PendingCollective> StartReduceScatterTensor(at::Tensor& output, const at::Tensor& input,
                                                       ReduceOp op);
  // Returns once every rank has called it.
  Status Barrier();

 private:
  ProcessGroup(int rank, int world_size, BackendKind backend_kind, int cuda_device,
               c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Backend> backend);

  using WorkPtr = c10::intrusive_ptr<c10d::Work>;
  // Starts the collective `start` issues, whose result lands in `output` (`op` says whether a
  // mean is finished there on Wait); c10d reports failures by throwing, which stops here.
  StatusOr<PendingCollective> Start(std::string_view name, at::Tensor output, ReduceOp op,
                                    const std::function<WorkPtr()>& start);
  // Gloo has no native mean: it sums, and the pending collective divides, which is exact whenever
  // the mean is representable in the tensor's dtype.
  c10d::ReduceOp NativeOp(ReduceOp op) const;

  int rank_ = 0;
  int world_size_ = 1;
  BackendKind backend_kind_ = BackendKind::kGloo;
  int cuda_device_ = 0;
  // c10d's own ownership (intrusive_ptr): the backend keeps using the store while it runs.
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
};

}  // namespace llmctl::dist

#endif  // LLMCTL_TRAINER_DIST_PROCESS_GROUP_H_
