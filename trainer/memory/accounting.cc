#include "trainer/memory/accounting.h"

#include <unordered_set>

#include "common/byte_size.h"
#include "common/text.h"

#ifdef LLMCTL_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace llmctl::trainer {
namespace {

#ifdef LLMCTL_HAVE_CUDA
// "cuda" without an index means the first device.
c10::DeviceIndex CudaIndex(torch::Device device) { return device.index() < 0 ? 0 : device.index(); }

c10::CachingDeviceAllocator::DeviceStats CudaStats(torch::Device device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(CudaIndex(device));
}
constexpr size_t kAggregatePool = 0;  // StatType::AGGREGATE
#endif

// Sums storage bytes into one of the categories, skipping storages already counted anywhere.
class StorageCounter {
 public:
  explicit StorageCounter(const DeviceMemory& memory) : memory_(memory) {}

  void Add(const torch::Tensor& tensor, uint64_t& device_total, uint64_t* host_total) {
    if (!tensor.defined() || !tensor.has_storage()) return;
    const c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
    if (!seen_.insert(storage).second) return;
    const uint64_t bytes = tensor.storage().nbytes();
    if (memory_.OnDevice(tensor)) {
      device_total += bytes;
    } else if (host_total != nullptr) {
      *host_total += bytes;
    }
  }

 private:
  const DeviceMemory& memory_;
  std::unordered_set<const c10::StorageImpl*> seen_;
};

MemorySnapshot Categorize(const DeviceMemory& memory, const std::vector<torch::Tensor>& params,
                          const std::vector<torch::Tensor>& optimizer_state,
                          const std::vector<torch::Tensor>& comm_buffers,
                          const std::vector<torch::Tensor>& gathered_params, uint64_t allocated) {
  MemorySnapshot snapshot;
  StorageCounter counter(memory);
  // Parameters and gradients kept in host memory (fsdp's offload: full keeps its shards there) are
  // the optimizer's host state, as offload: optimizer's master weights and gradient buffers are.
  for (const torch::Tensor& p : params) {
    counter.Add(p, snapshot.params_bytes, &snapshot.optim_host_bytes);
  }
  for (const torch::Tensor& p : params) {
    counter.Add(p.grad(), snapshot.grads_bytes, &snapshot.optim_host_bytes);
  }
  for (const torch::Tensor& t : optimizer_state) {
    counter.Add(t, snapshot.optim_device_bytes, &snapshot.optim_host_bytes);
  }
  for (const torch::Tensor& t : comm_buffers) counter.Add(t, snapshot.comm_bytes, nullptr);
  for (const torch::Tensor& t : gathered_params) counter.Add(t, snapshot.gathered_bytes, nullptr);
  snapshot.allocated_bytes = allocated;
  snapshot.peak_bytes = std::max(memory.peak_bytes(), allocated);
  snapshot.reserved_bytes = std::max(memory.reserved_bytes(), allocated);
  const uint64_t known = snapshot.params_bytes + snapshot.grads_bytes +
                         snapshot.optim_device_bytes + snapshot.comm_bytes +
                         snapshot.gathered_bytes;
  // The categories are a subset of the allocator's live bytes, so this never underflows unless a
  // tensor was allocated outside the allocator (which the tests rule out).
  snapshot.other_bytes = allocated > known ? allocated - known : 0;
  return snapshot;
}

}  // namespace

StatusOr<DeviceMemory> DeviceMemory::For(torch::Device device) {
  if (device.is_cpu()) {
    CountingCpuAllocator::Install();
    return DeviceMemory(device);
  }
#ifdef LLMCTL_HAVE_CUDA
  if (device.is_cuda()) {
    if (!torch::cuda::is_available()) {
      return FailedPreconditionError("device: cuda was asked for, but no CUDA device is visible");
    }
    // A rank's device is its LOCAL_RANK, which nothing before here holds to the devices this
    // process sees (CUDA_VISIBLE_DEVICES); past them, CUDA's own error would come at the first use.
    const int visible = torch::cuda::device_count();
    if (device.index() >= visible) {
      std::string message = "device: " + device.str() + " was asked for, but this process sees ";
      message += CountOf(visible, "CUDA device", "CUDA devices") + " (CUDA_VISIBLE_DEVICES says which)";
      return FailedPreconditionError(message);
    }
    // CUDA starts lazily, at the first kernel or allocation; until it has, the caching allocator
    // has no devices and its statistics and memory fraction throw ("Invalid device argument",
    // "Allocator not initialized") — torch.cuda's Python functions start it first for the same
    // reason.
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    return DeviceMemory(device);
  }
#endif
  return UnimplementedError("memory accounting supports cpu and cuda devices, not " + device.str());
}

uint64_t DeviceMemory::allocated_bytes() const {
#ifdef LLMCTL_HAVE_CUDA
  if (device_.is_cuda()) return CudaStats(device_).allocated_bytes[kAggregatePool].current;
#endif
  return CountingCpuAllocator::Install().device().allocated_bytes;
}

uint64_t DeviceMemory::peak_bytes() const {
#ifdef LLMCTL_HAVE_CUDA
  if (device_.is_cuda()) return CudaStats(device_).allocated_bytes[kAggregatePool].peak;
#endif
  return CountingCpuAllocator::Install().device().peak_bytes;
}

uint64_t DeviceMemory::reserved_bytes() const {
#ifdef LLMCTL_HAVE_CUDA
  if (device_.is_cuda()) return CudaStats(device_).reserved_bytes[kAggregatePool].current;
#endif
  return CountingCpuAllocator::Install().device().allocated_bytes;
}

void DeviceMemory::ResetPeak() {
#ifdef LLMCTL_HAVE_CUDA
  if (device_.is_cuda()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(CudaIndex(device_));
    return;
  }
#endif
  CountingCpuAllocator::Install().ResetPeaks();
}

Status DeviceMemory::SetBudget(std::optional<uint64_t> budget) {
#ifdef LLMCTL_HAVE_CUDA
  if (device_.is_cuda()) {
    if (!budget) return Status::Ok();
    const c10::DeviceIndex index = CudaIndex(device_);
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    c10::cuda::CUDAGuard guard(index);
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess || total_bytes == 0) {
      return InternalError("could not read the CUDA device's memory size");
    }
    const double fraction = static_cast<double>(*budget) / static_cast<double>(total_bytes);
    if (fraction > 1.0) {
      return InvalidArgumentError("device_memory " + FormatBytes(*budget) +
                                  " is more than the GPU's " + FormatBytes(total_bytes));
    }
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index);
    budget_ = budget;
    return Status::Ok();
  }
#endif
  CountingCpuAllocator::Install().SetDeviceBudget(budget);
  budget_ = budget;
  return Status::Ok();
}

std::optional<uint64_t> DeviceMemory::limit_bytes() const {
  if (budget_) return budget_;
#ifdef LLMCTL_HAVE_CUDA
  if (device_.is_cuda()) {
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    c10::cuda::CUDAGuard guard(CudaIndex(device_));
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return std::nullopt;
    return total_bytes;
  }
#endif
  return std::nullopt;
}

std::optional<BudgetFailure> DeviceMemory::last_budget_failure() const {
  if (!device_.is_cpu()) return std::nullopt;
  return CountingCpuAllocator::Install().last_budget_failure();
}

bool DeviceMemory::OnDevice(const torch::Tensor& tensor) const {
  if (!device_.is_cpu())
    return tensor.device() == device_ || tensor.device().type() == device_.type();
  if (!tensor.device().is_cpu()) return false;
  return CountingCpuAllocator::PoolOf(tensor.storage()).value_or(MemoryPool::kDevice) ==
         MemoryPool::kDevice;
}

MemorySnapshot TakeSnapshot(const DeviceMemory& memory, const std::vector<torch::Tensor>& params,
                            const std::vector<torch::Tensor>& optimizer_state,
                            const std::vector<torch::Tensor>& comm_buffers,
                            const std::vector<torch::Tensor>& gathered_params) {
  return Categorize(memory, params, optimizer_state, comm_buffers, gathered_params,
                    memory.allocated_bytes());
}

MemorySnapshot SnapshotAtFailure(const DeviceMemory& memory,
                                 const std::vector<torch::Tensor>& params,
                                 const std::vector<torch::Tensor>& optimizer_state,
                                 const std::vector<torch::Tensor>& comm_buffers,
                                 const std::vector<torch::Tensor>& gathered_params) {
  uint64_t allocated = memory.allocated_bytes();
  if (auto failure = memory.last_budget_failure()) allocated = failure->allocated_bytes;
  return Categorize(memory, params, optimizer_state, comm_buffers, gathered_params, allocated);
}

std::vector<StorageCategory> StorageCategories(const DeviceMemory& memory,
                                               const std::vector<torch::Tensor>& params,
                                               const std::vector<torch::Tensor>& optimizer_state,
                                               const std::vector<torch::Tensor>& comm_buffers,
                                               const std::vector<torch::Tensor>& gathered_params) {
  std::vector<StorageCategory> categories;
  std::unordered_set<const c10::StorageImpl*> seen;
  // In Categorize's order, so a storage counted in two roles gets the category it is counted in.
  auto add = [&](const torch::Tensor& tensor, const char* category) {
    if (!tensor.defined() || !tensor.has_storage() || !memory.OnDevice(tensor)) return;
    if (!seen.insert(tensor.storage().unsafeGetStorageImpl()).second) return;
    categories.push_back(
        {reinterpret_cast<uintptr_t>(tensor.storage().data_ptr().get()), category});
  };
  for (const torch::Tensor& p : params) add(p, "params");
  for (const torch::Tensor& p : params) add(p.grad(), "grads");
  for (const torch::Tensor& t : optimizer_state) add(t, "optimizer state");
  for (const torch::Tensor& t : comm_buffers) add(t, "comm buckets");
  for (const torch::Tensor& t : gathered_params) add(t, "gathered params");
  return categories;
}

uint64_t UniqueStorageBytes(const std::vector<torch::Tensor>& tensors) {
  std::unordered_set<const c10::StorageImpl*> seen;
  uint64_t total = 0;
  for (const torch::Tensor& t : tensors) {
    if (!t.defined() || !t.has_storage()) continue;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) total += t.storage().nbytes();
  }
  return total;
}

std::string FormatSnapshot(const MemorySnapshot& s) {
  std::string line =
      "Params: " + FormatBytes(s.params_bytes) + " | Grads: " + FormatBytes(s.grads_bytes);
  if (s.optim_host_bytes > 0) {
    line += " | Optim GPU: " + FormatBytes(s.optim_device_bytes) +
            " | Optim CPU: " + FormatBytes(s.optim_host_bytes);
  } else {
    line += " | Optim: " + FormatBytes(s.optim_device_bytes);
  }
  if (s.comm_bytes > 0) line += " | Comm: " + FormatBytes(s.comm_bytes);
  if (s.gathered_bytes > 0) line += " | Gathered: " + FormatBytes(s.gathered_bytes);
  line += " | Acts: " + FormatBytes(s.other_bytes) +
          " | Allocated: " + FormatBytes(s.allocated_bytes) + " (peak " +
          FormatBytes(s.peak_bytes) + ") | Reserved: " + FormatBytes(s.reserved_bytes);
  return line;
}

}  // namespace llmctl::trainer
