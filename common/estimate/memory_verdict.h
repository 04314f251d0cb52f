// Whether a predicted peak fits a device: the one rule behind `llmctl estimate`'s verdict and
// --fit, `llmctl plan`'s search, and the verdict words the controller stores with a submitted
// trial's prediction (controller/submission.cc checks them). No LibTorch.
//
// The memory estimate predicts allocated bytes (step_memory.h). What else the device must hold
// depends on the allocator that counts them:
// - a CPU trial's device_memory: llm-train's counting allocator refuses an allocation past the
//   budget, counting exactly the allocated bytes, so the budget is the limit;
// - a CUDA budget (device_memory on a GPU): llm-train caps the caching allocator's reserved bytes
//   at it (setMemoryFraction), and the allocator holds more than it allocates (rounding, split
//   blocks: the 11-26 H200 run reserved 0.1% to 1.5% above its allocated peak in the rows that hit
//   their budget, and 1.2% to 13% in those that had room);
// - a whole GPU: that, and the CUDA context and the libraries' workspaces outside any allocator
//   (700 to 760 MiB in the H200 run).
#ifndef LLMCTL_COMMON_ESTIMATE_MEMORY_VERDICT_H_
#define LLMCTL_COMMON_ESTIMATE_MEMORY_VERDICT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace llmctl::estimate {

// What a whole GPU keeps outside the caching allocator: the CUDA context and the libraries'
// workspaces (700 to 760 MiB on the H200, rounded up).
inline constexpr uint64_t kCudaContextBytes = uint64_t{1} << 30;
// The share of a CUDA limit kept free for what the caching allocator holds beyond its allocated
// bytes: a peak in it may run out of memory or may not.
inline constexpr double kCudaAllocatorSlack = 0.05;

// The CUDA rule in words, for the notes of `llmctl estimate` and `llmctl plan`: "a GPU's limit
// is its memory less 1.00 GiB for the CUDA context, or its budget; ...".
std::string CudaLimitRule();

// The allocated bytes a trial may reach on a device.
struct MemoryLimit {
  uint64_t bytes = 0;       // past it, the run is out of memory
  uint64_t safe_bytes = 0;  // up to it, it fits with the allocator's slack left (<= bytes)
};

// A CPU trial's device_memory: the counting allocator's budget, exact.
MemoryLimit CpuBudgetLimit(uint64_t budget);
// A CUDA budget: the caching allocator's reserve capped at `budget`, its slack kept free.
MemoryLimit CudaBudgetLimit(uint64_t budget);
// A whole GPU of `card_bytes`: less the CUDA context, its allocator's slack kept free.
MemoryLimit CudaCardLimit(uint64_t card_bytes);
// Both limits at once: a budget on a card.
MemoryLimit Tighter(const MemoryLimit& a, const MemoryLimit& b);

enum class MemoryVerdict {
  kFits,   // at most the safe bytes
  kTight,  // past the safe bytes, within the limit: in the allocator's slack
  kOom,    // past the limit
};

MemoryVerdict VerdictOf(uint64_t peak_bytes, const MemoryLimit& limit);

// "fits", "tight", "oom": the words a prediction is stored and reported with.
std::string_view VerdictName(MemoryVerdict verdict);
// The verdict a word names; none for any other text.
std::optional<MemoryVerdict> ParseVerdict(std::string_view name);

}  // namespace llmctl::estimate

#endif  // LLMCTL_COMMON_ESTIMATE_MEMORY_VERDICT_H_
