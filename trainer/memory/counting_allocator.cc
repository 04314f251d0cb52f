#include "trainer/memory/counting_allocator.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "common/byte_size.h"
#include "trainer/memory/host_heap.h"

namespace llmctl::trainer {
namespace {

thread_local bool t_host_allocations = false;

// Above LibTorch's own registration, so GetCPUAllocator() returns the counting allocator.
constexpr uint8_t kAllocatorPriority = 100;

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void RaiseToAtLeast(std::atomic<uint64_t>& peak, uint64_t value) {
  uint64_t seen = peak.load(std::memory_order_relaxed);
  while (seen < value && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

// Every allocation carries a header in front of the caller's bytes with what to give back on free.
// Keeping it in front (rather than in a DataPtr context) makes the context equal the data pointer,
// which LibTorch's raw_allocate/raw_deallocate (used by oneDNN's bf16 kernels, among others)
// require.
struct CountingCpuAllocator::Header {
  uint64_t bytes;
  MemoryPool pool;
  CountingCpuAllocator* owner;
  c10::DeleterFnPtr inner_deleter;
  void* inner_context;
};
// 64 keeps the caller's bytes at the inner allocator's 64-byte alignment.
static_assert(sizeof(CountingCpuAllocator::Header) <= CountingCpuAllocator::kHeaderBytes);

namespace {
CountingCpuAllocator::Header* HeaderOf(void* data) {
  return reinterpret_cast<CountingCpuAllocator::Header*>(static_cast<char*>(data) -
                                                         CountingCpuAllocator::kHeaderBytes);
}
}  // namespace

CountingCpuAllocator::CountingCpuAllocator() : inner_(c10::GetDefaultCPUAllocator()) {}

CountingCpuAllocator& CountingCpuAllocator::Install() {
  // Never destroyed: tensors may outlive static destruction order.
  static CountingCpuAllocator* instance = [] {
    // The step's large tensors stay in the heap between steps (host_heap.h).
    KeepFreedHostMemory();
    auto* allocator = new CountingCpuAllocator();
    c10::SetCPUAllocator(allocator, kAllocatorPriority);
    return allocator;
  }();
  return *instance;
}

CountingCpuAllocator* CountingCpuAllocator::Installed() {
  c10::Allocator* current = c10::GetCPUAllocator();
  return dynamic_cast<CountingCpuAllocator*>(current);
}

c10::DataPtr CountingCpuAllocator::allocate(size_t n) {
  const MemoryPool pool = t_host_allocations ? MemoryPool::kHost : MemoryPool::kDevice;
  Counters& counters = CountersFor(pool);
  const uint64_t bytes = n;
  const uint64_t after = counters.allocated.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  const uint64_t budget = budget_.load(std::memory_order_relaxed);
  if (pool == MemoryPool::kDevice && budget != 0 && after > budget) {
    counters.allocated.fetch_sub(bytes, std::memory_order_relaxed);
    failed_request_.store(bytes);
    failed_at_allocated_.store(after - bytes);
    has_failure_.store(true);
    OnBudgetRefusal(bytes, budget - (after - bytes));
    // The same exception type CUDA's caching allocator throws, so one code path handles both.
    C10_THROW_ERROR(OutOfMemoryError, "device_memory budget exceeded: tried to allocate " +
                                          FormatBytes(bytes) + " with " +
                                          FormatBytes(after - bytes) + " of " +
                                          FormatBytes(budget) + " in use");
  }
  RaiseToAtLeast(counters.peak, after);
  c10::DataPtr inner;
  try {
    inner = inner_->allocate(n + kHeaderBytes);
  } catch (...) {
    counters.allocated.fetch_sub(bytes, std::memory_order_relaxed);
    throw;
  }
  char* base = static_cast<char*>(inner.get());
  const c10::DeleterFnPtr inner_deleter = inner.get_deleter();
  void* inner_context = inner.release_context();
  void* data = base + kHeaderBytes;
  new (base) Header{bytes, pool, this, inner_deleter, inner_context};
  if (pool == MemoryPool::kDevice) OnDeviceAllocation(reinterpret_cast<uintptr_t>(data), bytes);
  return c10::DataPtr(data, data, &CountingCpuAllocator::Delete, c10::Device(c10::kCPU));
}

void CountingCpuAllocator::Delete(void* data) {
  Header* header = HeaderOf(data);
  const Header copy = *header;
  copy.owner->CountersFor(copy.pool).allocated.fetch_sub(copy.bytes, std::memory_order_relaxed);
  if (copy.pool == MemoryPool::kDevice) {
    copy.owner->OnDeviceFree(reinterpret_cast<uintptr_t>(data), copy.bytes);
  }
  copy.inner_deleter(copy.inner_context);
}

c10::DeleterFnPtr CountingCpuAllocator::raw_deleter() const {
  return &CountingCpuAllocator::Delete;
}

void CountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

PoolCounters CountingCpuAllocator::device() const {
  return {device_.allocated.load(), device_.peak.load()};
}

PoolCounters CountingCpuAllocator::host() const {
  return {host_.allocated.load(), host_.peak.load()};
}

void CountingCpuAllocator::ResetPeaks() {
  device_.peak.store(device_.allocated.load());
  host_.peak.store(host_.allocated.load());
}

void CountingCpuAllocator::SetDeviceBudget(std::optional<uint64_t> budget) {
  budget_.store(budget.value_or(0));
  has_failure_.store(false);
}

std::optional<uint64_t> CountingCpuAllocator::device_budget() const {
  const uint64_t budget = budget_.load();
  if (budget == 0) return std::nullopt;
  return budget;
}

std::optional<BudgetFailure> CountingCpuAllocator::last_budget_failure() const {
  if (!has_failure_.load()) return std::nullopt;
  return BudgetFailure{failed_request_.load(), failed_at_allocated_.load()};
}

void CountingCpuAllocator::TrackLiveAllocations() { tracking_.store(true); }

void CountingCpuAllocator::StartHistory(size_t max_events) {
  std::lock_guard<std::mutex> lock(history_mutex_);
  events_.clear();
  dropped_events_ = 0;
  max_events_ = max_events;
  recording_.store(true);
}

void CountingCpuAllocator::SetHistoryLabel(const std::string& label, bool marker) {
  if (!tracking_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(history_mutex_);
  auto [it, inserted] = label_index_.emplace(label, static_cast<uint32_t>(labels_.size()));
  if (inserted) labels_.push_back(label);
  label_ = it->second;
  if (marker && recording_.load(std::memory_order_relaxed)) {
    RecordLocked(AllocatorEvent::Action::kMarker, 0, device_.allocated.load());
  }
}

AllocatorHistory CountingCpuAllocator::StopHistory() {
  std::lock_guard<std::mutex> lock(history_mutex_);
  recording_.store(false);
  AllocatorHistory history;
  history.events.assign(events_.begin(), events_.end());
  events_.clear();
  history.dropped_events = dropped_events_;
  history.live.reserve(live_.size());
  for (const auto& [address, allocation] : live_) history.live.push_back(allocation);
  history.labels = labels_;
  return history;
}

void CountingCpuAllocator::RecordLocked(AllocatorEvent::Action action, uint64_t address,
                                        uint64_t bytes) {
  if (max_events_ == 0) return;
  if (events_.size() == max_events_) {
    events_.pop_front();
    ++dropped_events_;
  }
  events_.push_back(AllocatorEvent{action, address, bytes, NowMicros(), label_});
}

void CountingCpuAllocator::OnDeviceAllocation(uint64_t address, uint64_t bytes) {
  if (!tracking_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(history_mutex_);
  live_[address] = LiveAllocation{address, bytes, label_};
  if (recording_.load(std::memory_order_relaxed)) {
    RecordLocked(AllocatorEvent::Action::kAlloc, address, bytes);
  }
}

void CountingCpuAllocator::OnDeviceFree(uint64_t address, uint64_t bytes) {
  if (!tracking_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(history_mutex_);
  live_.erase(address);
  if (recording_.load(std::memory_order_relaxed)) {
    RecordLocked(AllocatorEvent::Action::kFree, address, bytes);
  }
}

void CountingCpuAllocator::OnBudgetRefusal(uint64_t bytes, uint64_t free_bytes) {
  if (!recording_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(history_mutex_);
  RecordLocked(AllocatorEvent::Action::kOom, free_bytes, bytes);
}

std::optional<MemoryPool> CountingCpuAllocator::PoolOf(const c10::Storage& storage) {
  const c10::DataPtr& data_ptr = storage.data_ptr();
  if (data_ptr.get_deleter() != &CountingCpuAllocator::Delete) return std::nullopt;
  return HeaderOf(data_ptr.get_context())->pool;
}

ScopedHostAllocations::ScopedHostAllocations() : previous_(t_host_allocations) {
  t_host_allocations = true;
}

ScopedHostAllocations::~ScopedHostAllocations() { t_host_allocations = previous_; }

}  // namespace llmctl::trainer
