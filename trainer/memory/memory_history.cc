#include "trainer/memory/memory_history.h"

#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <map>
#include <unordered_map>

#include "common/atomic_file.h"
#include "trainer/memory/counting_allocator.h"

#ifdef LLMCTL_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#include <torch/version.h>

// LibTorch 2.15 has supportsUserMetadata and annotateMemory; 2.11 (deploy/gpu-check's GPU machine)
// has neither, only setUserMetadata, which its native allocator implements (versions between
// unchecked). Without them the CUDA history keeps the phase labels but not the live blocks'
// categories.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 15)
#define LLMCTL_TORCH_ANNOTATES_MEMORY 1
#endif
#endif

namespace llmctl::trainer {
namespace {

using GenericDict = c10::Dict<c10::IValue, c10::IValue>;
using GenericList = c10::List<c10::IValue>;

// Segments of 1 MiB and more come from the caching allocator's large pool; the viewer shows the
// type, so CPU segments are named by the same rule.
constexpr uint64_t kLargeSegmentBytes = 1 << 20;

GenericDict NewDict() { return GenericDict(c10::AnyType::get(), c10::AnyType::get()); }
GenericList NewList() { return GenericList(c10::AnyType::get()); }

// A frame as PyTorch's snapshots hold them; the viewer prints "filename:line:name".
c10::IValue Frame(const std::string& filename, const std::string& name) {
  GenericDict frame = NewDict();
  frame.insert("filename", filename);
  frame.insert("line", int64_t{0});
  frame.insert("name", name);
  return frame;
}

// The frames of an allocation: its accounting category when it has one, then where it was made.
GenericList Frames(const std::string* category, const std::string& label) {
  GenericList frames = NewList();
  if (category != nullptr) frames.push_back(Frame("category", *category));
  if (!label.empty()) frames.push_back(Frame("llm-train", label));
  return frames;
}

GenericDict TraceEntry(const std::string& action, uint64_t address, uint64_t bytes, int64_t time_us,
                       GenericList frames) {
  GenericDict entry = NewDict();
  entry.insert("action", action);
  entry.insert("addr", static_cast<int64_t>(address));
  entry.insert("size", static_cast<int64_t>(bytes));
  entry.insert("stream", int64_t{0});
  entry.insert("time_us", time_us);
  entry.insert("frames", std::move(frames));
  return entry;
}

// A CPU allocation as a segment of its own holding one block.
GenericDict Segment(const LiveAllocation& allocation, GenericList frames) {
  const auto address = static_cast<int64_t>(allocation.address);
  const auto bytes = static_cast<int64_t>(allocation.bytes);
  GenericDict block = NewDict();
  block.insert("address", address);
  block.insert("size", bytes);
  block.insert("requested_size", bytes);
  block.insert("state", "active_allocated");
  block.insert("frames", std::move(frames));
  GenericList blocks = NewList();
  blocks.push_back(std::move(block));

  GenericDict segment = NewDict();
  segment.insert("device", int64_t{0});
  segment.insert("address", address);
  segment.insert("total_size", bytes);
  segment.insert("stream", int64_t{0});
  segment.insert("segment_type", allocation.bytes >= kLargeSegmentBytes ? "large" : "small");
  segment.insert("segment_pool_id", c10::ivalue::Tuple::create(int64_t{0}, int64_t{0}));
  segment.insert("allocated_size", bytes);
  segment.insert("active_size", bytes);
  segment.insert("requested_size", bytes);
  segment.insert("blocks", std::move(blocks));
  return segment;
}

// The category of the storage at each address, where the trainer named one.
class CategoryIndex {
 public:
  explicit CategoryIndex(const std::vector<StorageCategory>& categories) {
    for (const StorageCategory& storage : categories) {
      category_at_[storage.address] = &storage.category;
    }
  }
  const std::string* Of(uint64_t address) const {
    auto it = category_at_.find(address);
    return it == category_at_.end() ? nullptr : it->second;
  }

 private:
  std::unordered_map<uint64_t, const std::string*> category_at_;
};

// The history's events as the viewer's device trace. The allocation events whose memory is still
// live at the end get its category too: the last alloc at each live address.
GenericList DeviceTrace(const AllocatorHistory& history, const CategoryIndex& categories) {
  std::unordered_map<uint64_t, size_t> last_alloc;
  for (size_t i = 0; i < history.events.size(); ++i) {
    const AllocatorEvent& event = history.events[i];
    if (event.action == AllocatorEvent::Action::kAlloc) last_alloc[event.address] = i;
  }
  std::unordered_map<uint64_t, bool> live;
  for (const LiveAllocation& allocation : history.live) live[allocation.address] = true;

  GenericList trace = NewList();
  for (size_t i = 0; i < history.events.size(); ++i) {
    const AllocatorEvent& event = history.events[i];
    const std::string& label = history.labels.at(event.label);
    switch (event.action) {
      case AllocatorEvent::Action::kAlloc: {
        if (event.bytes == 0) break;  // holds no memory, and an empty segment confuses the viewer
        const bool still_live = live.count(event.address) > 0 && last_alloc[event.address] == i;
        const std::string* category = still_live ? categories.Of(event.address) : nullptr;
        for (const char* action : {"segment_alloc", "alloc"}) {
          trace.push_back(TraceEntry(action, event.address, event.bytes, event.time_us,
                                     Frames(category, label)));
        }
        break;
      }
      case AllocatorEvent::Action::kFree:
        if (event.bytes == 0) break;
        for (const char* action : {"free_requested", "free_completed", "segment_free"}) {
          trace.push_back(TraceEntry(action, event.address, event.bytes, event.time_us,
                                     Frames(nullptr, label)));
        }
        break;
      case AllocatorEvent::Action::kOom: {
        GenericDict entry =
            TraceEntry("oom", 0, event.bytes, event.time_us, Frames(nullptr, label));
        entry.insert("device_free", static_cast<int64_t>(event.address));
        trace.push_back(std::move(entry));
        break;
      }
      case AllocatorEvent::Action::kMarker:
        trace.push_back(
            TraceEntry("snapshot", 0, event.bytes, event.time_us, Frames(nullptr, label)));
        break;
    }
  }
  return trace;
}

// The memory still live at the end, one segment each, by address.
GenericList LiveSegments(const AllocatorHistory& history, const CategoryIndex& categories) {
  std::vector<LiveAllocation> by_address = history.live;
  std::sort(by_address.begin(), by_address.end(),
            [](const LiveAllocation& a, const LiveAllocation& b) { return a.address < b.address; });
  GenericList segments = NewList();
  for (const LiveAllocation& allocation : by_address) {
    if (allocation.bytes == 0) continue;
    segments.push_back(Segment(allocation, Frames(categories.Of(allocation.address),
                                                  history.labels.at(allocation.label))));
  }
  return segments;
}

// The snapshot dict of a CPU history: {"segments": [...], "device_traces": [[...]]}.
c10::IValue CpuSnapshot(const AllocatorHistory& history,
                        const std::vector<StorageCategory>& categories, uint64_t* entries) {
  const CategoryIndex index(categories);
  GenericList trace = DeviceTrace(history, index);
  *entries = trace.size();
  GenericList device_traces = NewList();
  device_traces.push_back(std::move(trace));
  GenericDict snapshot = NewDict();
  snapshot.insert("segments", LiveSegments(history, index));
  snapshot.insert("device_traces", std::move(device_traces));
  return snapshot;
}

// Pickled as PyTorch pickles its own snapshots: plain protocol-2 pickle without TorchScript's type
// tags, so Python's pickle.load reads it without torch.
std::string Pickle(const c10::IValue& value) {
  std::string bytes;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { bytes.append(data, size); },
                              nullptr, nullptr, nullptr, nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(value);
  pickler.stop();
  return bytes;
}

Status WriteBytes(const std::string& path, const std::string& bytes) {
  return WriteFileAtomically(path,
                             [&](int fd) { return WriteAll(fd, bytes.data(), bytes.size()); });
}

}  // namespace

StatusOr<MemoryHistory> MemoryHistory::For(torch::Device device) {
  if (device.is_cpu()) {
    CountingCpuAllocator::Install().TrackLiveAllocations();
    return MemoryHistory(device);
  }
#ifdef LLMCTL_HAVE_CUDA
  if (device.is_cuda()) return MemoryHistory(device);
#endif
  return UnimplementedError("memory history supports cpu and cuda devices, not " + device.str());
}

void MemoryHistory::Start(size_t max_events) {
  max_events_ = max_events;
#ifdef LLMCTL_HAVE_CUDA
  if (device_.is_cuda()) {
    // Stacks "python" gathers no C++ frames (unwinding every allocation would cost more than the
    // step) and, without a Python interpreter, no Python ones: the labels are the context.
    torch::cuda::_record_memory_history("all", "all", "python", max_events);
    return;
  }
#endif
  CountingCpuAllocator::Install().StartHistory(max_events);
}

void MemoryHistory::Label(const std::string& label, bool marker) {
#ifdef LLMCTL_HAVE_CUDA
  if (device_.is_cuda()) {
#ifdef LLMCTL_TORCH_ANNOTATES_MEMORY
    if (!c10::cuda::CUDACachingAllocator::supportsUserMetadata()) return;
#endif
    c10::cuda::CUDACachingAllocator::setUserMetadata(label);
    return;
  }
#endif
  CountingCpuAllocator::Install().SetHistoryLabel(label, marker);
}

StatusOr<MemoryHistorySummary> MemoryHistory::StopAndWrite(
    const std::string& path, const std::vector<StorageCategory>& categories) {
  MemoryHistorySummary summary;
#ifdef LLMCTL_HAVE_CUDA
  if (device_.is_cuda()) {
#ifdef LLMCTL_TORCH_ANNOTATES_MEMORY
    if (c10::cuda::CUDACachingAllocator::supportsUserMetadata()) {
      for (const StorageCategory& storage : categories) {
        c10::cuda::CUDACachingAllocator::annotateMemory(
            reinterpret_cast<const void*>(storage.address), storage.category);
      }
    }
#endif
    const std::string pickled = torch::cuda::_memory_snapshot_pickled();
    torch::cuda::_record_memory_history(std::nullopt);
    RETURN_IF_ERROR(WriteBytes(path, pickled));
    return summary;
  }
#endif
  const AllocatorHistory history = CountingCpuAllocator::Install().StopHistory();
  summary.dropped_events = history.dropped_events;
  const std::string pickled = Pickle(CpuSnapshot(history, categories, &summary.events));
  RETURN_IF_ERROR(WriteBytes(path, pickled));
  return summary;
}

}  // namespace llmctl::trainer
