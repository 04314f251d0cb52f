#include "trainer/memory/host_heap.h"

#include <climits>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace llmctl::trainer {

void KeepFreedHostMemory() {
#if defined(__GLIBC__)
  // mallopt takes an int: INT_MAX bytes, 2 GiB, is the most either threshold can be.
  mallopt(M_MMAP_THRESHOLD, INT_MAX);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

}  // namespace llmctl::trainer
