#include "common/cpu_model.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

namespace llmctl {
namespace {

// Sets (or, with nullopt, unsets) an environment variable for the test's scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(LibTorchDefaultThreadsTest, OmpNumThreadsThenMklNumThreads) {
  {
    ScopedEnv omp("OMP_NUM_THREADS", "3");
    ScopedEnv mkl("MKL_NUM_THREADS", "5");
    EXPECT_EQ(LibTorchDefaultThreads(), 3);
  }
  ScopedEnv omp("OMP_NUM_THREADS", std::nullopt);
  ScopedEnv mkl("MKL_NUM_THREADS", "5");
  EXPECT_EQ(LibTorchDefaultThreads(), 5);
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
