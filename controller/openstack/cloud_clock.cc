#include "controller/openstack/cloud_clock.h"

#include <ctime>
#include <thread>

namespace llmctl::openstack {
namespace {

class WallClock : public CloudClock {
 public:
  TimePoint Now() const override { return std::chrono::system_clock::now(); }
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
  return std::chrono::system_clock::from_time_t(timegm(&tm));
}

std::string FormatUtc(TimePoint time, const char* format) {
  std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buffer[64];
  size_t length = std::strftime(buffer, sizeof buffer, format, &tm);
  return std::string(buffer, length);
}

}  // namespace llmctl::openstack
