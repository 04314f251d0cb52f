#include "common/estimate/memory_verdict.h"

#include <algorithm>

#include "common/byte_size.h"
#include "common/printf.h"

namespace llmctl::estimate {
namespace {

// `bytes` less the caching allocator's slack.
uint64_t LessSlack(uint64_t bytes) {
  return bytes - static_cast<uint64_t>(kCudaAllocatorSlack * static_cast<double>(bytes));
}

}  // namespace

std::string CudaLimitRule() {
  return "a GPU's limit is its memory less " + FormatBytes(kCudaContextBytes) +
         " for the CUDA context, or its budget; the last " +
         Printf("%.0f%%", 100 * kCudaAllocatorSlack) +
         " of either are kept for what the caching allocator holds beyond its allocated bytes, "
         "and a peak there is tight: it may run out";
}

MemoryLimit CpuBudgetLimit(uint64_t budget) { return {.bytes = budget, .safe_bytes = budget}; }

MemoryLimit CudaBudgetLimit(uint64_t budget) {
  return {.bytes = budget, .safe_bytes = LessSlack(budget)};
}

MemoryLimit CudaCardLimit(uint64_t card_bytes) {
  const uint64_t allocatable = card_bytes > kCudaContextBytes ? card_bytes - kCudaContextBytes : 0;
  // The slack is the card's share, as a budget near the whole card would keep.
  const uint64_t slack = card_bytes - LessSlack(card_bytes);
  return {.bytes = allocatable, .safe_bytes = allocatable > slack ? allocatable - slack : 0};
}

MemoryLimit Tighter(const MemoryLimit& a, const MemoryLimit& b) {
  return {.bytes = std::min(a.bytes, b.bytes), .safe_bytes = std::min(a.safe_bytes, b.safe_bytes)};
}

MemoryVerdict VerdictOf(uint64_t peak_bytes, const MemoryLimit& limit) {
  if (peak_bytes > limit.bytes) return MemoryVerdict::kOom;
  return peak_bytes > limit.safe_bytes ? MemoryVerdict::kTight : MemoryVerdict::kFits;
}

std::string_view VerdictName(MemoryVerdict verdict) {
  switch (verdict) {
    case MemoryVerdict::kFits:
      return "fits";
    case MemoryVerdict::kTight:
      return "tight";
    case MemoryVerdict::kOom:
      return "oom";
  }
  return "oom";
}

std::optional<MemoryVerdict> ParseVerdict(std::string_view name) {
  for (MemoryVerdict verdict : {MemoryVerdict::kFits, MemoryVerdict::kTight, MemoryVerdict::kOom}) {
    if (name == VerdictName(verdict)) return verdict;
  }
  return std::nullopt;
}

}  // namespace llmctl::estimate
