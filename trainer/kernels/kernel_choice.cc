#include "trainer/kernels/kernel_choice.h"

#include <atomic>
#include <mutex>
#include <utility>

namespace llmctl::kernels {
namespace {

struct Record {
  std::array<std::atomic<Implementation>, kFusedOpCount> last{};
  std::array<std::atomic<int64_t>, kFusedOpCount> fallbacks{};
  std::mutex reasons_mutex;
  std::array<std::string, kFusedOpCount> reasons;  // guarded by reasons_mutex
};

Record& TheRecord() {
  static Record* record = new Record();  // never destroyed: ops may run while the process exits
  return *record;
}

int Index(FusedOp op) { return static_cast<int>(op); }

}  // namespace

std::string_view FusedOpName(FusedOp op) {
  switch (op) {
    case FusedOp::kRmsNorm:
      return "rms_norm";
    case FusedOp::kSwiGlu:
      return "swiglu";
    case FusedOp::kSwiGluLinear:
      return "swiglu_linear";
    case FusedOp::kGeGlu:
      return "geglu";
    case FusedOp::kRope:
      return "rope";
    case FusedOp::kCrossEntropy:
      return "cross_entropy";
  }
  return "unknown";
}

std::string_view ImplementationName(Implementation implementation) {
  switch (implementation) {
    case Implementation::kNone:
      return "none";
    case Implementation::kCudaKernel:
      return "cuda kernel";
    case Implementation::kCpuLoop:
      return "cpu loop";
    case Implementation::kAtenFallback:
      return "aten fallback";
  }
  return "unknown";
}

void RecordKernel(FusedOp op, Implementation implementation) {
  TheRecord().last[Index(op)].store(implementation, std::memory_order_relaxed);
}

void RecordFallback(FusedOp op, std::string reason) {
  Record& record = TheRecord();
  {
    std::lock_guard lock(record.reasons_mutex);
    record.reasons[Index(op)] = std::move(reason);
  }
  record.last[Index(op)].store(Implementation::kAtenFallback, std::memory_order_relaxed);
  record.fallbacks[Index(op)].fetch_add(1, std::memory_order_release);
}

Implementation LastImplementation(FusedOp op) {
  return TheRecord().last[Index(op)].load(std::memory_order_relaxed);
}

std::string LastFallbackReason(FusedOp op) {
  Record& record = TheRecord();
  std::lock_guard lock(record.reasons_mutex);
  return record.reasons[Index(op)];
}

FallbackWatch::FallbackWatch() {
  for (int i = 0; i < kFusedOpCount; ++i) {
    fallbacks_seen_[i] = TheRecord().fallbacks[i].load(std::memory_order_acquire);
  }
}

std::vector<Fallback> FallbackWatch::TakeNew() {
  std::vector<Fallback> fresh;
  for (int i = 0; i < kFusedOpCount; ++i) {
    if (fallbacks_seen_[i] < 0) continue;
    if (TheRecord().fallbacks[i].load(std::memory_order_acquire) == fallbacks_seen_[i]) continue;
    const auto op = static_cast<FusedOp>(i);
    fresh.push_back({op, LastFallbackReason(op)});
    fallbacks_seen_[i] = -1;
  }
  return fresh;
}

}  // namespace llmctl::kernels
