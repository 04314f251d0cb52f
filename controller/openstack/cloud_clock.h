// Time for the cloud client: token lifetimes, lease dates, polling. A seam so tests drive time.
#ifndef LLMCTL_CONTROLLER_OPENSTACK_CLOUD_CLOCK_H_
#define LLMCTL_CONTROLLER_OPENSTACK_CLOUD_CLOCK_H_

#include <chrono>
#include <string>
#include <string_view>

#include "common/status.h"

namespace llmctl::openstack {

using TimePoint = std::chrono::system_clock::time_point;

class CloudClock {
 public:
  virtual ~CloudClock() = default;
  // The wall clock: token lifetimes and lease dates are on it, as the cloud states them.
  virtual TimePoint Now() const = 0;
  // Time since boot, suspends included (CLOCK_BOOTTIME): what a wait's timeout is measured on.
  // NTP stepping the wall clock (chrony on a node that booted with a wrong one) would cut such a
  // wait short or stretch it by the step; a laptop's suspend counts, as the cloud went on.
  virtual std::chrono::milliseconds SinceBoot() const = 0;
  // Waits `duration` (polling a lease, backing off before a retry).
  virtual void SleepFor(std::chrono::milliseconds duration) = 0;
};

// The system's clocks and a real sleep. Thread-safe.
CloudClock& SystemCloudClock();

// The years a parsed timestamp may fall in: far inside what a TimePoint holds (1677-2262), so
// that adding a timeout or a lease's duration to one cannot overflow.
inline constexpr int kMinUtcYear = 1900;
inline constexpr int kMaxUtcYear = 2199;

// UTC timestamps as OpenStack writes them: "2017-12-26T12:00:00.000000", "2015-11-07T02:58:43Z",
// "2025-08-13 14:00", "2017-12-27 10:00:00". Fractions are dropped; an offset other than Z is
// refused, and so are a date that does not exist (2030-02-31, 23:59:60) and a year outside
// kMinUtcYear-kMaxUtcYear. InvalidArgument quoting the text otherwise. What parses is exact to the
// second: FormatUtc(t, "%Y-%m-%dT%H:%M:%SZ") (common/utc_time.h) parses back to t.
StatusOr<TimePoint> ParseUtcTimestamp(std::string_view text);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_CLOUD_CLOCK_H_
