// One intra-op thread for every process a test starts, for tests that compare two runs' losses bit
// for bit.
#ifndef LLMCTL_TESTS_SUPPORT_ONE_THREAD_PER_PROCESS_H_
#define LLMCTL_TESTS_SUPPORT_ONE_THREAD_PER_PROCESS_H_

#include <stdlib.h>

#include <array>
#include <optional>
#include <string>

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
 public:
  OneThreadPerProcess() {
    for (size_t i = 0; i < kVariables.size(); ++i) {
      if (const char* was = ::getenv(kVariables[i])) saved_[i] = was;
      ::setenv(kVariables[i], "1", 1);
    }
  }
  ~OneThreadPerProcess() {
    for (size_t i = 0; i < kVariables.size(); ++i) {
      if (saved_[i].has_value()) {
        ::setenv(kVariables[i], saved_[i]->c_str(), 1);
      } else {
        ::unsetenv(kVariables[i]);
      }
    }
  }
  OneThreadPerProcess(const OneThreadPerProcess&) = delete;
  OneThreadPerProcess& operator=(const OneThreadPerProcess&) = delete;

 private:
  static constexpr std::array<const char*, 2> kVariables = {"OMP_NUM_THREADS", "MKL_NUM_THREADS"};
  std::array<std::optional<std::string>, 2> saved_;
};

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_SUPPORT_ONE_THREAD_PER_PROCESS_H_
