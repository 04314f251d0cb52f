// A full disk in a test without root: past RLIMIT_FSIZE a write fails with EFBIG as it fails with
// ENOSPC on a full filesystem. For tests that look at one write in their own process; a test that
// runs a whole program under the limit sets it in a forked child instead.
#ifndef LLMCTL_TESTS_SUPPORT_FILE_SIZE_LIMIT_H_
#define LLMCTL_TESTS_SUPPORT_FILE_SIZE_LIMIT_H_

#include <signal.h>
#include <sys/resource.h>

namespace llmctl::testing {

// While it lives, this process writes no file past `bytes`: the write returns EFBIG. SIGXFSZ is
// ignored meanwhile, as otherwise it would end the test instead. ok() says whether the limit holds.
class ScopedFileSizeLimit {
 public:
  explicit ScopedFileSizeLimit(rlim_t bytes) {
    if (::getrlimit(RLIMIT_FSIZE, &previous_limit_) != 0) return;
    previous_handler_ = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit limit = previous_limit_;
    limit.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
  }
  ~ScopedFileSizeLimit() {
    if (previous_handler_ == SIG_ERR) return;
    ::setrlimit(RLIMIT_FSIZE, &previous_limit_);
    ::signal(SIGXFSZ, previous_handler_);
  }
  ScopedFileSizeLimit(const ScopedFileSizeLimit&) = delete;
  ScopedFileSizeLimit& operator=(const ScopedFileSizeLimit&) = delete;

  bool ok() const { return ok_; }

 private:
  struct rlimit previous_limit_ {};
  sighandler_t previous_handler_ = SIG_ERR;
  bool ok_ = false;
};

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_SUPPORT_FILE_SIZE_LIMIT_H_
