// An environment variable set or unset for a scope, for tests of what reads it and tests whose
// child processes must inherit it.
#ifndef LLMCTL_TESTS_SUPPORT_SCOPED_ENV_H_
#define LLMCTL_TESTS_SUPPORT_SCOPED_ENV_H_

#include <stdlib.h>

#include <optional>
#include <string>

namespace llmctl::testing {

// Sets `name` to `value` (or, with nullopt, unsets it) while it lives, then restores the test's own
// value or its absence.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_SUPPORT_SCOPED_ENV_H_
