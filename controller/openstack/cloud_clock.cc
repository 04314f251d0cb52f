#include "controller/openstack/cloud_clock.h"

#include <time.h>

#include <ctime>
#include <thread>

namespace llmctl::openstack {
namespace {

class WallClock : public CloudClock {
 public:
  TimePoint Now() const override { return std::chrono::system_clock::now(); }
  std::chrono::milliseconds SinceBoot() const override {
    timespec now{};
    clock_gettime(CLOCK_BOOTTIME, &now);
    return std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec));
  }
  void SleepFor(std::chrono::milliseconds duration) override {
    std::this_thread::sleep_for(duration);
  }
};

}  // namespace

CloudClock& SystemCloudClock() {
  static WallClock clock;
  return clock;
}

StatusOr<TimePoint> ParseUtcTimestamp(std::string_view text) {
  auto bad = [&] {
    std::string message = "'";
    message.append(text).append("' is not a UTC timestamp like 2030-01-01T12:00:00Z");
    return InvalidArgumentError(std::move(message));
  };
  std::string rest(text);
  if (rest.ends_with('Z')) rest.pop_back();
  if (size_t dot = rest.find('.', 10); dot != std::string::npos) {
    if (rest.find_first_not_of("0123456789", dot + 1) != std::string::npos) return bad();
    rest.resize(dot);
  }
  if (rest.size() > 10 && (rest[10] == 'T' || rest[10] == ' ')) rest[10] = ' ';
  std::tm tm{};
  const char* end = nullptr;
  for (const char* format : {"%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"}) {
    tm = {};
    end = strptime(rest.c_str(), format, &tm);
    if (end != nullptr && *end == '\0') break;
    end = nullptr;
  }
  if (end == nullptr) return bad();
  // TimePoint counts nanoseconds in 64 bits: 1677-09-21 to 2262-04-11. strptime takes years
  // 0-9999, whose nanoseconds overflow (undefined behaviour, in practice a lease date centuries
  // off), and a date near either end overflows once a timeout or a duration is added to it.
  if (tm.tm_year + 1900 < kMinUtcYear || tm.tm_year + 1900 > kMaxUtcYear) {
    std::string message = "'";
    message.append(text).append("' is outside the years ");
    message.append(std::to_string(kMinUtcYear)).append("-").append(std::to_string(kMaxUtcYear));
    message.append(" a cloud's timestamp may name");
    return InvalidArgumentError(std::move(message));
  }
  // strptime checks each field alone (a day up to 31, a second up to 61) and timegm rolls what
  // overflows into the next month or minute: "2030-02-31" would be March 3rd. timegm writes the
  // normalized fields back, so a date that does not exist shows as a change.
  const std::tm written = tm;
  const std::time_t seconds = timegm(&tm);
  if (tm.tm_mday != written.tm_mday || tm.tm_mon != written.tm_mon ||
      tm.tm_year != written.tm_year || tm.tm_hour != written.tm_hour ||
      tm.tm_min != written.tm_min || tm.tm_sec != written.tm_sec) {
    std::string message = "'";
    message.append(text).append("' names a date or time that does not exist");
    return InvalidArgumentError(std::move(message));
  }
  return std::chrono::system_clock::from_time_t(seconds);
}

}  // namespace llmctl::openstack
