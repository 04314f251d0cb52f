// One intra-op thread for every process a test starts, for tests that compare two runs' losses bit
// for bit.
#ifndef LLMCTL_TESTS_SUPPORT_ONE_THREAD_PER_PROCESS_H_
#define LLMCTL_TESTS_SUPPORT_ONE_THREAD_PER_PROCESS_H_

#include "tests/support/scoped_env.h"

namespace llmctl::testing {

// OMP_NUM_THREADS=1 and MKL_NUM_THREADS=1 while it lives, the test's own values (or none) after:
// the processes started meanwhile (llm-train, and the ranks its launcher starts) run each matmul on
// one thread. The test environment gives every process 2 (cmake/LlmctlTargets.cmake), and a rank
// inherits that; with 2, MKL splits the inner dimension of a product such as the loss's (512, 2048)
// @ (2048, 128) between its threads, and 1 thread against 2 changes steps 1, 4 and 7 of an 8-step
// 2-rank fsdp demo run (measured 12-05). Intel makes MKL's results reproducible only while the
// threads it takes stay fixed, which MKL_DYNAMIC (true unless set) lets it choose at each call
// (oneMKL developer guide, "Reproducibility Conditions"); one thread leaves it nothing to choose.
// MKL_NUM_THREADS too: MKL reads it before OMP_NUM_THREADS (common/cpu_model.h).
class OneThreadPerProcess {
 private:
  ScopedEnv omp_{"OMP_NUM_THREADS", "1"};
  ScopedEnv mkl_{"MKL_NUM_THREADS", "1"};
};

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_SUPPORT_ONE_THREAD_PER_PROCESS_H_
