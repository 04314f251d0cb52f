// A counting CPU allocator: exact allocated/peak bytes for CPU runs, an optional budget that fails like a
// GPU out-of-memory, and a host pool for state deliberately kept off the "device" (optimizer offload).
//
// It wraps LibTorch's default CPU allocator (installed with c10::SetCPUAllocator), so every CPU tensor
// allocation goes through it. Libraries' private scratch memory (oneDNN, BLAS workspaces) is malloc'ed
// outside any LibTorch allocator and is not seen here, exactly as on CUDA, where cuBLAS workspaces are
// outside the caching allocator's statistics.
//
// The allocator is process-wide: tests that assert byte-exact figures run in their own process.
#ifndef LLMCTL_TRAINER_MEMORY_COUNTING_ALLOCATOR_H_
#define LLMCTL_TRAINER_MEMORY_COUNTING_ALLOCATOR_H_

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstdint>
#include <optional>

namespace llmctl::trainer {

// Where an allocation is accounted. On CPU runs the "device" pool stands for the GPU's memory and the
// host pool for the machine's RAM outside it.
enum class MemoryPool { kDevice, kHost };

struct PoolCounters {
  uint64_t allocated_bytes = 0;
  uint64_t peak_bytes = 0;
};

// Recorded when a device-pool allocation is refused by the budget.
struct BudgetFailure {
  uint64_t requested_bytes = 0;
  uint64_t allocated_bytes = 0;  // device-pool bytes in use when the request came
};

class CountingCpuAllocator final : public c10::Allocator {
 public:
  // Installs the process-wide instance as LibTorch's CPU allocator on first call; later calls return it.
  static CountingCpuAllocator& Install();
  // The installed instance, or nullptr when Install() was never called.
  static CountingCpuAllocator* Installed();

  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  PoolCounters device() const;
  PoolCounters host() const;
  // Starts a new high-water mark for both pools at the current allocation.
  void ResetPeaks();

  // Device-pool allocations that would take allocated bytes over `budget` throw c10::OutOfMemoryError.
  void SetDeviceBudget(std::optional<uint64_t> budget);
  std::optional<uint64_t> device_budget() const;
  std::optional<BudgetFailure> last_budget_failure() const;

  // The pool a storage was allocated from, or nullopt when this allocator did not allocate it (a tensor
  // created before installation, or memory LibTorch did not allocate, such as from_blob over a mapping).
  static std::optional<MemoryPool> PoolOf(const c10::Storage& storage);

 private:
  CountingCpuAllocator();
  struct Counters {
    std::atomic<uint64_t> allocated{0};
    std::atomic<uint64_t> peak{0};
  };

 public:
  struct Header;
  static constexpr size_t kHeaderBytes = 64;

 private:
  static void Delete(void* record);
  Counters& CountersFor(MemoryPool pool) { return pool == MemoryPool::kDevice ? device_ : host_; }

  c10::Allocator* const inner_;  // LibTorch's default CPU allocator; not owned
  Counters device_;
  Counters host_;
  std::atomic<uint64_t> budget_{0};  // 0 = no budget
  std::atomic<uint64_t> failed_request_{0};
  std::atomic<uint64_t> failed_at_allocated_{0};
  std::atomic<bool> has_failure_{false};
};

// While alive, CPU allocations made on this thread are accounted to the host pool (outside the budget).
class ScopedHostAllocations {
 public:
  ScopedHostAllocations();
  ~ScopedHostAllocations();
  ScopedHostAllocations(const ScopedHostAllocations&) = delete;
  ScopedHostAllocations& operator=(const ScopedHostAllocations&) = delete;

 private:
  bool previous_;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MEMORY_COUNTING_ALLOCATOR_H_
