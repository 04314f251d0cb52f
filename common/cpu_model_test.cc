#include "common/cpu_model.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "tests/support/scoped_env.h"

namespace llmctl {
namespace {

using testing::ScopedEnv;

// MKL's count: MKL_NUM_THREADS before OMP_NUM_THREADS, as asked while MKL_DYNAMIC is false, and
// no more than the machine's cores while it may lower it (its default).
TEST(LibTorchDefaultThreadsTest, MklNumThreadsThenOmpNumThreadsAtMostTheCores) {
  {
    ScopedEnv dynamic("MKL_DYNAMIC", "FALSE");
    ScopedEnv omp("OMP_NUM_THREADS", "3");
    ScopedEnv mkl("MKL_NUM_THREADS", "5");
    EXPECT_EQ(LibTorchDefaultThreads(), 5);
    ScopedEnv no_mkl("MKL_NUM_THREADS", std::nullopt);
    EXPECT_EQ(LibTorchDefaultThreads(), 3);
  }
  ScopedEnv dynamic("MKL_DYNAMIC", std::nullopt);
  ScopedEnv mkl("MKL_NUM_THREADS", std::nullopt);
  ScopedEnv omp("OMP_NUM_THREADS", "1");
  EXPECT_EQ(LibTorchDefaultThreads(), 1);
  ScopedEnv many("OMP_NUM_THREADS", "100000");
  const int capped = LibTorchDefaultThreads();
  EXPECT_GE(capped, 1);
  if (const unsigned logical = std::thread::hardware_concurrency(); logical > 0) {
    EXPECT_LE(static_cast<unsigned>(capped), logical);
  }
}

// Without either variable (or with one that is not a positive integer), the physical cores: at
// least one, and no more than the logical processors.
TEST(LibTorchDefaultThreadsTest, TheHostsCoresWithoutAPositiveCount) {
  ScopedEnv mkl("MKL_NUM_THREADS", std::nullopt);
  for (const char* value : {"", "0", "-2", "4x", "many"}) {
    SCOPED_TRACE(std::string("OMP_NUM_THREADS=") + value);
    ScopedEnv omp("OMP_NUM_THREADS", std::string(value));
    const int threads = LibTorchDefaultThreads();
    EXPECT_GE(threads, 1);
    if (const unsigned logical = std::thread::hardware_concurrency(); logical > 0) {
      EXPECT_LE(static_cast<unsigned>(threads), logical);
    }
  }
}

}  // namespace
}  // namespace llmctl
