// A counting CPU allocator: exact allocated/peak bytes for CPU runs, an optional budget that fails
// like a GPU out-of-memory, and a host pool for state deliberately kept off the "device" (optimizer
// offload).
//
// It wraps LibTorch's default CPU allocator (installed with c10::SetCPUAllocator), so every CPU
// tensor allocation goes through it, and so do the buffers oneDNN's 16-bit GEMMs pack their
// operands into (taken through LibTorch's allocator). Libraries' private scratch memory (BLAS
// workspaces) is malloc'ed outside any LibTorch allocator and is not seen here.
//
// The allocator is process-wide: tests that assert byte-exact figures run in their own process.
#ifndef LLMCTL_TRAINER_MEMORY_COUNTING_ALLOCATOR_H_
#define LLMCTL_TRAINER_MEMORY_COUNTING_ALLOCATOR_H_

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace llmctl::trainer {

// Where an allocation is accounted. On CPU runs the "device" pool stands for the GPU's memory and
// the host pool for the machine's RAM outside it.
enum class MemoryPool { kDevice, kHost };

struct PoolCounters {
  uint64_t allocated_bytes = 0;
  uint64_t peak_bytes = 0;
};

// One device-pool action of the allocator's history, with the label in force when it happened.
struct AllocatorEvent {
  enum class Action : uint8_t {
    kAlloc,   // `bytes` at `address` allocated
    kFree,    // `bytes` at `address` freed
    kOom,     // `bytes` refused by the budget; `address` holds the budget's free bytes then
    kMarker,  // a point the caller named (a phase boundary); `bytes` is the device pool's allocated
  };
  Action action;
  uint64_t address;
  uint64_t bytes;
  int64_t time_us;  // microseconds since the Unix epoch
  uint32_t label;   // index into AllocatorHistory::labels
};

// A live device-pool allocation.
struct LiveAllocation {
  uint64_t address;
  uint64_t bytes;
  uint32_t label;  // the label in force when it was allocated
};

// What the allocator recorded between StartHistory and StopHistory.
struct AllocatorHistory {
  std::vector<AllocatorEvent> events;  // in order; the newest `max_events` when some were dropped
  uint64_t dropped_events = 0;         // older events dropped to stay within max_events
  // Every device-pool allocation live at StopHistory that was made while tracking, by address.
  std::vector<LiveAllocation> live;
  std::vector<std::string> labels;  // labels[0] is "" (no label set)
};

// Recorded when a device-pool allocation is refused by the budget.
struct BudgetFailure {
  uint64_t requested_bytes = 0;
  uint64_t allocated_bytes = 0;  // device-pool bytes in use when the request came
};

class CountingCpuAllocator final : public c10::Allocator {
 public:
  // Installs the process-wide instance as LibTorch's CPU allocator on first call; later calls
  // return it.
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

  // Device-pool allocations that would take allocated bytes over `budget` throw
  // c10::OutOfMemoryError.
  void SetDeviceBudget(std::optional<uint64_t> budget);
  std::optional<uint64_t> device_budget() const;
  std::optional<BudgetFailure> last_budget_failure() const;

  // History, for the memory viewers (trainer/memory/memory_history.h). While tracking, the
  // allocator knows every live device-pool allocation made since; while recording, it also keeps
  // each allocation, free and budget refusal as an event (at most `max_events`, the newest),
  // labelled with the label last set. Neither allocates through LibTorch, so the counters do not
  // see them.
  void TrackLiveAllocations();
  void StartHistory(size_t max_events);
  // Labels the actions that follow (the same text, the same index); with `marker`, also records a
  // kMarker event under `label` while recording.
  void SetHistoryLabel(const std::string& label, bool marker);
  // Ends recording (tracking goes on) and returns what was recorded.
  AllocatorHistory StopHistory();

  // The pool a storage was allocated from, or nullopt when this allocator did not allocate it (a
  // tensor created before installation, or memory LibTorch did not allocate, such as from_blob over
  // a mapping).
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
  void RecordLocked(AllocatorEvent::Action action, uint64_t address, uint64_t bytes);
  void OnDeviceAllocation(uint64_t address, uint64_t bytes);
  void OnDeviceFree(uint64_t address, uint64_t bytes);
  void OnBudgetRefusal(uint64_t bytes, uint64_t free_bytes);

  c10::Allocator* const inner_;  // LibTorch's default CPU allocator; not owned
  Counters device_;
  Counters host_;
  std::atomic<uint64_t> budget_{0};  // 0 = no budget
  std::atomic<uint64_t> failed_request_{0};
  std::atomic<uint64_t> failed_at_allocated_{0};
  std::atomic<bool> has_failure_{false};

  // History; `history_mutex_` guards everything below it. The flags are read without the lock
  // first, so an allocation pays nothing while neither is on.
  std::atomic<bool> tracking_{false};
  std::atomic<bool> recording_{false};
  std::mutex history_mutex_;
  std::unordered_map<uint64_t, LiveAllocation> live_;
  std::deque<AllocatorEvent> events_;
  size_t max_events_ = 0;
  uint64_t dropped_events_ = 0;
  std::vector<std::string> labels_{""};
  std::unordered_map<std::string, uint32_t> label_index_{{"", 0}};
  uint32_t label_ = 0;
};

// While alive, CPU allocations made on this thread are accounted to the host pool (outside the
// budget).
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
