// KeepFreedHostMemory keeps a freed block over glibc's default mmap threshold in the heap, where
// before it the block was unmapped on free (the step-by-step page faults host_heap.h describes).
// The heap's free bytes say which: no clock is read.
#include "trainer/memory/host_heap.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace llmctl::trainer {
namespace {

// 64 MiB: over the 32 MiB glibc's dynamic mmap threshold can reach by default.
constexpr size_t kBlockBytes = size_t{64} << 20;

// The heap's free bytes after a block of kBlockBytes was written and freed.
size_t FreeBytesAfterABlock() {
  void* block = std::malloc(kBlockBytes);
  EXPECT_NE(block, nullptr);
  std::memset(block, 1, kBlockBytes);
  std::free(block);
  return mallinfo2().fordblks;
}

TEST(HostHeapTest, AFreedLargeBlockStaysInTheHeapForTheNextStep) {
  EXPECT_LT(FreeBytesAfterABlock(), kBlockBytes) << "glibc's default: unmapped on free";
  KeepFreedHostMemory();
  EXPECT_GE(FreeBytesAfterABlock(), kBlockBytes) << "kept in the heap";
  // The next step's block of that size comes from it: the heap's free bytes fall while it lives.
  const size_t before = mallinfo2().fordblks;
  void* again = std::malloc(kBlockBytes);
  ASSERT_NE(again, nullptr);
  EXPECT_LE(mallinfo2().fordblks + kBlockBytes, before);
  std::free(again);
}

}  // namespace
}  // namespace llmctl::trainer
