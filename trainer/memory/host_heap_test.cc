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
  // glibc's defaults first, whatever the environment set (ctest's GLIBC_TUNABLES, in
  // cmake/LlmctlTargets.cmake, already keeps every block in the heap): a block over 128 KiB mapped
  // on its own, and the heap's free top over 128 KiB given back.
  ASSERT_EQ(mallopt(M_MMAP_MAX, 65536), 1);
  ASSERT_EQ(mallopt(M_MMAP_THRESHOLD, 128 * 1024), 1);
  ASSERT_EQ(mallopt(M_TRIM_THRESHOLD, 128 * 1024), 1);
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
