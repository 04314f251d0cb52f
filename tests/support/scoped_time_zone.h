// TZ set for a scope, for tests whose times must read the same on any machine whatever its zone.
#ifndef LLMCTL_TESTS_SUPPORT_SCOPED_TIME_ZONE_H_
#define LLMCTL_TESTS_SUPPORT_SCOPED_TIME_ZONE_H_

#include <stdlib.h>
#include <time.h>

#include <optional>
#include <string>

namespace llmctl::testing {

// TZ set to `zone` while it lives (one that needs no tz database, such as "IST-5:30" or "UTC0"),
// the test's own TZ (or none) after.
class ScopedTimeZone {
 public:
  explicit ScopedTimeZone(const char* zone) {
    if (const char* was = ::getenv("TZ")) was_ = was;
    ::setenv("TZ", zone, 1);
    ::tzset();
  }
  ~ScopedTimeZone() {
    if (was_.has_value()) {
      ::setenv("TZ", was_->c_str(), 1);
    } else {
      ::unsetenv("TZ");
    }
    ::tzset();
  }
  ScopedTimeZone(const ScopedTimeZone&) = delete;
  ScopedTimeZone& operator=(const ScopedTimeZone&) = delete;

 private:
  std::optional<std::string> was_;
};

}  // namespace llmctl::testing

#endif  // LLMCTL_TESTS_SUPPORT_SCOPED_TIME_ZONE_H_
