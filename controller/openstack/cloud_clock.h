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
  virtual TimePoint Now() const = 0;
  // Waits `duration` (polling a lease, backing off before a retry).
  virtual void SleepFor(std::chrono::milliseconds duration) = 0;
};

// The wall clock and a real sleep. Thread-safe.
CloudClock& SystemCloudClock();

// UTC timestamps as OpenStack writes them: "2017-12-26T12:00:00.000000", "2015-11-07T02:58:43Z",
// "2025-08-13 14:00", "2017-12-27 10:00:00". Fractions are dropped; an offset other than Z is
// refused. InvalidArgument quoting the text otherwise.
StatusOr<TimePoint> ParseUtcTimestamp(std::string_view text);

// strftime in UTC, e.g. FormatUtc(t, "%Y-%m-%d %H:%M") for Blazar's dates.
std::string FormatUtc(TimePoint time, const char* format);

}  // namespace llmctl::openstack

#endif  // LLMCTL_CONTROLLER_OPENSTACK_CLOUD_CLOCK_H_
