// Memory history in the format of PyTorch's memory snapshots (torch.cuda.memory._snapshot(),
// pickled), which https://pytorch.org/memory_viz and torch.cuda._memory_viz open.
//
// CUDA: the caching allocator records its own history (torch::cuda::_record_memory_history) and
// writes it (_memory_snapshot_pickled); labels go in each event's user_metadata. CPU: the counting
// allocator records its device pool's allocations and frees, and this file writes them in the same
// format, each allocation its own segment (the counting allocator caches nothing, so reserved
// equals allocated), labelled through frames: where in the step it was allocated and, for the
// allocations live at the end, the accounting category (params, grads, optimizer state) they belong
// to.
#ifndef LLMCTL_TRAINER_MEMORY_MEMORY_HISTORY_H_
#define LLMCTL_TRAINER_MEMORY_MEMORY_HISTORY_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "trainer/memory/accounting.h"

namespace llmctl::trainer {

struct MemoryHistorySummary {
  uint64_t events = 0;          // trace entries written
  uint64_t dropped_events = 0;  // older entries dropped to stay within max_events
};

class MemoryHistory {
 public:
  // CPU: starts tracking live allocations now, so that the written snapshot's segments hold every
  // allocation live at its end; call before the model is built.
  static StatusOr<MemoryHistory> For(torch::Device device);

  // Records every allocation and free from now on: at most `max_events` trace entries (the newest).
  void Start(size_t max_events);
  // Labels the allocations that follow (CPU: a frame; CUDA: user_metadata). With `marker` (CPU
  // only), also records a "snapshot" entry named `label` whose size is the device's allocated bytes
  // then: the point in the trace where the trainer took a memory snapshot.
  void Label(const std::string& label, bool marker);
  // Stops recording and writes the pickled snapshot to `path`.
  StatusOr<MemoryHistorySummary> StopAndWrite(const std::string& path,
                                              const std::vector<StorageCategory>& categories);

 private:
  explicit MemoryHistory(torch::Device device) : device_(device) {}
  torch::Device device_;
  size_t max_events_ = 0;
};

}  // namespace llmctl::trainer

#endif  // LLMCTL_TRAINER_MEMORY_MEMORY_HISTORY_H_
