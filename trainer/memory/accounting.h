// Memory accounting: the one place that knows the memory categories.
//
// A snapshot splits the training device's allocated bytes into params, grads, optimizer state (on
// the device and, for offloaded state, on the host), comm buckets (data parallelism's flat gradient
// buffers), gathered params (strategy fsdp's full parameters of the units gathered right now) and
// "other" (activations, buffers such as RoPE tables, temporaries) = allocated − params − grads −
// device optimizer state − comm buckets − gathered params. Under fsdp, params, grads and optimizer
// state are the rank's shards. Categories are
// counted from the tensors themselves, deduplicated by storage, so views and tied weights count
// once.
#ifndef LLMCTL_TRAINER_MEMORY_ACCOUNTING_H_
#define LLMCTL_TRAINER_MEMORY_ACCOUNTING_H_

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/memory/counting_allocator.h"

namespace llmctl::trainer {

struct MemorySnapshot {
  uint64_t params_bytes = 0;
  uint64_t grads_bytes = 0;
  uint64_t optim_device_bytes = 0;
  // In host memory, outside the device: offload: optimizer's master weights, moments and gradient
  // buffers; offload: full's parameter shards, their gradients and the moments.
  uint64_t optim_host_bytes = 0;
  uint64_t comm_bytes = 0;      // ddp's buckets, fsdp's flat gradient buffer ("comm buckets")
  uint64_t gathered_bytes = 0;  // fsdp's gathered full parameters ("gathered params")
  uint64_t other_bytes = 0;     // "Acts" in human output
  uint64_t allocated_bytes = 0;
  uint64_t peak_bytes = 0;  // high-water mark since the last ResetPeak()
  uint64_t reserved_bytes = 0;
};

// Allocation statistics of the training device: CUDA's caching allocator on GPUs, the counting
// allocator on CPU (where reserved equals allocated: nothing is cached).
class DeviceMemory {
 public:
  // For CPU, installs the counting allocator if it is not installed yet. For CUDA,
  // FailedPrecondition when no device is visible or the index is past those this process sees.
  static StatusOr<DeviceMemory> For(torch::Device device);

  torch::Device device() const { return device_; }
  uint64_t allocated_bytes() const;
  uint64_t peak_bytes() const;
  uint64_t reserved_bytes() const;
  void ResetPeak();
  // Allocations beyond `budget` fail with c10::OutOfMemoryError. CUDA: a fraction of the device's
  // memory.
  Status SetBudget(std::optional<uint64_t> budget);
  // Bytes of the request that failed and the bytes in use then, when the last OOM was a budget
  // refusal.
  std::optional<BudgetFailure> last_budget_failure() const;
  // The most the run may allocate on the device: the budget when one is set, else a GPU's whole
  // memory; nullopt for a CPU without a budget (host memory is no device limit).
  std::optional<uint64_t> limit_bytes() const;

  // Whether the tensor's storage lives in the device pool (vs host memory).
  bool OnDevice(const torch::Tensor& tensor) const;

 private:
  explicit DeviceMemory(torch::Device device) : device_(device) {}
  torch::Device device_;
  std::optional<uint64_t> budget_;  // as SetBudget last set it
};

// What a snapshot counts. `params` are everything that holds model weights (trainable or frozen,
// packed quantised weights included); their .grad() tensors are the grads; `optimizer_state` is
// every tensor an optimizer keeps (moments, step counters, fp32 master copies); `comm_buffers` the
// buffers gradients are communicated through (DDP's buckets; empty for one device);
// `gathered_params` FSDP's gathered flat parameter buffers (zero bytes while freed).
MemorySnapshot TakeSnapshot(const DeviceMemory& memory, const std::vector<torch::Tensor>& params,
                            const std::vector<torch::Tensor>& optimizer_state,
                            const std::vector<torch::Tensor>& comm_buffers,
                            const std::vector<torch::Tensor>& gathered_params);

// The snapshot at the moment an allocation failed: the categories as they are now, allocated as it
// was when the failing request came (the unwinding since then has freed temporaries).
MemorySnapshot SnapshotAtFailure(const DeviceMemory& memory,
                                 const std::vector<torch::Tensor>& params,
                                 const std::vector<torch::Tensor>& optimizer_state,
                                 const std::vector<torch::Tensor>& comm_buffers,
                                 const std::vector<torch::Tensor>& gathered_params);

// A device storage's accounting category ("params", "grads", "optimizer state", "comm buckets" or
// "gathered params"),
// by its data pointer: what the memory viewers name a live allocation (memory_history.h).
struct StorageCategory {
  uint64_t address;
  std::string category;
};

// The category of every device storage a snapshot would count as params, grads or optimizer state.
std::vector<StorageCategory> StorageCategories(const DeviceMemory& memory,
                                               const std::vector<torch::Tensor>& params,
                                               const std::vector<torch::Tensor>& optimizer_state,
                                               const std::vector<torch::Tensor>& comm_buffers,
                                               const std::vector<torch::Tensor>& gathered_params);

// Bytes of the storages behind `tensors`, each storage once.
uint64_t UniqueStorageBytes(const std::vector<torch::Tensor>& tensors);

// "Params: 0.52 GiB | Grads: … | Optim: … | Acts: … | Allocated: … (peak …) | Reserved: …", the
// labs' line; "Optim GPU/CPU" split when state is offloaded, "Comm: …" after Optim under DDP and
// FSDP, "Gathered: …" after it under FSDP.
std::string FormatSnapshot(const MemorySnapshot& snapshot);

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MEMORY_ACCOUNTING_H_
